"""`Scenario`: the one frozen object a planning question is about — the model, the training
setup, the assumption profile, the sequence length and micro-batch, the GPU option, the prices
and a calibration. Functions of the memory and time wings take a scenario plus what varies,
instead of the same ten arguments each; `at()` gives the scenario with some fields changed."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from estimator.profile import Profile
from estimator.spec import ModelSpec

if TYPE_CHECKING:
    from estimator.setup import TrainingSetup
    from estimator.time.calibration import Calibration
    from estimator.time.step import GPULike


@dataclass(frozen=True)
class Scenario:
    """spec + setup + profile, at `seq_len` x `batch` on `count` cards of `gpu` (`option` is the
    `--gpu` text it came from), priced with `prices` (USD per GPU-hour by catalog id, already
    normalised), with an optional `calibration`. `count=None` means the setup's `num_gpus`."""

    spec: ModelSpec
    setup: TrainingSetup
    profile: Profile
    seq_len: int = 1
    batch: int = 1
    gpu: GPULike | None = None
    count: int | None = None
    option: str = ""
    prices: Mapping[str, float] = field(default_factory=dict)
    calibration: Calibration | None = None

    @property
    def cards(self) -> int:
        """Cards the step runs on."""
        return self.count if self.count is not None else self.setup.num_gpus

    def at(self, **changes: Any) -> Scenario:
        """This scenario with some fields replaced (`sc.at(seq_len=8192, setup=other)`)."""
        return dataclasses.replace(self, **changes)

    def on(self, option: str) -> Scenario:
        """This scenario on a `--gpu` option (`h200`, `8xh100-80gb`), resolved in the catalog."""
        from estimator.gpu_options import resolve_gpu_option

        gpu, count = resolve_gpu_option(option, self.setup)
        return self.at(gpu=gpu, count=count, option=option)

    def require_gpu(self) -> GPULike:
        """The GPU; resolved from `option` when only the text was given."""
        if self.gpu is not None:
            return self.gpu
        return self.on(self.option).require_gpu()
