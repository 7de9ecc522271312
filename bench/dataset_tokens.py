"""Benchmark (not a test): count the tokens of a generated 100,000-row JSONL dataset.

    PYTHONPATH=. python bench/dataset_tokens.py [--rows 100000] [--messages] [--tokenizer FILE]
        [--bpe]

Writes the dataset to a temporary folder (plain texts, or chat messages with --messages), then
runs estimator.dataset_tokens.count_tokens three times in fresh subprocesses: cold (counted),
warm (answered from the length cache), and the packing of the counted lengths. Prints wall time
and the peak RSS of each (resource.getrusage ru_maxrss of the child, KiB on Linux). The default
tokenizer is the small word-level one in examples/dataset; `--bpe` trains a byte-level BPE
tokenizer (GPT-2 style pre-tokenizer, 32,000 ids, `tokenizers` BpeTrainer) on the first 10,000
generated rows, here, so that encoding runs the merges as a real LLM tokenizer does (nothing
is downloaded); or pass a real tokenizer.json.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS = (ROOT / "examples" / "dataset" / "texts.jsonl").read_text().split()
CHILD = """
import json, resource, sys, time
from pathlib import Path
from estimator.dataset_tokens import CountRequest, count_tokens
from estimator.packing import pack_lengths
args = json.loads(sys.argv[1])
t0 = time.perf_counter()
req = CountRequest(Path(args["data"]), args["tokenizer"], "text", args["messages"],
                   "from-tokenizer" if args["messages"] else None)
result = count_tokens(req, Path(args["cache"]), show_progress=False)
t1 = time.perf_counter()
rows = pack_lengths(result.lengths, 4096) if args["pack"] else []
t2 = time.perf_counter()
print(json.dumps({"samples": len(result.lengths), "tokens": sum(result.lengths),
                  "cached": result.cached, "count_s": t1 - t0, "pack_s": t2 - t1,
                  "packed_rows": len(rows),
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def write_dataset(path: Path, rows: int, messages: bool) -> None:
    rng = random.Random(100_000)
    words = [w for w in WORDS if w.isalpha()]
    with path.open("w") as f:
        for i in range(rows):
            n = int(rng.lognormvariate(5.0, 1.0)) + 1  # median ~150 words, long tail
            text = " ".join(rng.choices(words, k=n)) + " ."
            if messages:
                row = {
                    "messages": [
                        {"role": "user", "content": text[:200]},
                        {"role": "assistant", "content": text},
                    ]
                }
            else:
                row = {"id": i, "text": text}
            f.write(json.dumps(row) + "\n")


def train_bpe(data: Path, out: Path, rows: int = 10_000) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = []
    with data.open() as f:
        for _, line in zip(range(rows), f, strict=False):
            row = json.loads(line)
            texts.append(row.get("text") or json.dumps(row.get("messages")))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=32_000,
        special_tokens=["<s>", "</s>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    return out / "tokenizer.json"


def run(args: dict[str, object]) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(args)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--messages", action="store_true")
    parser.add_argument("--tokenizer", default=str(ROOT / "examples" / "dataset"))
    parser.add_argument("--bpe", action="store_true", help="train a byte-level BPE here")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data.jsonl"
        t0 = time.perf_counter()
        write_dataset(data, opts.rows, opts.messages)
        size = data.stat().st_size / 2**20
        print(f"dataset: {opts.rows:,} rows, {size:.1f} MiB ({time.perf_counter() - t0:.1f} s)")
        if opts.bpe:
            t0 = time.perf_counter()
            opts.tokenizer = str(train_bpe(data, Path(tmp) / "bpe"))
            print(f"byte-level BPE, 32,000 ids, trained here ({time.perf_counter() - t0:.1f} s)")
        base = {
            "data": str(data),
            "tokenizer": opts.tokenizer,
            "cache": f"{tmp}/cache",
            "messages": "messages" if opts.messages else None,
        }
        for label, pack in (
            ("cold (count)", False),
            ("warm (cache)", False),
            ("warm + pack", True),
        ):
            r = run({**base, "pack": pack})
            print(
                f"{label:<13} samples {r['samples']:,} tokens {r['tokens']:,} cached "
                f"{r['cached']} count {r['count_s']:.2f} s pack {r['pack_s']:.2f} s "
                f"rows {r['packed_rows']:,} peak RSS {r['peak_rss_mib']:.0f} MiB"
            )


if __name__ == "__main__":
    main()
