"""Accuracy rows for `--stack torchtitan`: the estimator's `--stack torchtitan --parallel fsdp=N`
against torchtitan's own Trainer steps (probe/torchtitan_stack.py), per rank and per component.

The referee is torchtitan 0.3.0's `Trainer` (FSDP2 `fully_shard` per block, bf16 compute over fp32
shards, fused AdamW, its CrossEntropyLoss, activation checkpointing none / full / selective)
launched with torchrun under gloo on the CPU, memory from probe.cpu_memory's c10 allocator
counter, each synchronous collective's tensors released on the calling thread
(probe/collective_settle.py; the waits are in each row's `settle`).
What stood in for a GPU run is listed in each memtest's `environment.substituted`.

Per rank and row (setup x length), with the estimator's figure for the same setup:
- peak: the rank's largest running total from the first step on; estimate `allocated`;
- weights: the rank's local parameter shards (fp32), measured from the tensors; estimate the
  `loss` phase's `weights` (the sharded parameters);
- trainable states: the local gradient shards + AdamW states; estimate `trainable_states`;
- transient: peak - weights - optimizer states (what the step adds on top of the resident
  shards: activations, logits, all-gathered parameters, gradients present at the peak,
  collective buffers); estimate `allocated` - the `loss` phase's weights and trainable states;
- activations: what the forward keeps for the backward, at the moment the model returns its
  output (a forward hook on the last step): the bytes alive then minus the resident parameter
  shards and optimizer states, the model's output (logits) and the buffers (no gradients exist
  then: zero_grad(set_to_none) ran first); estimate: the `loss` phase's checkpoints (saved
  activations, or the layer inputs under AC) + its unsharded parameters + the last norm's and
  lm_head's saved inputs (`activations.head_input_saved`). Under FullAC / SelectiveAC this is
  what AC keeps, not the recomputed layer.
Estimates are made under `estimator.memory.torchtitan.cpu_referee()`: torch.nn.RMSNorm as the
CPU build runs it (the composite; CUDA's fused kernel saves less), since the referee is a CPU.
Nothing here fits an estimator term; misses are explained in the results file.

Needs torchtitan (the `torchtitan` extra) and runs torchrun itself:

    PYTHONPATH=. /path/venv/bin/python bench/accuracy_torchtitan.py --json rows.json --out t.txt
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIG = ROOT / "tests" / "data" / "configs" / "small-llama-parallel.json"
GRID: list[dict[str, Any]] = [
    {"checkpointing": c, "precision": "mixed"} for c in ("none", "gpu", "selective")
] + [{"checkpointing": "none", "precision": "fp32"}]
RANKS = (1, 2)
SEQS = "256,1024"
PARTS = ("weights", "trainable_states", "transient", "activations")


def worker(args: argparse.Namespace) -> int:
    """One torchrun launch: every rank runs the Trainer; rank 0 writes the raw measurements."""
    from probe.torchtitan_stack import run_torchtitan

    setup = json.loads(args.setup)
    config = json.loads(Path(args.config).read_text())
    doc, raw = run_torchtitan(config, setup, args.sweep, steps=args.steps, device="cpu")
    if int(os.environ.get("RANK", "0")) == 0:
        Path(args.raw).write_text(json.dumps({"memtest": doc, "raw": raw}))
    return 0


def _launch(n: int, setup: dict[str, Any], steps: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd += ["--nproc-per-node", str(n), str(Path(__file__).resolve()), "--worker"]
        cmd += ["--setup", json.dumps(setup), "--config", str(CONFIG), "--sweep", SEQS]
        cmd += ["--steps", str(steps), "--raw", str(raw)]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
        proc = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-3000:])
        out: dict[str, Any] = json.loads(raw.read_text())
        return out


def _estimate(n: int, setup: dict[str, Any], seq: int) -> dict[str, float]:
    from estimator.architectures import spec_from_config
    from estimator.dtypes import compute_bytes
    from estimator.memory import memory_breakdown
    from estimator.memory.activations import Context, head_input_saved
    from estimator.memory.torchtitan import cpu_referee
    from estimator.profile import load_profile
    from estimator.setup import TrainingSetup

    spec = spec_from_config(json.loads(CONFIG.read_text()))
    ts = TrainingSetup(
        stack="torchtitan",
        method="full",
        precision=setup["precision"],
        checkpointing=setup["checkpointing"],
        loss="full",
        optimizer="adamw",
        parallel=f"fsdp={n}",
        num_gpus=n,
    )
    with cpu_referee():  # the referee runs torch's CPU kernels (estimator/memory/torchtitan.py)
        mem = memory_breakdown(spec, ts, [seq], 1, load_profile("default"), devices=n)
        local = ts.model_copy(update={"parallel": None, "num_gpus": 1})
        ctx = Context.build(spec, local, compute_bytes(setup["precision"]))
        head = seq * head_input_saved(ctx, spec, "full")

    def f(v: Any) -> float:
        return float(v[0]) if hasattr(v, "__len__") else float(v)

    loss = {k: f(v) for k, v in mem.phases["loss"].items()}
    allocated = f(mem.allocated)
    return {
        "peak": allocated,
        "weights": loss["weights"],
        "trainable_states": f(mem.components["trainable_states"]),
        "transient": allocated - loss["weights"] - loss["trainable_states"],
        "activations": loss["checkpoints"] + loss["unsharded_params"] + head,
        "peak_phase": max(mem.phases, key=lambda p: sum(f(v) for v in mem.phases[p].values())),
    }


def _pct(est: float, meas: float | None) -> float | None:
    return None if not meas else 100.0 * (est - meas) / meas


def _measured_activations(m: dict[str, Any]) -> int | None:
    """What the forward keeps for the backward (module docstring); None for rows measured
    before the probe recorded the bytes at the model's output."""
    r = m["resident"]
    if "at_output" not in r:
        return None
    return int(r["at_output"] - r["params"] - r["optimizer"] - r["output"] - r["buffers"])


def rows_for(n: int, setup: dict[str, Any], launched: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for m in launched["raw"]:
        est = _estimate(n, setup, m["seq_len"])
        r = m["resident"]
        measured = {
            "peak": m["peak_bytes"],
            "weights": r["params"],
            "trainable_states": r["grads"] + r["optimizer"],
            "transient": m["peak_bytes"] - r["params"] - r["optimizer"],
            "activations": _measured_activations(m),
        }
        rows.append(
            {
                "ranks": n,
                **setup,
                "seq": m["seq_len"],
                "rank": m["rank"],
                "measured": measured,
                "estimated": {k: est[k] for k in ("peak", *PARTS)},
                "estimated_peak_phase": est["peak_phase"],
                "trace": m["trace"],
                "step_seconds": m["step_seconds"],
                "settle": m.get("settle"),
                # the phase peaks of the blocks the training thread allocated, and the most bytes
                # gloo's worker threads allocated alive at once (probe/cpu_memory.py)
                "trace_marked": m.get("trace_marked"),
                "trace_other_threads": m.get("trace_other_threads"),
                "error_pct": {k: _pct(est[k], measured[k]) for k in ("peak", *PARTS)},
                "substituted": launched["memtest"]["environment"]["substituted"],
                "libraries": launched["memtest"]["environment"]["libraries"],
            }
        )
    return rows


def reestimate(stored: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stored rows with this estimator's figures (measurements unchanged)."""
    out = []
    for row in stored:
        setup = {"checkpointing": row["checkpointing"], "precision": row["precision"]}
        est = _estimate(row["ranks"], setup, row["seq"])
        measured = row["measured"]
        out.append(
            {
                **row,
                "estimated": {k: est[k] for k in ("peak", *PARTS)},
                "estimated_peak_phase": est["peak_phase"],
                "error_pct": {k: _pct(est[k], measured.get(k)) for k in ("peak", *PARTS)},
            }
        )
    return out


def report(rows: list[dict[str, Any]], wall: float) -> str:
    mib = 2**20
    head = (
        f"{'N':>2} {'rank':>4} {'ckpt':<10}{'prec':<6}{'seq':>5}{'meas MiB':>10}{'est MiB':>9}"
        f"{'peak %':>8}  {'weights/states/transient/activations err %':<43}est. peak phase"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        parts = "/".join(
            "-" if r["error_pct"][k] is None else f"{r['error_pct'][k]:+.1f}" for k in PARTS
        )
        lines.append(
            f"{r['ranks']:>2} {r['rank']:>4} {r['checkpointing']:<10}{r['precision']:<6}"
            f"{r['seq']:>5}{r['measured']['peak'] / mib:>10.2f}{r['estimated']['peak'] / mib:>9.2f}"
            f"{r['error_pct']['peak']:>+8.1f}  {parts:<43}{r['estimated_peak_phase']}"
        )
    lines.append("")
    lines.append(f"{len(rows)} rank-rows, wall {wall:.0f} s. |error| median / max, %:")
    for key in ("peak", *PARTS):
        errs = [abs(r["error_pct"][key]) for r in rows if r["error_pct"][key] is not None]
        if errs:
            lines.append(f"  {key:<17}{statistics.median(errs):7.1f} / {max(errs):7.1f}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--setup", help=argparse.SUPPRESS)
    p.add_argument("--config", default=str(CONFIG), help=argparse.SUPPRESS)
    p.add_argument("--sweep", default=SEQS, help=argparse.SUPPRESS)
    p.add_argument("--raw", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="no AC only, 1 and 2 ranks")
    p.add_argument(
        "--from-json",
        help="re-estimate the measured rows of an earlier --json file (no runs): what an "
        "estimator change does to the same measurements",
    )
    p.add_argument("--json", help="write the rows to this file")
    p.add_argument("--out", help="write the table to this file too")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    if args.from_json:
        rows = reestimate(json.loads(Path(args.from_json).read_text()))
    for setup in [] if args.from_json else GRID[:1] if args.quick else GRID:
        for n in RANKS:
            rows.extend(rows_for(n, setup, _launch(n, setup, args.steps)))
            print(f"  {n} rank(s) {setup}: done", file=sys.stderr)
    text = report(rows, time.perf_counter() - started)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
