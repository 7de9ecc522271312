"""A corpus of estimate documents for checking that a speed change changes no number: every
preset x a dozen setups (adapters, full fine-tuning, checkpointing/loss variants, stacks,
sharding and parallel layouts) x run variants (tokens, Chinchilla, dataset lengths, prices,
calibration), plus the check document and the table / markdown / CSV renderings of each.

    python bench/doc_corpus.py dump OUT.jsonl      # one line per case: {"case", "doc"|"error"}
    python bench/doc_corpus.py dump-extra OUT.jsonl   # the extra cases: {"case", "r"|"error"}
    python bench/doc_corpus.py compare A.jsonl B.jsonl

Dump from the old tree (`PYTHONPATH=<old tree>`) and from the new one, then compare: the
comparison is byte for byte (key order included) and names the first cases that differ.
Prints, asserts nothing but the exit status (1 when anything differs).

`dump-extra`: what the corpus does not reach, ~1,300 cases: one length at a time (the scalar
path: 1, 777, 4096, 131072 tokens) for every preset x setup; every catalog card on 1, 2 and 8
cards plus custom capacities in one request; the seed-000 profile (its hand rules) at one and
two lengths; the max-seq and max-batch solvers; `sweep_full`; two `trainfit estimate` runs
(table and JSON).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

SEQS = [1024, 8192, 32768]
GPUS = ["a100-40gb", "h100-80gb", "h200", "rtx-4090", "2xh100-80gb", "8xh200"]
GPUS8 = ["8xa100-80gb", "8xh100-80gb", "8xh200", "8xb200"]
SETUPS: list[tuple[str, dict[str, Any], list[dict[str, Any]] | None]] = [
    ("full", {}, None),
    ("full-8bit-bf16", {"optimizer": "adamw-8bit", "precision": "bf16", "batch": 2}, None),
    ("lora", {"method": "lora"}, None),
    (
        "lora-variants",
        {"method": "lora", "lora_rank": 64},
        [
            {"checkpointing": c, "loss": lo}
            for c in ("none", "gpu", "offload")
            for lo in ("full", "chunked")
        ],
    ),
    ("qlora", {"method": "qlora", "optimizer": "adamw-8bit"}, None),
    ("qlora-unsloth", {"method": "qlora", "stack": "unsloth"}, None),
    (
        "lora-targets-bf16",
        {
            "method": "lora",
            "lora_targets": ["q_proj", "v_proj"],
            "adapter_dtype": "bf16",
            "checkpointing": "selective",
            "stack": "torchtitan",
        },
        None,
    ),
    ("full-torchtitan", {"stack": "torchtitan", "loss": "chunked"}, None),
    ("full-fsdp8", {"sharding": "fsdp", "num_gpus": 8}, None),
    ("full-zero3-offload", {"parallel": "zero3", "offload": "optimizer"}, None),
    ("full-fsdp-tp", {"parallel": "fsdp=4,tp=2,sp", "stack": "torchtitan"}, None),
    ("lora-dp", {"method": "lora", "parallel": "dp"}, None),
    ("full-pp", {"parallel": "pp=2,fsdp=4", "stack": "torchtitan"}, None),
]
RUNS: list[tuple[str, dict[str, Any]]] = [
    ("plain", {}),
    ("tokens", {"tokens": 2e9, "prices": {"h100-80gb": 2.5, "h200": 3.1}}),
    ("chinchilla", {"target_tokens": "chinchilla", "usable_fraction": 0.85}),
    (
        "dataset",
        {
            "dataset_lengths": [300, 900, 5000, 12000, 40000] * 20,
            "epochs": 2.0,
            "overflow": "truncate",
        },
    ),
    (
        "calibrated",
        {"calibration": {"gpu": "h100-80gb", "seq_len": 8192, "tokens_per_second": 2500.0}},
    ),
    (
        "calibrated-step",
        {
            "calibration": {"gpu": "h200", "seq_len": 1024, "batch": 2, "step_seconds": 40.0},
            "tokens": 1e8,
        },
    ),
]
RENDER_RUNS = ("plain", "tokens")


def _cases() -> list[tuple[str, dict[str, Any], list[dict[str, Any]] | None]]:
    from estimator.presets import preset_ids

    out = []
    for preset in preset_ids():
        for sname, setup, variants in SETUPS:
            for rname, run in RUNS:
                if rname not in ("plain", "tokens") and sname not in (
                    "lora",
                    "full",
                    "qlora",
                    "full-fsdp8",
                    "lora-variants",
                ):
                    continue  # run variants only on the plain setups: the corpus stays ~1k
                body = {
                    "model": {"preset": preset},
                    "setup": setup,
                    "seq_lens": SEQS,
                    "gpus": GPUS8 if "parallel" in setup and sname != "lora-dp" else GPUS,
                    **run,
                }
                out.append((f"{preset}/{sname}/{rname}", body, variants))
        body = {
            "model": {"preset": preset},
            "setup": {"method": "lora"},
            "seq_lens": [4096],
            "gpus": ["h100-80gb"],
        }
        out.append((f"{preset}/one-cell", body, None))
        out.append((f"{preset}/one-cell-long", {**body, "seq_lens": [65536]}, None))
    return out


def _one(body: dict[str, Any], variants: list[dict[str, Any]] | None, rname: str) -> dict[str, Any]:
    from estimator.document import check_document, estimate_document
    from estimator.errors import EstimatorInputError
    from estimator.formats import render_csv, render_markdown, render_table
    from estimator.request import CheckRequest, EstimateRequest

    try:
        req = EstimateRequest.model_validate(body)
        doc = estimate_document(req, variants)
    except (EstimatorInputError, ValueError) as err:
        return {"error": f"{type(err).__name__}: {err}"}
    out: dict[str, Any] = {"doc": doc}
    if rname in RENDER_RUNS:
        out["table"] = render_table(doc, colour=False)
        out["markdown"] = render_markdown(doc)
        out["csv"] = render_csv(doc)
        if variants is None:
            check = {k: body[k] for k in ("model", "setup", "seq_lens")}
            try:
                out["check"] = check_document(CheckRequest.model_validate({**check, "gpu": "h200"}))
            except (EstimatorInputError, ValueError) as err:
                out["check"] = f"{type(err).__name__}: {err}"
    return out


EXTRA_SEQS = (1, 777, 4096, 131072)
EXTRA_SETUPS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("lora", {"method": "lora"}),
    ("full", {}),
    ("qlora", {"method": "qlora"}),
)
CLI_RUNS = (
    ["estimate", "--model", "llama-3.1-8b", "--gpu", "h100-80gb"],
    ["estimate", "--model", "qwen3-8b", "--gpu", "h200", "--gpu", "2xh100-80gb"]
    + ["--method", "full", "--format", "json"],
)


def _extra_cases() -> list[tuple[str, Any]]:
    """(name, a function giving the case's JSON-able result) of `dump-extra`."""
    from estimator.document import estimate_document, max_batch_document, max_seq_document
    from estimator.presets import preset_ids
    from estimator.request import EstimateRequest
    from gpu_catalog import list_gpus

    def doc(body: dict[str, Any], variants: Any = None) -> Any:
        return lambda: estimate_document(EstimateRequest.model_validate(body), variants)

    cards = [g.id for g in list_gpus()]
    every = [f"{n}x{c}" if n > 1 else c for n in (1, 2, 8) for c in cards] + ["16gib", "3x24gib"]
    out: list[tuple[str, Any]] = []
    for preset in preset_ids():
        model = {"preset": preset}
        for sname, setup, variants in SETUPS:
            gpus = GPUS8 if "parallel" in setup and sname != "lora-dp" else GPUS
            for seq in EXTRA_SEQS:
                body = {"model": model, "setup": setup, "seq_lens": [seq], "gpus": gpus}
                out.append((f"{preset}/{sname}/{seq}", doc({**body, "tokens": 1e9}, variants)))
        for sname, setup in EXTRA_SETUPS:
            body = {"model": model, "setup": setup, "seq_lens": [2048, 16384], "gpus": every}
            out.append((f"{preset}/{sname}/every-option", doc(body)))
            for gpu in ("h100-80gb", "rtx-4090"):
                ask = {"model": model, "setup": setup, "gpu": gpu, "seq_len": 4096}
                for kind, solve in (
                    ("max-seq", max_seq_document),
                    ("max-batch", max_batch_document),
                ):
                    out.append((f"{preset}/{sname}/{kind}/{gpu}", partial(_solve, solve, ask)))
        for sname, setup, variants in SETUPS[:6]:
            body = {"model": model, "setup": setup, "gpus": GPUS, "profile": "seed-000"}
            for seqs in ([1000], [16384], [1000, 16384]):
                name = f"{preset}/{sname}/seed-000/{'+'.join(map(str, seqs))}"
                out.append((name, doc({**body, "seq_lens": seqs}, variants)))
        out.append((f"{preset}/sweep_full", partial(_sweep, preset)))
    for args in CLI_RUNS:
        out.append(("cli " + " ".join(args), partial(_cli, args)))
    return out


def _solve(solve: Any, ask: dict[str, Any]) -> Any:
    from estimator.request import SolverRequest

    return solve(SolverRequest.model_validate(ask))


def _sweep(preset: str) -> list[Any]:
    from estimator.model_source import resolve_model
    from estimator.profile import load_profile
    from estimator.request import ModelInput
    from estimator.setup import TrainingSetup
    from estimator.sweep import sweep_full

    spec = resolve_model(ModelInput(preset=preset))
    gpus = ["h100-80gb", "2xh200", "8xa100-80gb", "24gib"]
    setup, profile = TrainingSetup(method="lora"), load_profile("default")
    r = sweep_full(spec, setup, [512, 4096, 65536], [1, 4], gpus, profile)
    return [r.peak.tolist(), r.step_seconds.tolist(), r.flops.tolist()]


def _cli(args: list[str]) -> list[Any]:
    run = subprocess.run([sys.executable, "-m", "trainfit", *args], capture_output=True, text=True)
    return [run.returncode, run.stdout, run.stderr[-500:]]


def dump_extra(path: str) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for name, case in _extra_cases():
            try:
                out = {"case": name, "r": case()}
            except Exception as err:  # bad input answers with its error, compared as text
                out = {"case": name, "error": f"{type(err).__name__}: {err}"}
            f.write(json.dumps(out) + "\n")
            n += 1
    print(f"{n} extra cases -> {path}")
    return 0


def dump(path: str) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for name, body, variants in _cases():
            rname = name.rsplit("/", 1)[1]
            f.write(json.dumps({"case": name, **_one(body, variants, rname)}) + "\n")
            n += 1
    print(f"{n} cases -> {path}")
    return 0


def compare(a: str, b: str) -> int:
    with open(a, encoding="utf-8") as fa, open(b, encoding="utf-8") as fb:
        la, lb = fa.read().splitlines(), fb.read().splitlines()
    differ = [json.loads(x)["case"] for x, y in zip(la, lb, strict=False) if x != y]
    errors = sum('"error"' in x[:400] for x in la)
    print(f"{len(la)} vs {len(lb)} cases ({errors} bad-input cases), {len(differ)} differ")
    for name in differ[:10]:
        print("  differs:", name)
    return 0 if not differ and len(la) == len(lb) else 1


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "dump":
        sys.exit(dump(sys.argv[2]))
    if len(sys.argv) >= 3 and sys.argv[1] == "dump-extra":
        sys.exit(dump_extra(sys.argv[2]))
    if len(sys.argv) >= 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    print(__doc__)
    sys.exit(2)
