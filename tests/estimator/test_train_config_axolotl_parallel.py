"""axolotl's N-D parallelism keys (utils/distributed.py `_get_parallel_config_kwargs`) as a
`parallel` layout: before, `tensor_parallel_size`, `context_parallel_size`, `dp_shard_size` and
`dp_replicate_size` were warnings only and the run was priced on plain FSDP over every GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator.train_config import read_file, read_train_config_text
from trainfit.cli import main

BASE = "base_model: meta-llama/Llama-3.1-8B\nsequence_len: 8192\n"
FSDP = "fsdp_version: 2\nfsdp_config:\n  reshard_after_forward: true\n"


@pytest.mark.parametrize(
    ("extra", "parallel"),
    [
        (
            FSDP + "dp_shard_size: 2\ncontext_parallel_size: 2\ntensor_parallel_size: 2\n",
            "tp=2,cp=2,fsdp=2",
        ),
        (
            FSDP + "dp_shard_size: 4\ndp_replicate_size: 2\ntensor_parallel_size: 2\n",
            "tp=2,fsdp=4,dp=2",
        ),
        (FSDP + "context_parallel_size: 8\n", "cp=8,fsdp"),  # the shard group takes the rest
        (FSDP + "sequence_parallel_degree: 4\n", "cp=4,fsdp"),  # the older name
        ("context_parallel_size: 2\n", "cp=2,dp"),  # DDP without an fsdp_config
        (FSDP, "fsdp"),
    ],
)
def test_the_sizes_become_a_layout(extra: str, parallel: str) -> None:
    mapping = read_train_config_text(BASE + extra)
    assert mapping.setup["parallel"] == parallel
    assert not [w for w in mapping.warnings if "size" in w.split(":")[0]]


def test_what_does_not_fit_the_layout_is_reported() -> None:
    mapping = read_train_config_text(BASE + "dp_shard_size: 2\nexpert_parallel_size: 2\n")
    assert {"dp_shard_size", "expert_parallel_size"} <= {i.key for i in mapping.ignored}


def test_a_deepspeed_json_keeps_the_context_parallel_ranks(tmp_path: Path) -> None:
    (tmp_path / "z3.json").write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    path = tmp_path / "alst.yml"
    path.write_text(BASE + "context_parallel_size: 8\ndeepspeed: z3.json\n")
    assert read_file(path).setup["parallel"] == "cp=8,zero3"


def test_the_layout_prices_the_run_and_a_wrong_gpu_count_names_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ndp.yml"
    path.write_text(
        BASE + FSDP + "dp_shard_size: 2\ncontext_parallel_size: 2\ntensor_parallel_size: 2\n"
    )
    args = ["estimate", "--train-config", str(path), "--format", "json"]
    capsys.readouterr()
    assert main([*args, "--gpu", "8xh100-80gb"]) == 0
    split = json.loads(capsys.readouterr().out)["rows"][0]["fit"]["8xh100-80gb"]["peak_bytes"]
    plain = tmp_path / "fsdp.yml"
    plain.write_text(BASE + FSDP)
    assert (
        main(["estimate", "--train-config", str(plain), "--format", "json", "--gpu", "8xh100-80gb"])
        == 0
    )
    whole = json.loads(capsys.readouterr().out)["rows"][0]["fit"]["8xh100-80gb"]["peak_bytes"]
    assert split < whole  # the sequence and the matmuls split over 4 ranks
    assert main([*args, "--gpu", "4xh100-80gb"]) == 2
    assert "setup.parallel" in capsys.readouterr().err
