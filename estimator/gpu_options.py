"""GPU options: the `--gpu` entries of a request (`h200`, `2xh200`, `16gib`) resolved to a
catalog card and a card count."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gpu_catalog
from estimator.errors import EstimatorInputError
from estimator.parallel import check_model
from estimator.parallel.layout import fixed_gpus
from estimator.parallel.of_setup import layout_of
from estimator.spec import ModelSpec

if TYPE_CHECKING:
    from estimator.setup import TrainingSetup


@dataclass(frozen=True)
class GpuOption:
    """A `--gpu` entry: a catalog GPU and how many cards (`2xh200`)."""

    option: str
    gpu: gpu_catalog.Card
    count: int


CUSTOM_CAPACITY = re.compile(r"^(?:(\d+)x)?(\d+(?:\.\d+)?)gib$")


def custom_gpu(text: str) -> tuple[gpu_catalog.Card, int] | None:
    """`16gib` (or `2x16gib`): a card known only by its capacity, for "what fits on a 16 GB
    card" questions; it has no rates or price, so time and cost stay unknown."""
    m = CUSTOM_CAPACITY.match(text.strip().lower())
    if not m:
        return None
    gib = float(m.group(2))
    if not 0 < gib <= 100_000:
        return None
    capacity = int(gib * 2**30)
    gpu = gpu_catalog.Card(
        id=f"{m.group(2)}gib",
        name=f"{m.group(2)} GiB card",
        vendor="generic",
        memory_marketed_gb=gib,
        capacity_bytes=capacity,
        bf16_dense_tflops=None,
        fp8_dense_tflops=None,
        fp32_tflops=None,
        mamf_bf16_tflops_measured=None,
        memory_bandwidth_bytes_per_s=None,
        interconnect=None,
        interconnect_bytes_per_s=None,
        host_link=None,
        host_link_bytes_per_s=None,
        price_usd_per_hour=None,
        price_source=None,
        tdp_w=None,
        sources={"capacity_bytes": "given on the command line"},
        notes=None,
    )
    return gpu, int(m.group(1) or 1)


_PARSED: dict[str, GpuOption] = {}  # option text -> GpuOption (frozen; the catalog is too)
MAX_PARSED = 4096


def parse_gpu_options(options: list[str]) -> list[GpuOption]:
    parsed = []
    for i, option in enumerate(options):
        known = _PARSED.get(option)
        if known is not None:
            parsed.append(known)
            continue
        if len(_PARSED) >= MAX_PARSED:
            _PARSED.clear()
        custom = custom_gpu(option)
        if custom is not None:
            parsed.append(GpuOption(option.strip().lower(), custom[0], custom[1]))
        else:
            try:
                gpu, count = gpu_catalog.parse_gpu_option(option)
            except ValueError as err:
                raise EstimatorInputError(f"gpus[{i}]", str(err)) from None
            parsed.append(GpuOption(option.strip().lower(), gpu, count))
        _PARSED[option] = parsed[-1]
    return parsed


def resolve_gpu_option(option: str, setup: TrainingSetup | None = None) -> tuple[Any, int]:
    """`h200` / `2xh200` -> (catalog GPU, cards). A one-card id with `setup.num_gpus` N means N
    cards (as `devices_for`). Bad ids -> EstimatorInputError('gpus')."""
    try:
        gpu, count = gpu_catalog.parse_gpu_option(option)
    except ValueError as exc:
        raise EstimatorInputError("gpus", str(exc)) from None
    if count == 1 and setup is not None and setup.num_gpus > 1:
        count = setup.num_gpus
    return gpu, count


def check_devices(spec: ModelSpec, setup: TrainingSetup, options: list[GpuOption]) -> None:
    """Layer splitting (device_map) over more cards than the model has layers puts no layer
    on some cards: an error naming the option, not a silent estimate. A `--parallel` layout
    must multiply to the cards and divide the model (estimator/parallel/checks.py)."""
    for i, option in enumerate(options):
        n = devices_for(option, setup)
        if setup.parallel == "auto":
            continue
        if setup.parallel:
            layout = layout_of(setup, n, option.gpu.gpus_per_node)
            if layout is not None:
                check_model(layout, spec)
            continue
        sharding = setup.sharding if setup.sharding != "none" else "device_map"
        if n > 1 and sharding == "device_map" and spec.layers and n > spec.layers:
            raise EstimatorInputError(
                f"gpus[{i}]",
                f"{n} cards split layer by layer but {spec.name} has {spec.layers} layers; "
                "use fewer cards or --sharding fsdp",
            )


def devices_for(option: GpuOption, setup: TrainingSetup) -> int:
    """`2xh200` means 2 cards; a single-card id with `num_gpus` N means N of that card; a
    single card with a layout that names its degrees (`--parallel fsdp=8,tp=2`) means that
    many cards."""
    if option.count > 1:
        return option.count
    if setup.num_gpus == 1 and setup.parallel and setup.parallel != "auto":
        return fixed_gpus(setup.parallel) or 1
    return setup.num_gpus
