"""Benchmark: the vectorised sweeps and single `estimate()` calls, each unit counted apart.
Prints figures; asserts nothing (targets live here, not in unit tests).

- memory evaluations: one memory model evaluation per (model, setup, length, micro-batch);
- verdicts: a capacity comparison per GPU on top of an evaluation (the cheap axis);
- full cells: memory + verdict + FLOPs + step time + tokens/s + USD per (length, micro-batch,
  GPU option), `estimator.sweep.sweep_full`.
Targets (issues 2 and 17): >= 1,000,000 full cells/s on one core.
"""

from __future__ import annotations

import time

import numpy as np

import gpu_catalog
from estimator.architectures import spec_from_config
from estimator.document import estimate_document
from estimator.presets import preset_config, preset_ids
from estimator.profile import load_profile
from estimator.request import EstimateRequest
from estimator.setup import TrainingSetup
from estimator.sweep import sweep, sweep_full

SETUPS = [
    TrainingSetup(method=m, checkpointing=c, loss=lo, optimizer=o)
    for m in ("full", "lora", "qlora")
    for c in ("none", "gpu", "offload")
    for lo in ("full", "chunked")
    for o in ("adamw", "adamw-8bit")
]


def main() -> None:
    profile = load_profile("default")
    specs = [spec_from_config(preset_config(p), name=p) for p in preset_ids()]
    capacities = np.array([g.capacity_bytes for g in gpu_catalog.list_gpus()], dtype=np.float64)
    seqs = np.arange(256, 256 * 1001, 256)
    batches = np.arange(1, 17)
    evaluations = verdicts = 0
    start = time.perf_counter()
    for spec in specs:
        for setup in SETUPS:
            result = sweep(spec, setup, seqs, batches, capacities, profile)
            evaluations += result.memory_evaluations
            verdicts += result.verdicts
    elapsed = time.perf_counter() - start
    print(
        f"sweep (memory): {len(specs)} models x {len(SETUPS)} setups x {seqs.size} seq x "
        f"{batches.size} batch = {evaluations:,} memory evaluations in {elapsed:.2f} s -> "
        f"{evaluations / elapsed:,.0f} evaluations/s; x {capacities.size} GPUs = "
        f"{verdicts:,} verdicts -> {verdicts / elapsed:,.0f} verdicts/s"
    )

    options = [g.id for g in gpu_catalog.list_gpus()]
    full = 0
    start = time.perf_counter()
    for spec in specs:
        for setup in SETUPS:
            full += sweep_full(spec, setup, seqs, batches, options, profile).cells
    elapsed = time.perf_counter() - start
    print(
        f"sweep_full (memory + verdict + FLOPs + time + cost): {full:,} full cells in "
        f"{elapsed:.2f} s -> {full / elapsed:,.0f} full cells/s"
    )

    req = EstimateRequest.model_validate(
        {
            "model": {"preset": "qwen3.5-27b"},
            "setup": {"method": "lora", "optimizer": "adamw-8bit", "loss": "chunked"},
            "seq_lens": [16000, 32000, 48000],
            "gpus": ["a100-80gb", "rtx-pro-6000", "h200"],
        }
    )
    n = 200
    start = time.perf_counter()
    for _ in range(n):
        estimate_document(req)
    per_call = (time.perf_counter() - start) / n
    print(
        f"estimate(): {per_call * 1e3:.2f} ms per call (3 seq x 3 GPUs), "
        f"{9 / per_call:,.0f} cells/s through the document path"
    )


if __name__ == "__main__":
    main()
