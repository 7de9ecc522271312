"""trainfit: will this training run fit on that GPU, how long will it take, what will it cost.

The front door of the product: the `trainfit` command (`trainfit.cli`) and, for notebooks,
`trainfit.estimate(...)` and `trainfit.sweep(...)` (`trainfit.notebook`). The computing library
is `estimator` (pure: no web framework, no torch); the service is `app`; the memory test is
`probe`. Names here load on first use, so `import trainfit` and `trainfit --help` stay fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainfit.notebook import Plan, estimate, sweep

__all__ = ["Plan", "__version__", "estimate", "sweep"]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trainfit")
    except PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        return _version()
    if name in ("Plan", "estimate", "sweep"):
        from trainfit import notebook

        return getattr(notebook, name)
    raise AttributeError(f"module 'trainfit' has no attribute {name!r}")
