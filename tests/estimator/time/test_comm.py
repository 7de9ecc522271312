"""Collectives costed per link: NCCL's bus factors, node crossings, the inter-node share."""

from __future__ import annotations

import pytest

import gpu_catalog
from estimator.architectures import spec_from_config
from estimator.parallel import parse_parallel, resolve
from estimator.presets import preset_config
from estimator.profile import load_profile
from estimator.scenario import Scenario
from estimator.setup import TrainingSetup
from estimator.time.comm import Collective, Links, bus_factor, collective_seconds, members_per_node
from estimator.time.step import step_time

LINKS = Links(intra=450e9, inter=50e9, gpus_per_node=8)
LLAMA70B = spec_from_config(preset_config("llama-3.1-70b"))
LLAMA8B = spec_from_config(preset_config("llama-3.1-8b"))
DEFAULT = load_profile("default")


def test_bus_factors_are_ncclss() -> None:
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_gather", 16) == pytest.approx(15 / 16)
    assert bus_factor("p2p", 2) == 1.0


def test_a_group_inside_one_node_never_touches_the_inter_node_link() -> None:
    c = Collective("x", "all_gather", 1e9, 8, 1, 1)
    seconds, inter = collective_seconds(c, LINKS)
    assert inter == 0.0 and seconds == pytest.approx(7 / 8 * 1e9 / 450e9)


def test_a_group_across_nodes_is_bound_by_its_nics() -> None:
    c = Collective("x", "all_gather", 1e9, 16, 1, 1)
    seconds, inter = collective_seconds(c, LINKS)
    # 8 members per node, one NIC each: 15/16 x S over 8 x 50 GB/s
    assert inter == pytest.approx(15 / 16 * 1e9 / (8 * 50e9))
    assert seconds == pytest.approx(max(inter, 15 / 16 * 1e9 / 450e9))


def test_groups_at_a_stride_of_a_node_have_one_member_per_node() -> None:
    assert members_per_node(2, 8, 8) == 1
    assert members_per_node(4, 2, 8) == 4
    assert members_per_node(16, 1, 8) == 8


def test_an_unknown_inter_node_rate_leaves_the_step_unknown() -> None:
    c = Collective("x", "all_reduce", 1e9, 16, 1, 1)
    seconds, _ = collective_seconds(c, Links(450e9, None, 8))
    assert seconds is None


def _step(spec, parallel: str, gpus: int, gpu: str = "h100"):
    setup = TrainingSetup(method="full", parallel=parallel, num_gpus=gpus)
    card = gpu_catalog.get_gpu(gpu)
    return step_time(Scenario(spec, setup, DEFAULT, 4096, 1, gpu=card, count=gpus))


def test_fsdp_on_two_nodes_reports_its_inter_node_share() -> None:
    one = _step(LLAMA70B, "fsdp", 8)
    two = _step(LLAMA70B, "fsdp", 16)
    assert one.comm_inter_node_seconds == 0.0
    assert two.comm_inter_node_seconds and two.comm_inter_node_seconds > 0
    assert two.tokens_per_step == 2 * one.tokens_per_step


def test_tensor_parallelism_divides_compute_and_adds_exposed_communication() -> None:
    dp = _step(LLAMA8B, "fsdp", 8)
    tp = _step(LLAMA8B, "fsdp=2,tp=4", 8)
    assert tp.compute_seconds == pytest.approx(dp.compute_seconds / 4)
    assert tp.tokens_per_step == dp.tokens_per_step / 4
    only_tp = _step(LLAMA8B, "tp=8", 8)  # no data parallelism: all of it is tp's
    assert only_tp.comm_seconds and only_tp.comm_seconds > 0


def test_a_pipeline_pays_its_bubble() -> None:
    layout = resolve(parse_parallel("pp=4"), 4)
    assert layout.pp == 4
    st = _step(LLAMA8B, "pp=4", 4)
    flops_share = st.flops.total / (st.peak_flops * st.efficiency)
    # m = pp = 4 micro-batches: bubble (p - 1) / m = 75 %
    assert st.compute_seconds == pytest.approx(flops_share * 1.75)


def test_interleaving_shrinks_the_bubble_and_multiplies_the_stage_sends() -> None:
    def step(schedule: str, virtual: int | None = None):
        setup = TrainingSetup(
            method="full",
            parallel="pp=4",
            num_gpus=4,
            grad_accum=8,
            pp_schedule=schedule,
            pp_virtual=virtual,
        )
        card = gpu_catalog.get_gpu("h100")
        return step_time(Scenario(LLAMA8B, setup, DEFAULT, 4096, 1, gpu=card, count=4))

    plain, gpipe, inter = step("1f1b"), step("gpipe"), step("interleaved-1f1b", 4)
    share = plain.flops.total / (plain.peak_flops * plain.efficiency)
    assert plain.compute_seconds == pytest.approx(share * (1 + 3 / 8))
    assert gpipe.compute_seconds == pytest.approx(plain.compute_seconds)  # same (p-1)/m
    assert inter.compute_seconds == pytest.approx(share * (1 + 3 / 32))  # (p-1)/(v m)
    assert inter.comm_transfer_seconds > plain.comm_transfer_seconds  # 4x the sends


def test_optimizer_offload_pays_the_cpu_adam_step_on_the_shared_host() -> None:
    def step(offload: str, gpus: int):
        setup = TrainingSetup(method="full", parallel="zero3", num_gpus=gpus, offload=offload)
        card = gpu_catalog.get_gpu("h100")
        return step_time(Scenario(LLAMA70B, setup, DEFAULT, 4096, 1, gpu=card, count=gpus))

    off = step("optimizer", 16)
    assert off.offload_seconds is not None and off.offload_transfer_seconds is not None
    cpu = off.offload_seconds - off.offload_transfer_seconds
    # the rank's 1/16 partition x AdamW's 30 bytes, 8 ranks on one host's 614.4 GB/s
    partition = LLAMA70B.params_total / 16
    assert cpu == pytest.approx(partition * 30 * 8 / 614.4e9, rel=1e-6)
    assert any("CPU optimizer step" in n for n in off.notes)
    # twice the ranks: half the partition each, the same ranks per host
    wide = step("optimizer", 32)
    assert wide.offload_seconds - wide.offload_transfer_seconds == pytest.approx(cpu / 2)
    none = step("none", 16)
    assert none.offload_seconds == 0.0


def test_optimizer_offload_takes_the_optimizer_traffic_off_the_hbm_floor() -> None:
    card = gpu_catalog.get_gpu("h100")

    def mem_seconds(offload: str) -> float:
        setup = TrainingSetup(method="full", parallel="zero3", num_gpus=16, offload=offload)
        st = step_time(Scenario(LLAMA70B, setup, DEFAULT, 4096, 1, gpu=card, count=16))
        assert st.memory_seconds is not None
        return st.memory_seconds

    moved = LLAMA70B.params_total * 30 / 16  # AdamW's 30 bytes/param of the rank's partition
    assert mem_seconds("none") - mem_seconds("optimizer") == pytest.approx(
        moved / card.memory_bandwidth_bytes_per_s, rel=1e-9
    )
