"""Tests for the GPU catalog data file, its schema and the lookup API."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import FrozenInstanceError, fields
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gpu_catalog import (
    GPU,
    MAX_GPU_COUNT,
    NUMERIC_FIGURES,
    Catalog,
    InvalidGPUOptionError,
    UnknownGPUError,
    get_gpu,
    list_gpus,
    load_cards,
    load_catalog,
    parse_gpu_option,
)

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = Path(__file__).parents[3] / "shared/reference/gpu_catalog.json"

REQUIRED_IDS = (
    "a100-40gb",
    "a100-80gb",
    "a100-80gb-pcie",
    "h100-80gb",
    "h100-pcie",
    "h100-nvl",
    "h200",
    "b200",
    "l40s",
    "l4",
    "a10g",
    "rtx-3060",
    "rtx-3090",
    "rtx-4090",
    "rtx-5090",
    "rtx-pro-6000",
    "rtx-6000-ada",
    "mi300x",
)

# Catalog id -> the reference file's "name" for the same SKU.
REFERENCE_NAMES = {
    "a100-40gb": "A100-SXM4-40GB",
    "a100-80gb": "A100-SXM4-80GB",
    "a100-80gb-pcie": "A100-80GB-PCIe",
    "h100-80gb": "H100-SXM5-80GB",
    "h100-pcie": "H100-PCIe-80GB",
    "h100-nvl": "H100-NVL-94GB",
    "h200": "H200-SXM-141GB",
    "b200": "B200-SXM",
    "l40s": "L40S",
    "l4": "L4",
    "a10g": "A10G (AWS)",
    "rtx-3060": "RTX 3060 12GB",
    "rtx-3090": "RTX 3090",
    "rtx-4090": "RTX 4090",
    "rtx-5090": "RTX 5090",
    "rtx-pro-6000": "RTX PRO 6000 Blackwell (96GB)",
    "rtx-6000-ada": "RTX 6000 Ada",
    "mi300x": "AMD MI300X",
}

# Figures where the catalog deliberately departs from the reference, and why.
DELIBERATE_DIFFERENCES = {
    ("b200", "fp32_tflops"): "reference 80 has no source (GB200's figure); NVIDIA HGX B200: 75",
}


def _gpu_dict(**overrides: Any) -> dict[str, Any]:
    """A minimal valid GPU record, for schema tests."""
    record: dict[str, Any] = {
        "id": "test-gpu",
        "name": "Test GPU",
        "vendor": "NVIDIA",
        "memory_marketed_gb": 80,
        "memory_reported_mib": 81920,
        "capacity_bytes": 81920 * 2**20,
        "bf16_dense_tflops": 100.0,
        "sources": {
            "memory_marketed_gb": "label",
            "memory_reported_mib": "smi",
            "capacity_bytes": "smi",
            "bf16_dense_tflops": "datasheet",
        },
    }
    record.update(overrides)
    return record


# --- the data -------------------------------------------------------------------------------


def test_every_required_id_is_present() -> None:
    ids = set(load_catalog().ids)
    assert set(REQUIRED_IDS) <= ids, sorted(set(REQUIRED_IDS) - ids)


def test_h200_capacity_is_the_driver_reported_143771_mib() -> None:
    h200 = get_gpu("h200")
    assert h200.capacity_bytes == 143771 * 2**20
    assert h200.memory_marketed_gb == 141  # the label, not the capacity


@pytest.mark.parametrize(
    ("gpu_id", "mib"), [("a100-80gb", 81920), ("rtx-pro-6000", 97887), ("h100-80gb", 81559)]
)
def test_capacity_is_reported_mib_times_2_pow_20(gpu_id: str, mib: int) -> None:
    assert get_gpu(gpu_id).capacity_bytes == mib * 2**20


def test_every_non_null_figure_has_a_source() -> None:
    for gpu in list_gpus():
        for name in NUMERIC_FIGURES:
            if getattr(gpu, name) is not None:
                assert gpu.sources.get(name, "").strip(), f"{gpu.id}.{name} has no source"
        if gpu.price_usd_per_hour is not None:
            assert gpu.price_source


def test_raw_json_figures_are_sourced_and_byte_fields_are_integers() -> None:
    raw = json.loads((Path(__file__).parents[2] / "gpu_catalog/gpus.json").read_text())
    assert raw["_about"] and raw["sources"]
    for record in raw["gpus"]:
        for name in NUMERIC_FIGURES:
            if record.get(name) is not None:
                assert name in record["sources"], f"{record['id']}.{name}"
        for name in ("capacity_bytes", "memory_bandwidth_bytes_per_s", "host_link_bytes_per_s"):
            assert record[name] is None or isinstance(record[name], int)


def test_null_figures_on_data_gpus_are_explained_in_notes() -> None:
    for gpu in list_gpus():
        nulls = [n for n in ("bf16_dense_tflops", "price_usd_per_hour") if getattr(gpu, n) is None]
        if nulls:
            assert gpu.notes, f"{gpu.id}: {nulls} are null without notes"


def test_fp8_is_null_on_ampere_cards() -> None:
    for gpu_id in ("a100-40gb", "a100-80gb", "a100-80gb-pcie", "a10g", "rtx-3060", "rtx-3090"):
        assert get_gpu(gpu_id).fp8_dense_tflops is None


def test_nvlink_per_direction_is_half_the_bidirectional_figure() -> None:
    assert get_gpu("h100-80gb").interconnect_bytes_per_s == 450e9
    assert get_gpu("a100-80gb").interconnect_bytes_per_s == 300e9
    assert get_gpu("b200").interconnect_bytes_per_s == 900e9


def test_pcie_only_cards_use_their_pcie_figure_for_gpu_to_gpu() -> None:
    for gpu_id in ("l40s", "l4", "rtx-4090", "rtx-5090", "rtx-pro-6000", "rtx-6000-ada"):
        gpu = get_gpu(gpu_id)
        assert gpu.interconnect_bytes_per_s == gpu.host_link_bytes_per_s
        assert gpu.host_link_bytes_per_s in (32e9, 64e9)


def test_aliases_resolve_to_real_ids() -> None:
    catalog = load_catalog()
    assert get_gpu("h100").id == "h100-80gb"
    assert get_gpu("a100").id == "a100-80gb"
    assert get_gpu("pro6000").id == "rtx-pro-6000"
    for alias, target in catalog.aliases.items():
        assert get_gpu(alias).id == target


# --- the API --------------------------------------------------------------------------------


def test_lookup_is_case_insensitive() -> None:
    assert get_gpu("H200") is get_gpu("h200")
    assert get_gpu(" RTX-PRO-6000 ").id == "rtx-pro-6000"


def test_unknown_id_error_lists_the_known_ids() -> None:
    with pytest.raises(UnknownGPUError) as info:
        get_gpu("h300")
    message = str(info.value)
    assert "'h300'" in message
    for gpu_id in REQUIRED_IDS:
        assert gpu_id in message
    assert isinstance(info.value, ValueError)
    assert info.value.known_ids == load_catalog().ids


@pytest.mark.parametrize(
    ("text", "gpu_id", "count"),
    [
        ("h200", "h200", 1),
        ("2xh200", "h200", 2),
        ("8xh100-80gb", "h100-80gb", 8),
        ("2 x H200", "h200", 2),
        ("4Xa100", "a100-80gb", 4),
        ("2x5090", "rtx-5090", 2),
        ("100000xl4", "l4", MAX_GPU_COUNT),
    ],
)
def test_gpu_options_parse_to_gpu_and_count(text: str, gpu_id: str, count: int) -> None:
    gpu, parsed_count = parse_gpu_option(text)
    assert (gpu.id, parsed_count) == (gpu_id, count)


@pytest.mark.parametrize("text", ["0xh200", "100001xh200", "1.5xh200", "-2xh200", "", "x"])
def test_bad_counts_and_forms_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="GPU"):
        parse_gpu_option(text)


def test_bad_count_raises_invalid_option_with_the_allowed_range() -> None:
    with pytest.raises(InvalidGPUOptionError, match="between 1 and 100000"):
        parse_gpu_option("0xh200")


@pytest.mark.parametrize("text", ["2xh300", "2x", "h200x2"])
def test_unknown_gpu_in_an_option_is_rejected(text: str) -> None:
    with pytest.raises(UnknownGPUError):
        parse_gpu_option(text)


def test_label_and_capacity_gib() -> None:
    h200 = get_gpu("h200")
    assert h200.label == "H200 141GB"
    assert math.isclose(h200.capacity_gib, 143771 / 1024)
    assert get_gpu("a100-80gb").capacity_gib == 80.0


def test_load_catalog_is_cached_and_list_gpus_is_a_copy() -> None:
    assert load_catalog() is load_catalog()
    gpus = list_gpus()
    gpus.clear()
    assert len(list_gpus()) == len(load_catalog().gpus)


def test_gpu_is_frozen() -> None:
    with pytest.raises(FrozenInstanceError):
        get_gpu("h200").capacity_bytes = 1  # type: ignore[misc]
    with pytest.raises(ValidationError):
        load_catalog().gpus[0].capacity_bytes = 1


def test_cards_hold_the_validated_catalog_values_with_their_types() -> None:
    """The plain load path (`load_cards`, what lookups read) and the pydantic schema read the
    data file alike: every field, value and type (an int in a float field becomes a float)."""
    cards, catalog = load_cards(), load_catalog()
    assert cards.ids == catalog.ids
    assert cards.aliases == catalog.aliases
    for card, gpu in zip(cards.cards, catalog.gpus, strict=True):
        plain = {f.name: getattr(card, f.name) for f in fields(card)}
        validated = gpu.model_dump()
        assert list(plain) == list(validated)  # the schema's fields, in its order
        assert plain == validated
        assert {k: type(v) for k, v in plain.items()} == {
            k: type(v) for k, v in validated.items()
        }, card.id
        assert (card.label, card.capacity_gib) == (gpu.label, gpu.capacity_gib)


def test_lookup_finds_what_the_schema_catalog_finds() -> None:
    catalog, cards = load_catalog(), load_cards()
    for key in [*catalog.ids, *catalog.aliases, " H200 ", "A100-80GB", "nope"]:
        gpu, card = catalog.find(key), cards.find(key)
        assert (None if gpu is None else gpu.id) == (None if card is None else card.id), key


def test_importing_the_catalog_builds_no_pydantic_model() -> None:
    """`import gpu_catalog` and a lookup leave pydantic unloaded (CLI start-up, issue 17)."""
    code = (
        "import sys, gpu_catalog; gpu_catalog.parse_gpu_option('2xh200'); "
        "print('pydantic' in sys.modules)"
    )
    root = Path(__file__).parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


# --- the schema -----------------------------------------------------------------------------


def test_schema_accepts_a_minimal_record() -> None:
    assert GPU.model_validate(_gpu_dict()).capacity_gib == 80.0


def test_schema_rejects_a_figure_without_a_source() -> None:
    record = _gpu_dict(fp32_tflops=19.5)
    with pytest.raises(ValidationError, match="without a source.*fp32_tflops"):
        GPU.model_validate(record)


def test_schema_rejects_a_source_for_an_unknown_figure() -> None:
    record = _gpu_dict()
    record["sources"]["fp64_tflops"] = "typo"
    with pytest.raises(ValidationError, match="unknown figures"):
        GPU.model_validate(record)


def test_schema_rejects_a_price_without_price_source() -> None:
    record = _gpu_dict(price_usd_per_hour=1.0)
    record["sources"]["price_usd_per_hour"] = "runpod"
    with pytest.raises(ValidationError, match="price_source"):
        GPU.model_validate(record)


@pytest.mark.parametrize("capacity", [0, -1])
def test_schema_rejects_non_positive_capacity(capacity: int) -> None:
    with pytest.raises(ValidationError):
        GPU.model_validate(_gpu_dict(capacity_bytes=capacity, memory_reported_mib=None))


def test_schema_rejects_capacity_that_disagrees_with_reported_mib() -> None:
    with pytest.raises(ValidationError, match="2\\^20"):
        GPU.model_validate(_gpu_dict(capacity_bytes=80 * 10**9))


@pytest.mark.parametrize(
    "field", ["bf16_dense_tflops", "memory_bandwidth_bytes_per_s", "price_usd_per_hour", "tdp_w"]
)
def test_schema_rejects_negative_rates(field: str) -> None:
    record = _gpu_dict(**{field: -1}, price_source="x")
    record["sources"][field] = "x"
    with pytest.raises(ValidationError):
        GPU.model_validate(record)


def test_catalog_rejects_duplicate_ids() -> None:
    gpu = _gpu_dict()
    with pytest.raises(ValidationError, match="duplicate GPU ids"):
        Catalog.model_validate({"gpus": [gpu, gpu]})


def test_catalog_rejects_aliases_to_unknown_ids_or_shadowing_ids() -> None:
    gpu = _gpu_dict()
    with pytest.raises(ValidationError, match="unknown GPU id"):
        Catalog.model_validate({"gpus": [gpu], "aliases": {"t": "nope"}})
    with pytest.raises(ValidationError, match="shadows"):
        Catalog.model_validate({"gpus": [gpu], "aliases": {"test-gpu": "test-gpu"}})


# --- agreement with the reference catalog ---------------------------------------------------


def _reference_figures(entry: dict[str, Any]) -> dict[str, float | None]:
    """The reference entry's figures, converted to this catalog's field names and units."""
    bw = entry.get("mem_bw_tbps")
    nvlink = entry.get("nvlink_gbps")
    prices = [p["on_demand"] for p in entry.get("prices_usd_per_gpu_hr", [])]
    return {
        "memory_marketed_gb": entry.get("memory_marketed_gb"),
        "memory_reported_mib": entry.get("memory_reported_mib"),
        "capacity_bytes": entry.get("memory_reported_bytes"),
        "bf16_dense_tflops": entry.get("bf16_dense_tflops"),
        "fp8_dense_tflops": entry.get("fp8_dense_tflops"),
        "fp32_tflops": entry.get("fp32_tflops"),
        "mamf_bf16_tflops_measured": entry.get("mamf_bf16_tflops_measured"),
        "memory_bandwidth_bytes_per_s": None if bw is None else bw * 1e12,
        "interconnect_bytes_per_s": None if nvlink is None else nvlink * 1e9 / 2,
        "price_usd_per_hour": prices[0] if prices else None,
        "tdp_w": entry.get("tdp_w"),
    }


def test_values_agree_with_the_reference_catalog_where_both_have_them() -> None:
    if not REFERENCE.is_file():
        pytest.skip(f"reference catalog not found at {REFERENCE}")
    reference = {e["name"]: e for e in json.loads(REFERENCE.read_text())["gpus"]}
    mismatches = []
    compared = 0
    for gpu_id, ref_name in REFERENCE_NAMES.items():
        gpu = get_gpu(gpu_id)
        for name, expected in _reference_figures(reference[ref_name]).items():
            actual = getattr(gpu, name)
            if expected is None or actual is None or (gpu_id, name) in DELIBERATE_DIFFERENCES:
                continue
            compared += 1
            if not math.isclose(actual, expected, rel_tol=1e-9):
                mismatches.append(f"{gpu_id}.{name}: catalog {actual} != reference {expected}")
    assert not mismatches, "\n".join(mismatches)
    assert compared > 100  # the comparison really ran


def test_deliberate_differences_from_the_reference_are_sourced() -> None:
    for gpu_id, name in DELIBERATE_DIFFERENCES:
        assert get_gpu(gpu_id).sources[name]


def test_a_cuda_total_a_little_below_the_reported_mib_names_the_card() -> None:
    """CUDA's total is below nvidia-smi's: the H200 of tests/data/memtests/ reported
    150,109,880,320 B to torch (143,156 MiB) where the catalog keeps 143,771 MiB."""
    from gpu_catalog.lookup import card_for_device

    measured = json.loads(
        (ROOT / "tests/data/memtests/memtest_h200_2026-12-04_dense-full.json").read_text()
    )["environment"]
    assert card_for_device(measured["gpu_name"], measured["total_memory_bytes"]) == "h200"
    assert card_for_device("NVIDIA H200", 143_771 * 2**20) == "h200"  # nvidia-smi's own figure
    assert card_for_device("NVIDIA H200", 143_771 * 2**20 + 1) is None  # never above it
    assert card_for_device("NVIDIA H200", int(143_771 * 0.97) * 2**20) is None  # 3 % below
    assert card_for_device("cpu", 8 * 2**30) is None


def test_cards_of_the_same_memory_are_told_apart_by_name_and_pcie() -> None:
    from gpu_catalog.lookup import card_for_device

    h100 = 81_000 * 2**20  # below both 80 GB parts' 81,559 and the A100s' 81,920 MiB
    assert card_for_device("NVIDIA H100 80GB HBM3", h100) == "h100-80gb"  # the SXM part
    assert card_for_device("NVIDIA H100 PCIe", h100) == "h100-pcie"
    assert card_for_device("NVIDIA A100-SXM4-80GB", h100) == "a100-80gb"
    assert card_for_device("NVIDIA A100 80GB PCIe", h100) == "a100-80gb-pcie"
    assert card_for_device("Some 80GB card", h100) is None  # several fit, none by name
