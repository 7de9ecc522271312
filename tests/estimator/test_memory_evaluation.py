"""The evaluation pass (`setup.eval_batch`, estimator/memory/evaluation.py): a no-grad forward
of `eval_batch` rows between steps, with the weights and the optimizer states resident.

Checked against transformers' own forward: a tiny Llama built from its config with random
weights runs `model(input_ids, labels=labels)` under `torch.no_grad()` in eval mode on the CPU,
with `use_cache=False` as TRL, axolotl and LLaMA-Factory set it, while the probe's
`StorageTracker` counts every storage the ops make (the weights adopted first): its peak is the
pass's working set, which the estimate's `evaluation` part models. A CPU trace counts the same
tensors a CUDA run allocates (probe-notes.md); it is not a GPU measurement."""

from __future__ import annotations

from typing import Any

import pytest

from estimator.architectures import spec_from_config
from estimator.memory import memory_breakdown
from estimator.presets import preset_config
from estimator.profile import load_profile
from estimator.setup import TrainingSetup

CASES = [
    # vocab, hidden, intermediate, heads, attention, method, autocast: which moment it tests
    pytest.param(32000, 256, 688, 4, "sdpa", "full", False, id="loss"),
    pytest.param(128, 512, 2048, 4, "sdpa", "full", False, id="mlp"),
    pytest.param(128, 512, 2048, 4, "eager", "full", False, id="eager-scores"),
    pytest.param(128, 512, 256, 8, "sdpa", "full", False, id="attention-rope"),
    pytest.param(128, 512, 2048, 4, "sdpa", "lora", False, id="lora-fp32-branch"),
    pytest.param(128, 512, 2048, 4, "sdpa", "lora", True, id="lora-autocast"),
    pytest.param(32000, 256, 688, 4, "sdpa", "lora", True, id="lora-loss"),
]
SEQ, ROWS = 512, 4


def traced_working_set(model: Any, ids: Any, autocast: bool) -> int:
    import torch

    from probe.tracker import StorageTracker

    context = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)
    with torch.no_grad(), context, StorageTracker() as tracker:
        tracker.adopt([*model.parameters(), *model.buffers()])
        resident = tracker.current
        tracker.reset_peak()
        out = model(input_ids=ids, labels=ids)
        del out
    return tracker.peak - resident


@pytest.mark.parametrize(
    ("vocab", "hidden", "intermediate", "heads", "attention", "method", "autocast"), CASES
)
def test_the_pass_matches_transformers_no_grad_forward(
    vocab: int,
    hidden: int,
    intermediate: int,
    heads: int,
    attention: str,
    method: str,
    autocast: bool,
) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        attn_implementation=attention,
        use_cache=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    if method == "lora":
        peft = pytest.importorskip("peft")
        model = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules="all-linear"))
    model.eval()
    ids = torch.randint(0, vocab, (ROWS, SEQ))
    measured = traced_working_set(model, ids, autocast)
    setup = TrainingSetup(
        stack="hf",
        method=method,
        lora_rank=8,
        precision="bf16",
        autocast=autocast,
        loss="full",
        attention=attention,
        checkpointing="none",
        eval_batch=ROWS,
    )
    spec = spec_from_config(config.to_dict())
    mem = memory_breakdown(spec, setup, float(SEQ), 1, load_profile("default"))
    estimated = float(mem.phases["evaluation"]["evaluation"])
    # what is not modelled: RoPE's cos / sin and other tensors of a few positions
    assert 0.98 * measured <= estimated <= 1.02 * measured, (estimated, measured)


def llama8b(**setup: Any) -> tuple[Any, Any]:
    spec = spec_from_config(preset_config("llama-3.1-8b"))
    return spec, TrainingSetup(**setup)


def test_resident_are_the_weights_and_the_states_but_the_gradients() -> None:
    """transformers' Trainer evaluates after optimizer.step() and model.zero_grad()
    (set_to_none): the gradients of the step (and of accumulation) are gone."""
    profile = load_profile("default")
    for accum in (None, 4):
        spec, setup = llama8b(eval_batch=2, grad_accum=accum)
        mem = memory_breakdown(spec, setup, 4096.0, 1, profile)
        evaluation, step = mem.phases["evaluation"], mem.phases["step"]
        assert evaluation["weights"] == step["weights"]
        states = mem.states
        assert states is not None
        grads = states.grads
        assert evaluation["trainable_states"] == pytest.approx(step["trainable_states"] - grads)


def test_it_grows_with_its_rows_and_the_length_and_not_with_the_training_batch() -> None:
    profile = load_profile("default")
    spec, setup = llama8b(method="lora", loss="full", eval_batch=4)
    seqs = [1024.0, 4096.0, 16384.0]
    one = [float(memory_breakdown(spec, setup, s, 1, profile).allocated) for s in seqs]
    assert one == sorted(one) and len(set(one)) == 3
    more_rows = setup.model_copy(update={"eval_batch": 8})
    assert float(memory_breakdown(spec, more_rows, 4096.0, 1, profile).allocated) > one[1]
    e1 = memory_breakdown(spec, setup, 4096.0, 1, profile).phases["evaluation"]
    e4 = memory_breakdown(spec, setup, 4096.0, 4, profile).phases["evaluation"]
    assert float(sum(e1.values())) == float(sum(e4.values()))


def test_without_eval_batch_nothing_changes() -> None:
    profile = load_profile("default")
    spec, setup = llama8b(method="lora", eval_batch=1)
    with_eval = memory_breakdown(spec, setup, 4096.0, 1, profile)
    without = memory_breakdown(
        spec, setup.model_copy(update={"eval_batch": None}), 4096.0, 1, profile
    )
    assert "evaluation" not in without.phases
    assert {k: v for k, v in with_eval.phases.items() if k != "evaluation"} == without.phases
    # one row of TRL's chunked loss: below the training step's peak, the peak is unchanged
    assert float(with_eval.peak) == float(without.peak)


def test_under_fsdp_each_rank_evaluates_its_rows_and_more_ranks_never_hold_more() -> None:
    profile = load_profile("default")
    previous = None
    for gpus in (2, 4, 8):
        spec, setup = llama8b(parallel="fsdp", num_gpus=gpus, loss="full", eval_batch=4)
        mem = memory_breakdown(spec, setup, 8192.0, 1, profile)
        assert "evaluation" in mem.phases
        total = float(sum(mem.phases["evaluation"].values()))
        assert previous is None or total <= previous
        previous = total


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--eval-batch", "0"], "setup.eval_batch"),
        (["--eval-batch", "x"], "--eval-batch"),
        (
            ["--eval-batch", "2", "--gpu", "8xh100-80gb", "--parallel", "fsdp=4,tp=2"],
            "eval_batch: an evaluation pass under tp=2",
        ),
        (["--eval-batch", "2", "--profile", "seed-000"], "setup.eval_batch"),
        (["--loss", "liger", "--eval-skip-logits"], "eval_skip_logits: no evaluation pass"),
        (
            ["--loss", "full", "--eval-batch", "2", "--eval-skip-logits"],
            "eval_skip_logits: only Liger's fused loss",
        ),
    ],
)
def test_bad_eval_batch_is_exit_2_naming_the_field(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainfit.cli import main

    args = ["estimate", "--model", "llama-3.1-8b", *extra]
    if "--gpu" not in extra:
        args += ["--gpu", "h100-80gb"]
    try:
        code = main(args)
    except SystemExit as exited:  # argparse's own errors
        code = exited.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_the_cli_echoes_it_and_says_where_it_sets_the_peak(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    from trainfit.cli import main

    base = ["estimate", "--model", "llama-3.1-8b", "--method", "lora", "--gpu", "h100-80gb"]
    assert main([*base, "--seq", "8192", "--loss", "full", "--eval-batch", "4"]) == 0
    text = capsys.readouterr().out
    assert "evaluation pass of 4 rows per device priced: it sets the peak at seq 8,192 (" in text
    assert "GiB allocated, the step " in text
    assert main([*base, "--eval-batch", "4", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["setup"]["eval_batch"] == 4
    assert "evaluation" in doc["rows"][0]["phases"]


def test_a_memtest_compares_with_the_training_step_even_if_it_names_an_eval_batch() -> None:
    """The probe measures training steps: a memtest's `eval_batch` (the schema takes it) does
    not add the evaluation moment to the comparison."""
    import copy
    import json
    from pathlib import Path

    from estimator.document import compare_memtest
    from memtest_schema import load_memtest

    path = sorted(
        (Path(__file__).resolve().parents[1] / "data" / "memtests").glob("memtest_*.json")
    )[0]
    doc = load_memtest(path.read_bytes())
    named = copy.deepcopy(doc)
    named["setup"]["eval_batch"] = 64
    assert json.dumps(compare_memtest(named)) == json.dumps(compare_memtest(doc))


def test_no_eval_drops_the_pass_a_training_config_runs(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config's evaluation set becomes eval_batch; `--no-eval` prices the step alone (e.g.
    to try a layout whose evaluation is not modelled)."""
    import json

    from trainfit.cli import main

    config = tmp_path / "axolotl.yml"
    config.write_text(
        "base_model: meta-llama/Llama-3.1-8B\nsequence_len: 4096\nmicro_batch_size: 1\n"
        "adapter: lora\nlora_r: 16\nlora_target_linear: true\n"
        "val_set_size: 0.05\neval_batch_size: 8\n"
    )
    base = ["estimate", "--train-config", str(config), "--gpu", "h100-80gb", "--format", "json"]
    assert main(base) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["setup"]["eval_batch"] == 8 and "evaluation" in doc["rows"][0]["phases"]
    split = ["--gpu", "8xh100-80gb", "--parallel", "fsdp=4,tp=2"]
    assert main([*base, *split]) == 2
    assert "eval_batch: an evaluation pass under tp=2" in capsys.readouterr().err
    assert main([*base, *split, "--no-eval"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["setup"]["eval_batch"] is None and "evaluation" not in doc["rows"][0]["phases"]


def test_unsloth_s_fused_loss_runs_in_evaluation_too() -> None:
    """Unsloth calls its fused loss whenever labels are given (models/llama.py:1464-1514, no
    training test), and its forward allocates the hidden states' gradient whatever the grad
    mode: the evaluation's loss is the training loss's forward bytes at its tokens, no logits."""
    from estimator.memory.logits import loss_bytes, loss_rule

    profile = load_profile("default")
    spec, setup = llama8b(stack="unsloth", method="lora", eval_batch=4)
    assert setup.loss == "unsloth"
    mem = memory_breakdown(spec, setup, 8192.0, 1, profile)
    working = float(mem.phases["evaluation"]["evaluation"])
    rule = loss_rule(setup, profile, 2)
    tokens = 4 * 8192.0
    loss = float(loss_bytes(rule, tokens, 8192.0, (128256, 4096), (2, 2)))
    assert working >= loss + tokens * 4096 * 2  # + the last hidden states
    assert working < tokens * 128256 * 2  # never the bf16 logits of the pass


def test_cut_cross_entropy_evaluates_without_logits() -> None:
    """axolotl's Cut Cross-Entropy fork runs its loss in eval mode too (`use_lce` unless
    `train_only`, which axolotl leaves False) and makes no logits: the pass holds the last
    hidden states and a few bytes per token where transformers' loss holds every logit."""
    profile = load_profile("default")
    tokens, vocab = 8 * 4096, 128_256
    parts = {}
    for loss in ("full", "cce"):
        spec, setup = llama8b(method="lora", loss=loss, eval_batch=8)
        mem = memory_breakdown(spec, setup, 4096.0, 1, profile)
        parts[loss] = float(mem.phases["evaluation"]["evaluation"])
    assert parts["full"] - parts["cce"] > tokens * vocab * 2  # at least the bf16 logits
    assert parts["cce"] < tokens * vocab * 2  # below the bf16 logits alone
    assert parts["cce"] >= tokens * (spec.hidden or 0) * 2  # the last hidden states at least


def test_trl_s_liger_evaluation_skips_the_logits() -> None:
    """TRL's SFTTrainer passes skip_logits in evaluation (trl f2cd5771 sft_trainer.py:
    1718-1732): Liger's fused forward runs under no_grad, making `grad_input` all the same, one
    chunk of logits, an fp32 loss and accuracy per token, next to the labels' padded and
    shifted copies; without it Liger's forward makes every logit (transformers' loss)."""
    from estimator.memory.evaluation import eval_loss_bytes
    from estimator.memory.logits import loss_bytes, loss_rule

    profile = load_profile("default")
    spec, fused = llama8b(method="lora", loss="liger", eval_batch=8, eval_skip_logits=True)
    _, plain = llama8b(method="lora", loss="liger", eval_batch=8)
    tokens, seq, shape, dtypes = 8 * 4096.0, 4096.0, (128_256, 4096), (2, 2)
    skipped = float(eval_loss_bytes(loss_rule(fused, profile, 2), tokens, seq, shape, dtypes))
    full = float(eval_loss_bytes(loss_rule(plain, profile, 2), tokens, seq, shape, dtypes))
    assert full - skipped > tokens * 128_256 * 2  # the bf16 logits at least
    fused_forward = float(loss_bytes(loss_rule(fused, profile, 2), tokens, seq, shape, dtypes))
    last_hidden = tokens * 4096 * 2
    chunk = 1024 * 128_256 * 2  # next_power_of_2(ceil(32,768 / ceil(128,256 / 4,096)))
    assert fused_forward >= last_hidden + chunk  # grad_input and one chunk of logits
    assert skipped == fused_forward + last_hidden + tokens * (4 + 16 + 1)
    mem = memory_breakdown(spec, fused, seq, 1, profile)
    assert fused.model_dump()["eval_skip_logits"] is True
    assert float(mem.phases["evaluation"]["evaluation"]) >= skipped
