"""trainfit-probe: run real (or fake-tensor) training steps and measure peak memory.

The package imports without torch; `run_probe` and the CLI need torch (transformers and peft
are optional). The probe imports nothing of the rest of trainfit except `memtest_schema`, so the
two folders `probe/` and `memtest_schema/` can be copied to a bare GPU box and run with
`PYTHONPATH=. python -m probe ...`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["__version__", "run_probe"]

__version__ = "0.1.0"


def run_probe(
    config: dict[str, Any],
    setup: dict[str, Any] | None,
    sweep: list[int] | str,
    steps: int = 3,
    device: str = "cpu",
    memory_cap: int | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Run the memory test; returns the `trainfit.memtest/1` document. See `probe.runner`."""
    from probe.runner import run_probe as _run

    return _run(config, setup, sweep, steps, device, memory_cap, **kwargs)
