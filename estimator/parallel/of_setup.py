"""The layout a training setup runs under on `gpus` cards."""

from __future__ import annotations

import dataclasses

from estimator.errors import EstimatorInputError
from estimator.parallel.layout import Layout, parse_parallel, parse_wrap_units, resolve
from estimator.parallel.schedule import rounds, virtual_stages
from estimator.parallel.split import micro_batches
from estimator.setup import TrainingSetup

# GPUs per node when the card is not known here (memory does not see the catalog): the 8-GPU
# HGX / DGX board; time/comm.py uses the catalog's node size.
DEFAULT_GPUS_PER_NODE = 8


def layout_of(setup: TrainingSetup, gpus: int, gpus_per_node: int | None = None) -> Layout | None:
    """The resolved `setup.parallel` layout, or None when the setup gives none (then the
    legacy `sharding` field applies)."""
    if not setup.parallel:
        return None
    if setup.parallel == "auto":
        raise EstimatorInputError(
            "setup.parallel",
            "auto searches layouts (min-gpus, recommend); estimate and check need one, "
            "e.g. fsdp or fsdp=8,tp=2",
        )
    layout = resolve(parse_parallel(setup.parallel), gpus, gpus_per_node or DEFAULT_GPUS_PER_NODE)
    wrap_layers, separate = parse_wrap_units(setup.fsdp_wrap)
    layout = dataclasses.replace(
        layout,
        wrap_layers=wrap_layers,
        separate_units=separate,
        reshard_after_forward=setup.reshard_after_forward,
        offload=setup.offload,
    )
    if layout.pp == 1:  # a schedule only matters with stages (the setup rejects it for estimate)
        return layout
    layout = dataclasses.replace(
        layout,
        schedule=setup.pp_schedule,
        virtual=virtual_stages(setup.pp_schedule, setup.pp_virtual),
    )
    m = micro_batches(layout, setup.grad_accum)
    if layout.schedule == "interleaved-1f1b" and m % rounds(m, layout.pp):
        raise EstimatorInputError(  # torch pipelining/schedules.py:2935-2941
            "setup.grad_accum",
            f"interleaved-1f1b needs the {m} micro-batches to be a multiple of the "
            f"{rounds(m, layout.pp)} rounds (max(1, micro-batches // pp))",
        )
    return layout
