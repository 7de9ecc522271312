"""Benchmark: configurations estimated per second, for a large vectorised sweep and for single
`estimate()` calls. Prints figures; asserts nothing (targets live here, not in unit tests).

Target (issue 2): at least 1,000,000 cells/s on one core for the sweep.
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
from estimator.sweep import sweep

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
    cells = 0
    start = time.perf_counter()
    for spec in specs:
        for setup in SETUPS:
            cells += sweep(spec, setup, seqs, batches, capacities, profile).cells
    elapsed = time.perf_counter() - start
    print(
        f"sweep: {len(specs)} models x {len(SETUPS)} setups x {seqs.size} seq x "
        f"{batches.size} batch x {capacities.size} GPUs = {cells:,} cells in {elapsed:.2f} s "
        f"-> {cells / elapsed:,.0f} cells/s"
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
