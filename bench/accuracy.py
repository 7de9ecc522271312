"""Accuracy benchmark: the estimator against training steps run by the user's stack.

The referee is `trainfit-probe --stack hf`: transformers' `Trainer` + peft (+ bitsandbytes for
QLoRA) with `TrainingArguments` as users write them (bf16 autocast, fused AdamW, `lora_dropout`,
`gradient_accumulation_steps`, `gradient_checkpointing`), run for real on the CPU and counted by
the storage tracker; the hf stack's chunked loss is TRL's SFTTrainer with its fused LM head
(probe/trl_stack.py, its CUDA paths substituted off CUDA). What neither has an option for
(offloaded checkpointing, a per-row chunked loss) is measured with the probe's own loop
(`--stack probe`), labelled as such. The fused head's tile has 32768 columns whatever the
vocabulary, so with these configs' 4096-token vocabularies the tracker files it as
activations while the estimator calls it the loss's logits: compare those rows' peaks.
torchtitan's Trainer (FSDP2 under torchrun, 1 and 2 ranks) has rows of its own, per rank:
bench/accuracy_torchtitan.py (needs the `torchtitan` extra).

Each row is ONE measurement. The base case of each config runs for real on the CPU and again
under fake tensors: the fake trace of the same Trainer step must agree within one 512-byte
scalar, and is reported as that agreement, not counted again. The other rows are fake traces
(the same real Trainer step, shapes only; CPU steps of bf16 models are slow), except QLoRA and
fp32 MoE experts, which fake mode cannot run and which therefore run on the CPU. The hybrid
(Gated DeltaNet) model runs in fake mode only: on the CPU transformers runs its torch fallback of
the kernel, whose memory is not the GPU kernel's.

Per row: the estimator's `default` profile for the same setup (`estimator.api.compare_memtest`),
the peak and four components, each measured as the most bytes that kind held during the step:
weights (parameters and buffers), trainable states (gradients + optimizer states + masters),
activations (everything else except logits: saved tensors, recomputation, temporaries), logits
(storages whose last dimension is the vocabulary: logits, fp32 copies, their gradients). The
estimator's activations are its `checkpoints` plus the larger of its two activation moments:
the backward's recompute (`recompute_peak`) and the loss (`estimated_logits_other`'s
activations: the part of its `logits` component that is no logits: the last norm's and the
head's saved tensors, autocast's weight copies); its logits the logit tensors' own most
(`estimated_loss_logits`, the loss's bytes without those); its peak
`peak - overhead` (no CUDA context on a CPU).

Setup fields the estimator does not have yet (issue 10: stack, autocast, lora_dropout,
grad_accum, optimizer_impl) are passed as soon as it accepts them (compare_memtest reads every
setup field the estimator knows); until then the row says "estimator cannot express X".
Nothing here fits estimator terms: this is a referee, not a calibration set.

This is CPU accuracy, not GPU accuracy: it cannot see the CUDA context, cuBLAS/NCCL workspaces,
the caching allocator's reserved-but-unused memory, or kernels that differ on CUDA (see README).

    .venv/bin/python bench/accuracy.py                 # the grid (a few minutes on 2 cores)
    .venv/bin/python bench/accuracy.py --quick         # one config, a handful of rows
    .venv/bin/python bench/accuracy.py --json rows.json --out bench/results/accuracy_hf.txt
    .venv/bin/python bench/accuracy.py --variant AMP   # only the rows whose variant says AMP
    .venv/bin/python bench/accuracy.py --config small-qwen3-moe   # only that config's rows
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from estimator.document import compare_memtest  # noqa: E402
from probe import run_probe  # noqa: E402

CONFIGS = ["small-llama", "small-qwen3", "small-qwen3-moe", "small-gpt2", "small-qwen3.5"]
# The hybrid's Gated DeltaNet: fake mode only (the probe's op models fla's kernel there).
FAKE_ONLY = {"small-qwen3.5"}
# Setups that also get a fake trace, as the fake-vs-CPU agreement check (one per config).
SEQS = [256, 1024]
PARTS = ("weights", "trainable_states", "activations", "logits", "optimizer_step")
STACK_FIELDS = ("stack", "autocast", "lora_dropout", "grad_accum", "optimizer_impl")
# the columns of TRL's fused-head tile (trl 1.16.0 trl/trainer/utils.py:1506; hf.json
# `loss_vocab_tile`)
TRL_VOCAB_TILE = 32768
# What each stack field means when the estimator cannot take it: the value it assumes today.
ESTIMATOR_ASSUMES = {
    "stack": "probe",
    "autocast": False,
    "lora_dropout": 0.0,
    "grad_accum": 1,
    "optimizer_impl": "foreach",
}

BASE: dict[str, Any] = {
    "stack": "hf",
    "method": "lora",
    "lora_rank": 8,
    "lora_dropout": 0.05,
    "checkpointing": "gpu",
    "loss": "full",
    "batch": 1,
    "grad_accum": 1,
}


@dataclass
class Case:
    """One setup on one config; `variant` names what differs from the base case."""

    config: str
    variant: str
    setup: dict[str, Any]
    devices: list[str] = field(default_factory=lambda: ["cpu"])
    seqs: list[int] = field(default_factory=lambda: list(SEQS))


def variants(config: str, quick: bool) -> Iterator[tuple[str, dict[str, Any]]]:
    """The base case and one change at a time (a full factorial would take hours).

    MoE: peft 0.21 refuses `lora_dropout != 0` on the fused expert banks it wraps with
    `lora.ParamWrapper` (all-linear reaches them), so the MoE base case has dropout 0 and the
    dropout row records peft's refusal."""
    moe = config == "small-qwen3-moe"
    base: dict[str, Any] = {"lora_dropout": 0.0} if moe else {}
    yield f"base: LoRA r8, dropout {0 if moe else 0.05}, autocast, gpu ckpt", base
    if moe:
        yield "lora_dropout 0.05", {"lora_dropout": 0.05}
    else:
        yield "lora_dropout 0", {"lora_dropout": 0.0}
    yield "batch 4", {**base, "batch": 4}
    yield "grad_accum 4", {**base, "grad_accum": 4}
    if quick:
        return
    yield "checkpointing none", {**base, "checkpointing": "none"}
    yield "no autocast (bf16 base)", {**base, "autocast": False, "precision": "bf16"}
    yield "full FT, AMP (fp32 weights)", {"method": "full", "precision": "mixed"}
    yield "full FT, bf16 weights", {"method": "full", "precision": "bf16"}
    yield "full FT, bf16, no ckpt", {"method": "full", "precision": "bf16", "checkpointing": "none"}
    yield "full FT, bf16, grad_accum 4", {"method": "full", "precision": "bf16", "grad_accum": 4}
    yield (
        "full FT, bf16, foreach AdamW",
        {
            "method": "full",
            "precision": "bf16",
            "optimizer_impl": "foreach",
        },
    )
    if config in ("small-llama", "small-qwen3"):
        yield "QLoRA NF4 + 8-bit AdamW", {"method": "qlora", "optimizer": "adamw-8bit"}
    # TRL's SFTTrainer, the hf stack's default loss (probe/trl_stack.py)
    yield "TRL SFTTrainer (fused LM head)", {**base, "loss": "chunked"}
    yield (
        "TRL SFTTrainer, full FT, AMP",
        {"method": "full", "precision": "mixed", "loss": "chunked"},
    )
    probe = {"stack": "probe", "lora_dropout": 0.0}
    yield "probe loop: chunked loss", {**probe, "loss": "chunked", "loss_chunk": 128}
    yield "probe loop: offload ckpt", {**probe, "checkpointing": "offload"}


def grid(quick: bool) -> list[Case]:
    """Devices per row: the base case runs for real on the CPU (the measurement) and under fake
    tensors (the agreement check); the other rows are fake traces of the same real Trainer
    step (to keep the grid to minutes), except what fake mode cannot run: QLoRA (bitsandbytes
    quantises real weights) and fp32 MoE experts (`_grouped_mm`'s meta kernel wants bf16), which
    run on the CPU."""
    cases = []
    for config in CONFIGS[:1] if quick else CONFIGS:
        for i, (name, change) in enumerate(variants(config, quick)):
            setup = {**BASE, **change}
            fp32_experts = (
                config == "small-qwen3-moe" and setup.get("precision", "mixed") == "mixed"
            )
            if config in FAKE_ONLY:
                devices = ["fake"]
            elif i == 0:
                devices = ["cpu", "fake"]
            elif setup["method"] == "qlora" or (fp32_experts and setup["method"] == "full"):
                devices = ["cpu"]
            else:
                devices = ["fake"]
            cases.append(Case(config, name, setup, devices))
    return cases


# --stack torchtune: torchtune 0.6.1's single-device recipes (probe/torchtune_stack.py) on the
# CPU; Llama-style configs only (its llama3_2 builders); the base case also under fake tensors
# (probe.torchtune_stack.FakeCheckpointer). The base case is what torchtune's
# llama3_2 LoRA config writes: bf16, fused AdamW, CEWithChunkedOutputLoss, lora_dropout 0, with
# activation checkpointing on. Lengths are shorter than the hf grid's: every row is a real
# CPU step in bf16.
TORCHTUNE_CONFIGS = ["small-llama"]
TORCHTUNE_SEQS = [256, 512]
TORCHTUNE_BASE: dict[str, Any] = {
    "stack": "torchtune",
    "method": "lora",
    "lora_rank": 8,
    "lora_dropout": 0.0,
    "precision": "bf16",
    "checkpointing": "gpu",
    "loss": "chunked",
    "optimizer_impl": "fused",
    "batch": 1,
    "grad_accum": 1,
}


def torchtune_variants(quick: bool) -> Iterator[tuple[str, dict[str, Any]]]:
    yield "tt base: LoRA r8, bf16, chunked CE, gpu ckpt", {}
    yield "tt lora_dropout 0.05", {"lora_dropout": 0.05}
    if quick:
        return
    yield "tt batch 4", {"batch": 4}
    yield "tt grad_accum 4", {"grad_accum": 4}
    yield "tt checkpointing none", {"checkpointing": "none"}
    yield "tt loss full (nn.CrossEntropyLoss)", {"loss": "full"}
    yield "tt QLoRA (torchao NF4) r8", {"method": "qlora"}
    yield "tt QLoRA, checkpointing none", {"method": "qlora", "checkpointing": "none"}
    yield "tt full FT bf16, fused AdamW", {"method": "full"}
    yield "tt full FT, checkpointing none", {"method": "full", "checkpointing": "none"}
    yield (
        "tt full FT bf16, optimizer_in_bwd",
        {"method": "full", "optimizer_impl": "in-backward"},
    )


def torchtune_grid(quick: bool) -> list[Case]:
    """Every row a real CPU step; the base and QLoRA cases are traced again under fake tensors
    (the agreement check, not counted as a second measurement)."""
    return [
        Case(
            config,
            name,
            {**TORCHTUNE_BASE, **change},
            ["cpu", "fake"] if i == 0 or change == {"method": "qlora"} else ["cpu"],
            list(TORCHTUNE_SEQS),
        )
        for config in TORCHTUNE_CONFIGS
        for i, (name, change) in enumerate(torchtune_variants(quick))
    ]


def _pct(est: float | None, meas: float | None) -> float | None:
    if est is None or not meas:
        return None
    return round(100.0 * (est - meas) / meas, 2)


def _estimator_fields() -> set[str]:
    from estimator.setup import TrainingSetup

    return set(TrainingSetup.model_fields)


def cannot_express(setup: dict[str, Any], known: set[str]) -> list[str]:
    """Stack fields set to something the estimator (as installed) has no field for."""
    out = []
    for key in STACK_FIELDS:
        if key not in known and setup.get(key) != ESTIMATOR_ASSUMES[key]:
            out.append(f"{key}={setup.get(key)}")
    amp = setup["method"] == "full" and setup["precision"] == "mixed" and setup["stack"] == "hf"
    if amp and "stack" not in known:
        out.append("AMP fp32 weights (estimator's mixed = bf16 weights + fp32 masters)")
    return out


def _step_transient(doc: dict[str, Any]) -> float | None:
    """The estimator's optimizer-step temporaries (`StateBytes.step_transient`) for the doc."""
    from estimator.compare import setup_from_memtest
    from estimator.memory.states import trainable_state_bytes
    from estimator.model_source import resolve_model
    from estimator.request import ModelInput

    try:
        spec = resolve_model(ModelInput(config=doc["model"]["config"]))
        return float(trainable_state_bytes(spec, setup_from_memtest(doc)).step_transient)
    except Exception:  # noqa: BLE001 - a refusal leaves the part blank
        return None


def _tile_is_no_logit(doc: dict[str, Any]) -> bool:
    """TRL's fused head (the hf stack's chunked loss) on a model whose vocabulary is not its
    tile's 32768 columns: the tracker files the tile as activations (module docstring)."""
    setup = doc["setup"]
    if setup["stack"] != "hf" or setup["loss"] != "chunked":
        return False
    return int(doc["model"]["config"].get("vocab_size") or 0) != TRL_VOCAB_TILE


def _estimate_parts(
    row: dict[str, Any], step: float | None, tile_is_no_logit: bool = False
) -> dict[str, float | None]:
    comps = row["estimated_components"]
    parts = row.get("components_vs_measured") or {}
    if not parts:
        return {k: None for k in PARTS}
    # the estimator's trainable_states component holds every state at once (gradients,
    # masters, optimizer states and the trained weights themselves); the measured kind is the
    # most gradients + optimizer states (+ masters) held at one moment, without the weights,
    # which the probe counts as weights (`params`, here = weights component + trained weights)
    trained_weights = parts["params"]["estimated"] - (comps["weights"] or 0)
    # the estimator's logits component is the loss moment's: it also holds a trained head's
    # weight gradient (a gradient: trainable states, already counted there) and tensors the
    # tracker counts as activations (the last norm's and head's saved inputs, a frozen head's
    # bf16 cast, autocast's weight copies under AMP: `estimated_logits_other`); so its
    # activations peak at the larger of its two moments (the backward's recompute, the loss)
    # and its logits are the vocab-wide tensors' own most (`estimated_loss_logits`)
    other = row.get("estimated_logits_other") or {}
    logits = row.get("estimated_loss_logits")
    if logits is None and comps["logits"] is not None:
        logits = comps["logits"] - sum(other.values())
    checkpoints = comps["checkpoints"] or 0
    loss_acts = other.get("activations", 0)
    if tile_is_no_logit and logits is not None:  # the tile, filed as activations
        loss_acts, logits = loss_acts + logits, 0.0
    return {
        "weights": parts["params"]["estimated"],
        "trainable_states": (comps["trainable_states"] or 0) - trained_weights,
        "activations": checkpoints + max(comps["recompute_peak"] or 0, loss_acts),
        "logits": logits,
        "optimizer_step": step,
    }


def run_case(case: Case, steps: int, known: set[str]) -> list[dict[str, Any]]:
    """One memtest per device; rows per length, the first device's figures as the
    measurement, the others as the agreement check."""
    config = json.loads((ROOT / "bench" / "configs" / f"{case.config}.json").read_text())
    docs = {}
    seconds = {}
    for device in case.devices:
        started = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            docs[device] = run_probe(config, case.setup, case.seqs, steps=steps, device=device)
        seconds[device] = round(time.perf_counter() - started, 2)
    first = case.devices[0]
    doc = docs[first]
    missing = cannot_express(doc["setup"], known)
    try:
        cmp_rows = compare_memtest(doc, "default")["rows"]
    except Exception as exc:  # noqa: BLE001 - an estimator refusal is a result of the row
        cmp_rows = [{"error": f"{type(exc).__name__}: {exc}"} for _ in doc["results"]]
    rows = []
    for i, res in enumerate(doc["results"]):
        cmp = cmp_rows[i]
        row: dict[str, Any] = {
            "config": case.config,
            "variant": case.variant,
            "stack": doc["setup"]["stack"],
            "device": first,
            "seq": res["seq_len"],
            "status": res["status"],
            "error": res["error"] or cmp.get("error"),
            "cannot_express": missing,
            "seconds": seconds,
        }
        if res["status"] == "ok" and "error" not in cmp:
            measured = res["component_maxima"] or {}
            estimated = _estimate_parts(cmp, _step_transient(doc), _tile_is_no_logit(doc))
            row.update(
                measured_peak=res["peak_allocated_bytes"],
                estimated_peak=cmp["estimated_peak_bytes"],
                peak_error_pct=_pct(cmp["estimated_peak_bytes"], res["peak_allocated_bytes"]),
                measured=measured,
                estimated=estimated,
                part_error_pct={k: _pct(estimated[k], measured.get(k)) for k in PARTS},
            )
        for other in case.devices[1:]:
            o = docs[other]["results"][i]
            row[f"{other}_peak"] = o["peak_allocated_bytes"]
            row[f"{other}_status"] = o["status"]
        rows.append(row)
    return rows


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1f}"


def report(rows: list[dict[str, Any]], wall: float, quick: bool) -> str:
    mib = 2**20
    lines = [
        f"{'config':<16}{'variant':<36}{'seq':>5}{'measured MiB':>13}{'est. MiB':>10}"
        f"{'peak %':>8}  {'w/states/act/logits/step err %':<36}agreement / cannot express",
        "-" * 158,
    ]
    for r in rows:
        head = f"{r['config']:<16}{r['variant'][:35]:<36}{r['seq']:>5}"
        if "measured_peak" not in r:
            lines.append(f"{head}  {r['status']}: {(r['error'] or '')[:90]}")
            continue
        parts = "/".join(_fmt(r["part_error_pct"][k]) for k in PARTS)
        notes = []
        if "fake_peak" in r and r["device"] == "cpu":
            diff = (r["fake_peak"] or 0) - r["measured_peak"]
            notes.append(f"fake {diff:+d} B")
        if r["device"] == "fake":
            notes.append("fake")
        if r["cannot_express"]:
            notes.append("cannot express: " + ", ".join(r["cannot_express"]))
        lines.append(
            f"{head}{r['measured_peak'] / mib:>13.2f}{r['estimated_peak'] / mib:>10.2f}"
            f"{r['peak_error_pct']:>+8.1f}  {parts:<36}{'; '.join(notes)}"
        )
    ok = [r for r in rows if "measured_peak" in r]
    lines.append("")
    lines.append(
        f"{len(ok)} measurements ({len(rows) - len(ok)} not comparable), one per row: CPU and "
        f"fake runs of the same setup count once. Wall time {wall:.0f} s."
        + (" QUICK GRID." if quick else "")
    )
    lines.append(summary(ok, "all rows"))
    expressible = [r for r in ok if not r["cannot_express"]]
    lines.append(summary(expressible, "rows the estimator can express"))
    lines.append("This is CPU accuracy (storage tracker, CPU kernels), not GPU accuracy.")
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]], label: str) -> str:
    out = [f"\n|error| over {len(rows)} {label} (median / max, %):"]
    if not rows:
        return out[0] + " none"
    for key in ("peak", *PARTS):
        if key == "peak":
            errs = [abs(r["peak_error_pct"]) for r in rows if r["peak_error_pct"] is not None]
        else:
            errs = [
                abs(r["part_error_pct"][key]) for r in rows if r["part_error_pct"][key] is not None
            ]
        if errs:
            out.append(
                f"  {key:<17} {statistics.median(errs):7.1f} / {max(errs):7.1f}   (n={len(errs)})"
            )
    out.append("  targets: 3 % median / 8 % max on the peak and on activations")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one config, four setups")
    parser.add_argument(
        "--stack",
        choices=("hf", "torchtune"),
        default="hf",
        help="hf: the Trainer grid (with its probe-loop rows); torchtune: torchtune's "
        "single-device recipes (needs the torchtune extra)",
    )
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps per length (>= 2)")
    parser.add_argument(
        "--variant", help="run only the rows whose variant name contains this text (a re-run)"
    )
    parser.add_argument(
        "--config", help="run only the rows of this config (e.g. small-qwen3-moe; a re-run)"
    )
    parser.add_argument("--json", help="write the rows to this file")
    parser.add_argument("--out", help="write the table to this file too")
    args = parser.parse_args()
    started = time.perf_counter()
    known = _estimator_fields()
    rows: list[dict[str, Any]] = []
    cases = torchtune_grid(args.quick) if args.stack == "torchtune" else grid(args.quick)
    if args.variant:
        cases = [case for case in cases if args.variant in case.variant]
    if args.config:
        cases = [case for case in cases if case.config == args.config]
    for case in cases:
        rows.extend(run_case(case, args.steps, known))
        print(f"  {case.config} / {case.variant}: done", file=sys.stderr)
    text = report(rows, time.perf_counter() - started, args.quick)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
