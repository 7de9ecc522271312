"""Errors raised by the GPU catalog. Both are ValueErrors: bad user input, not a bug."""

from __future__ import annotations

from collections.abc import Sequence


class GPUCatalogError(ValueError):
    """Base class for catalog lookup and option-parsing errors."""


class UnknownGPUError(GPUCatalogError):
    """A GPU id (or alias) that the catalog does not know; the message lists the known ids."""

    def __init__(self, gpu_id: str, known_ids: Sequence[str], aliases: Sequence[str] = ()) -> None:
        self.gpu_id = gpu_id
        self.known_ids = tuple(known_ids)
        self.aliases = tuple(aliases)
        message = f"unknown GPU {gpu_id!r}; known ids: {', '.join(self.known_ids)}"
        if self.aliases:
            message += f"; aliases: {', '.join(self.aliases)}"
        super().__init__(message)


class InvalidGPUOptionError(GPUCatalogError):
    """A GPU option such as ``0xh200`` or ``2x`` whose form or count is not valid."""
