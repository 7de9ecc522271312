"""The layout a training setup runs under on `gpus` cards."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from estimator.errors import EstimatorInputError
from estimator.parallel.layout import Layout, parse_parallel, parse_wrap_units, resolve
from estimator.parallel.schedule import rounds, virtual_stages
from estimator.parallel.split import micro_batches

if TYPE_CHECKING:
    from estimator.setup import TrainingSetup

# GPUs per node when the card is not known here (memory does not see the catalog): the 8-GPU
# HGX / DGX board; time/comm.py uses the catalog's node size.
DEFAULT_GPUS_PER_NODE = 8


# The legacy `sharding` values that name a layout: `--sharding fsdp|zero1|zero2|zero3` is an
# alias of `--parallel` with the same name (every card one data-parallel rank), so both run the
# exact FSDP2 / DeepSpeed model of estimator/parallel/data.py. `device_map` (layers split over
# the cards, one computing at a time) and `none` have no layout and keep their own model.
SHARDING_ALIASES = ("fsdp", "zero1", "zero2", "zero3")


def parallel_text(setup: TrainingSetup) -> str | None:
    """`setup.parallel`, else the layout the legacy `sharding` field names, else None."""
    if setup.parallel:
        return setup.parallel
    return setup.sharding if setup.sharding in SHARDING_ALIASES else None


def layout_of(setup: TrainingSetup, gpus: int, gpus_per_node: int | None = None) -> Layout | None:
    """The resolved layout of `setup.parallel` (or of a legacy `sharding` alias), or None when
    the setup gives none (then `device_map` or one card applies)."""
    text = parallel_text(setup)
    if not text:
        return None
    if text == "auto":
        raise EstimatorInputError(
            "setup.parallel",
            "auto searches layouts (min-gpus, recommend); estimate and check need one, "
            "e.g. fsdp or fsdp=8,tp=2",
        )
    layout = resolve(parse_parallel(text), gpus, gpus_per_node or DEFAULT_GPUS_PER_NODE)
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
