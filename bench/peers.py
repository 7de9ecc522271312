"""trainfit beside the memory/time estimators that are installed, on one question: Llama 3.1 8B
(the `llama-3.1-8b` preset's config.json), LoRA r=16, checkpointing on, sequence 4096, micro-batch
1, one H100 80GB. Installs nothing: each peer that is missing is named with how to get it.
Prints, asserts nothing:

    python bench/peers.py [--quick] [--before OLD_TREE]

Each line: `peer: <us per call> us CPU (<what the peer computes>)`, the best of several repeats
(as timeit) of the mean CPU time over many calls, in this process, after a warm-up call (CPU
time: a busy machine inflates it far less than wall time; on an idle core they agree). What each
computes differs, and the line says what: trainfit's figure is a whole estimate document
(memory components + FLOPs + step time + cost + verdict), vramcalc's a memory estimate,
ftuneai's a memory breakdown (and, separately, time and cost), accelerate's the model-states
sizes of a model it builds on the meta device.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

PRESET = "llama-3.1-8b"
HUB_ID = "meta-llama/Llama-3.1-8B"
SEQ = 4096

MISSING_HOW = {
    "vramcalc": "pip install vramcalc (pure Python)",
    "ftuneai": "pip install ftuneai (pure Python)",
    "accelerate": "pip install accelerate (needs torch + transformers)",
    "deepspeed": "pip install deepspeed (DeepSpeed's estimate_zero3_model_states_mem_needs)",
    "gpu_estimator": "pip install gpu-estimator (needs torch + transformers)",
    "hf_vram_calc": "pip install hf-vram-calc",
    "llm_analysis": "pip install llm-analysis",
    "kitsune": "pip install torch-kitsune (needs torch)",
}


def _best(fn: Callable[[], Any], calls: int, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(calls):
            fn()
        times.append((time.process_time() - start) / calls)
    return min(times)


def _line(name: str, seconds: float, what: str, base: float | None) -> None:
    ratio = "" if base is None else f"; trainfit document / this = {base / seconds:.3g}"
    print(f"{name}: {seconds * 1e6:,.1f} us CPU ({what}{ratio})", flush=True)


def _present(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def trainfit_figures(calls: int, repeats: int) -> float:
    from estimator.document import estimate_document
    from estimator.memory import memory_breakdown
    from estimator.model_source import resolve_model
    from estimator.profile import load_profile
    from estimator.request import EstimateRequest

    body = {
        "model": {"preset": PRESET},
        "setup": {"method": "lora", "lora_rank": 16, "checkpointing": "gpu"},
        "seq_lens": [SEQ],
        "gpus": ["h100-80gb"],
    }
    req = EstimateRequest.model_validate(body)
    doc = _best(lambda: estimate_document(req), calls, repeats)
    _line("trainfit", doc, "estimate document: memory + FLOPs + time + cost + verdict", None)
    spec, setup, profile = resolve_model(req.model), req.setup, load_profile("default")
    mem = _best(lambda: memory_breakdown(spec, setup, float(SEQ), 1, profile), calls, repeats)
    _line("trainfit_memory", mem, "memory_breakdown alone: components and peak", doc)
    return doc


def vramcalc_figure(calls: int, repeats: int, base: float) -> None:
    import vramcalc

    from estimator.presets import preset_config

    config = preset_config(PRESET)

    def run() -> Any:
        return vramcalc.estimate(
            config, mode="train", batch=1, seq_len=SEQ, lora_rank=16, grad_checkpoint=True
        )

    _line("vramcalc", _best(run, calls, repeats), "train memory estimate from config.json", base)


def ftuneai_figures(calls: int, repeats: int, base: float) -> None:
    import ftuneai

    def memory() -> Any:
        est = ftuneai.Estimator(model=HUB_ID, method="lora", batch_size=1, seq_length=SEQ)
        return est.estimate_memory()

    _line("ftuneai_memory", _best(memory, calls, repeats), "memory breakdown", base)

    def time_and_cost() -> Any:
        est = ftuneai.Estimator(model=HUB_ID, method="lora", batch_size=1, seq_length=SEQ)
        est.check_gpu_fit(["H100-80GB"])
        hours = est.estimate_time(gpu="H100-80GB").total_hours
        return est.estimate_costs(gpu="H100-80GB", training_hours=hours)

    _line(
        "ftuneai_memory_time_cost",
        _best(time_and_cost, calls, repeats),
        "memory + fit + time + cost",
        base,
    )


def accelerate_figure(calls: int, repeats: int, base: float) -> None:
    import transformers
    from accelerate import init_empty_weights
    from accelerate.utils import calculate_maximum_sizes

    from estimator.presets import preset_config

    config = transformers.AutoConfig.for_model(**preset_config(PRESET))

    def run() -> Any:
        with init_empty_weights():
            model = transformers.AutoModelForCausalLM.from_config(config)
        return calculate_maximum_sizes(model)

    _line(
        "accelerate_estimate_memory",
        _best(run, max(1, calls // 200), repeats),
        "`accelerate estimate-memory`'s path: a meta-device model, then its sizes",
        base,
    )


def _trainfit_on(tree: str, quick: bool) -> list[str]:
    """trainfit's lines of this script run on another tree (`PYTHONPATH=tree`)."""
    import subprocess

    cmd = [sys.executable, os.path.abspath(__file__), "--trainfit-only"]
    cmd += ["--quick"] if quick else []
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if line.startswith("trainfit")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="few calls (for tests)")
    parser.add_argument("--trainfit-only", action="store_true", help="trainfit's lines alone")
    parser.add_argument(
        "--before", help="another tree: its trainfit lines first, as `before: ...`, in this run"
    )
    args = parser.parse_args(argv)
    calls, repeats = (50, 1) if args.quick else (2000, 5)
    if args.before:
        for line in _trainfit_on(args.before, args.quick):
            print(f"before: {line}", flush=True)
    base = trainfit_figures(calls, repeats)
    if args.trainfit_only:
        return 0
    runners = {
        "vramcalc": vramcalc_figure,
        "ftuneai": ftuneai_figures,
        "accelerate": accelerate_figure,
    }
    for module, how in MISSING_HOW.items():
        runner = runners.get(module)
        if not _present(module):
            print(f"{module}: missing ({how})", flush=True)
        elif runner is None:
            print(f"{module}: present, not run by this script", flush=True)
        else:
            try:
                runner(calls, repeats, base)
            except Exception as err:  # a peer's own failure is reported, not raised
                print(f"{module}: failed ({type(err).__name__}: {err})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
