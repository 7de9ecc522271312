"""trainfit: will this training run fit on that GPU, how long will it take, what will it cost.

The front door of the product: the `trainfit` command (`trainfit.cli`). The computing library
is `estimator` (pure: no web framework, no torch); the service is `app`; the memory test is
`probe`.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("trainfit")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
