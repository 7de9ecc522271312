"""The estimator's activations against the Trainer step's (fake trace), per component.

A fake trace of transformers' Trainer + peft (with CUDA's dropout kernel, probe/cuda_kernels.py)
is the referee; the estimator's `checkpoints + recompute_peak` must be within 3 % of the most
bytes the activations held (saved tensors, the recomputed layer, its forward's temporaries).
Before the forward-recompute transient and autocast's LoRA weight casts were modelled
(estimator/memory/activations.py `_forward_transient`, `weight_casts`), the base case missed by
-24 % and dropout 0 by -17 %.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from estimator.document import compare_memtest  # noqa: E402
from probe import run_probe  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[2] / "bench" / "configs"
BASE = {
    "stack": "hf",
    "method": "lora",
    "lora_rank": 8,
    "lora_dropout": 0.05,
    "checkpointing": "gpu",
    "batch": 1,
}


def _activation_errors(
    setup: dict, name: str = "small-llama", lengths: list[int] | None = None
) -> list[float]:
    config = json.loads((CONFIGS / f"{name}.json").read_text())
    doc = run_probe(config, setup, lengths or [256, 512], steps=2, device="fake")
    rows = compare_memtest(doc, "default")["rows"]
    errors = []
    for res, row in zip(doc["results"], rows, strict=True):
        assert res["status"] == "ok", res["error"]
        measured = res["component_maxima"]["activations"]
        comps = row["estimated_components"]
        estimated = comps["checkpoints"] + comps["recompute_peak"]
        errors.append(100.0 * (estimated - measured) / measured)
    return errors


@pytest.mark.parametrize(
    "change, tolerance",
    [({}, 3.0), ({"lora_dropout": 0.0}, 3.0), ({"autocast": False, "precision": "bf16"}, 3.0)],
    ids=["dropout-0.05-autocast", "dropout-0", "no-autocast"],
)
def test_lora_activations_within_tolerance_of_the_trainer_step(change, tolerance):
    """Without autocast the estimate was 4.6 % under: rope's cos/sin, made once per forward
    and held by every checkpointed layer (activations.py `rope_table_bytes`), and, when the
    last layer's recompute starts, the fp32 scaled gradient of down_proj's LoRA branch besides
    the base output's bf16 one (peft's `result + lora_B(...) * scaling` then `.to(dtype)`,
    whose backward needs no saved tensor and runs before the recompute: `_forward_transient`)."""
    errors = _activation_errors({**BASE, **change})
    assert all(abs(e) <= tolerance for e in errors), errors


def test_gpt2_lora_activations_within_3_percent_of_the_trainer_step():
    errors = _activation_errors(BASE, "small-gpt2")  # the down projection is mlp.c_proj
    assert all(abs(e) <= 3.0 for e in errors), errors


@pytest.mark.parametrize(
    "name, change",
    [
        ("small-llama", {}),
        ("small-gpt2", {}),
        ("small-gpt2", {"grad_accum": 2}),
        ("small-qwen3-moe", {}),
    ],
    ids=["llama", "gpt2", "gpt2-grad-accum-2", "qwen3-moe"],
)
def test_full_fine_tuning_activations_within_3_percent_of_the_trainer_step(name, change):
    """bf16 full fine-tuning: a trained o_proj saves SDPA's output itself, the recomputed
    layer's input is its checkpoint (GPT-2's ln_1 saves it), the MLP backward holds one
    hidden-wide gradient, the MoE combine's backward three top_k x hidden tensors
    (estimator/memory/activations.py `sdpa_output_reused`, `input_reused`,
    `moe_combine_transient`); GPT-2's tied head gradient is a gradient (probe/grad_sums.py).
    Before: +4.7 % (llama), -24.1 % (gpt2), -8.1 % (moe) at 256 tokens. Rope's cos/sin are
    counted since (`rope_table_bytes`); what is left is the router's index tensors. With gradient
    accumulation GPT-2's tied head gradient waits for the embedding's through the whole
    backward once `.grad` exists (model.py `_tied_head_grad_buffer`; -27.8 % without it)."""
    setup = {**BASE, "method": "full", "precision": "bf16", **change}
    errors = _activation_errors(setup, name)
    assert all(abs(e) <= 3.0 for e in errors), errors


def test_eager_attention_activations_within_3_percent_at_long_lengths():
    """Eager attention (`--attention eager`; Gemma 2's default): the layer's most is inside
    the softmax's backward, three fp32 (batch, heads, seq, seq) tensors alive where the saved
    set holds an fp32 and a bf16 one (activations.py `eager_softmax_moment`). Before that
    moment was modelled the checkpointed LoRA step was -7 % / -27 % / -37 % under at its peak
    at 1024 / 2048 / 4096 tokens (small-llama, fake trace)."""
    errors = _activation_errors({**BASE, "attention": "eager"}, lengths=[1024, 2048])
    assert all(abs(e) <= 3.0 for e in errors), errors


@pytest.mark.parametrize(
    "name, change, tolerance",
    [
        ("small-gemma2", {}, 3.0),
        ("small-gemma2", {"lora_dropout": 0.0}, 3.0),
        ("small-gemma2", {"method": "full", "precision": "bf16"}, 3.0),
        ("small-gemma", {}, 3.0),
        ("small-gemma", {"method": "full", "precision": "bf16"}, 3.0),
    ],
    ids=["gemma2-lora", "gemma2-lora-dropout-0", "gemma2-full", "gemma-lora", "gemma-full"],
)
def test_gemma_activations_within_tolerance_of_the_trainer_step(name, change, tolerance):
    """Gemma 2 runs eager attention under the Trainer (no SDPA path; the probe runs what
    transformers picks) with tanh softcapping of the scores, whose output tanh saves
    (`_attention_core`), and its RMSNorm's `output * (1.0 + weight.float())` saves the fp32
    normalised tensor when the weight trains (`FP32_PRODUCT_NORMS`); its layer ends in a norm
    whose backward runs first (`trailing_norm_transient`). Before: -4.2 % / -7.9 % (LoRA,
    dropout 0.05 / 0), -16.9 % (full) at 256 tokens. Gemma 1: Llama's shapes with GeGLU, tied
    embeddings and the same norm."""
    errors = _activation_errors({**BASE, **change}, name)
    assert all(abs(e) <= tolerance for e in errors), errors


@pytest.mark.parametrize(
    "name, change, tolerance",
    [
        ("small-gemma3", {}, 3.0),
        ("small-gemma3", {"autocast": False, "precision": "bf16"}, 3.0),
        ("small-mistral-sliding", {}, 1.5),
        ("small-mistral-sliding", {"method": "full", "precision": "bf16"}, 1.5),
        ("small-ministral", {}, 1.5),
        ("small-ministral", {"method": "full", "precision": "bf16"}, 1.5),
    ],
    ids=[
        "gemma3-lora",
        "gemma3-no-autocast",
        "mistral-sliding-lora",
        "mistral-sliding-full",
        "ministral-mixed-layers-lora",
        "ministral-mixed-layers-full",
    ],
)
def test_sliding_window_masks_within_tolerance_of_the_trainer_step(name, change, tolerance):
    """A sliding window as long as the sequence or shorter makes transformers build a boolean
    (1, 1, s, s) mask (masking_utils.py:286 `kv_length >= local_attention_size`; the estimate
    had `>`), and SDPA saves its own additive copy of it in every layer that gets it
    (`sdpa_mask_copies`). Before, at 256 / 512 tokens (window 128 and 256): Gemma 3 LoRA
    -0.9 / -2.5 %, without autocast -3.9 / -5.2 %; Mistral LoRA -4.7 / -5.6 %, full -7.6 /
    -8.6 %. A masked grouped-query SDPA call also gets K and V repeated to the query heads
    (model.py `_masked_repeat_kv`): Mistral full -3.1 -> -0.1 %, Ministral -3.0 -> -0.1 %."""
    errors = _activation_errors({**BASE, **change}, name)
    assert all(abs(e) <= tolerance for e in errors), errors


@pytest.mark.parametrize(
    "name, change, before",
    [
        ("small-olmo2", {"method": "full", "precision": "bf16"}, -13.4),
        ("small-glm4", {"method": "full", "precision": "bf16"}, -11.5),
        ("small-phi3", {}, -3.2),
        ("small-phi3", {"method": "full", "precision": "bf16"}, -7.5),
    ],
    ids=["olmo2-full", "glm4-full", "phi3-lora", "phi3-full"],
)
def test_post_norm_and_fused_qkv_layers_within_3_5_percent(name, change, before):
    """A layer that ends in a norm of the MLP's output (OLMo 2's post-feedforward norm, the
    four-norm GLM-4) starts its backward in that norm with every saved tensor alive: the
    incoming gradient and five fp32 hidden-wide temporaries (`trailing_norm_transient`);
    OLMo 2's norm multiplies in fp32 (`FP32_PRODUCT_NORMS`). Phi-3's fused qkv_proj: the v
    SDPA saves is a slice of the whole fused output, which it keeps alive. `before`: the error
    at 256 tokens (dropout 0 for the LoRA case) before these terms."""
    errors = _activation_errors({**BASE, "lora_dropout": 0.0, **change}, name)
    assert all(abs(e) <= 3.5 for e in errors), (before, errors)


def test_gpt_oss_sinks_softmax_backward_within_3_percent_at_2048_tokens():
    """gpt-oss's eager attention with sinks: its bf16 softmax's backward holds the saved
    probabilities, the gradient padded back to the sink column and its own output
    (`eager_softmax_moment`); the peak was -5.6 % at 2048 tokens (LoRA, checkpointed)."""
    config = json.loads((CONFIGS / "small-gpt-oss.json").read_text())
    setup = {**BASE, "lora_dropout": 0.0}
    doc = run_probe(config, setup, [2048], steps=2, device="fake")
    row = compare_memtest(doc, "default")["rows"][0]
    assert doc["results"][0]["status"] == "ok", doc["results"][0]["error"]
    assert abs(row["error_pct"]) <= 3.0, row["error_pct"]


@pytest.mark.parametrize(
    "name, targets, tolerance",
    [
        ("small-llama", ["q_proj", "v_proj"], 3.0),
        ("small-llama", ["q_proj", "k_proj", "v_proj", "o_proj"], 3.0),
        ("small-mixtral", ["q_proj", "k_proj", "v_proj", "o_proj"], 4.0),
    ],
    ids=["llama-peft-default", "llama-attention", "mixtral-attention"],
)
def test_attention_only_lora_within_tolerance_of_the_trainer_step(name, targets, tolerance):
    """LoRA on the attention only (peft's default q_proj, v_proj, as TRL passes it without
    target modules): the frozen down projection (Mixtral: the frozen expert banks) saves no
    input, so its SwiGLU backward holds three MLP-wide gradients at once, not two
    (activations.py `_mlp_backward_tensors`). Before: small-llama -5.1 % (q, v) and -4.6 %,
    Mixtral -7.3 % at 256 tokens."""
    errors = _activation_errors({**BASE, "lora_targets": targets}, name)
    assert all(abs(e) <= tolerance for e in errors), errors


def test_the_optimizer_step_temporaries_are_not_counted_as_activations():
    config = json.loads((CONFIGS / "small-llama.json").read_text())
    setup = {**BASE, "method": "full", "precision": "bf16", "optimizer_impl": "foreach"}
    doc = run_probe(config, setup, [256], steps=2, device="fake")
    maxima = doc["results"][0]["component_maxima"]
    # foreach AdamW's step makes temporaries the size of the states (torch/optim/adamw.py)
    assert maxima["optimizer_step"] >= maxima["trainable_states"] // 4


def test_amp_full_fine_tuning_recompute_within_tolerance_at_1024_tokens():
    """AMP full fine-tuning (fp32 weights, autocast): the last layer's recompute was 13.4 %
    under at 1024 tokens (-2,798,080 B), 2,621,440 B of it two omissions: autocast casts the
    fp32 norm output once per Linear that reads it (q, k, v; gate, up: `cached_cast` caches
    weights only), and the trained norm weight's mul saves the normalised tensor in fp32
    (activations.py `amp_input_casts`, `rms_norm_saved(stream=True)`)."""
    config = json.loads((CONFIGS / "small-llama.json").read_text())
    setup = {
        "stack": "hf",
        "method": "full",
        "precision": "mixed",
        "checkpointing": "gpu",
        "batch": 1,
    }
    doc = run_probe(config, setup, [1024], steps=2, device="fake")
    res, row = doc["results"][0], compare_memtest(doc, "default")["rows"][0]
    assert res["status"] == "ok", res["error"]
    comps = row["estimated_components"]
    other = (row.get("estimated_logits_other") or {}).get("activations", 0)
    estimated = comps["checkpoints"] + max(comps["recompute_peak"], other)
    measured = res["component_maxima"]["activations"]
    assert abs(100.0 * (estimated - measured) / measured) < 3.0, (estimated, measured)


def test_amp_full_fine_tuning_moe_activations_within_3_percent_at_1024_tokens():
    """AMP full fine-tuning of the MoE (fp32 weights, autocast; a CPU step: `_grouped_mm`'s
    meta kernel wants bf16): the activations were 22.7 % under at 1024 tokens. transformers'
    grouped_mm experts cast their input to the fp32 banks' dtype and `_grouped_mm` is on no
    autocast list, so the gathered tokens, gate_up output, silu, product, down output and the
    combine's backward temporaries are fp32 (activations.py `expert_bytes`), the banks get no
    bf16 copies (`autocast_layer_casts`), and the layer's incoming gradient is fp32."""
    config = json.loads((CONFIGS / "small-qwen3-moe.json").read_text())
    setup = {
        "stack": "hf",
        "method": "full",
        "precision": "mixed",
        "checkpointing": "gpu",
        "batch": 1,
    }
    doc = run_probe(config, setup, [1024], steps=2, device="cpu")
    res, row = doc["results"][0], compare_memtest(doc, "default")["rows"][0]
    assert res["status"] == "ok", res["error"]
    comps = row["estimated_components"]
    other = (row.get("estimated_logits_other") or {}).get("activations", 0)
    estimated = comps["checkpoints"] + max(comps["recompute_peak"], other)
    measured = res["component_maxima"]["activations"]
    assert abs(100.0 * (estimated - measured) / measured) < 3.0, (estimated, measured)


MLA_TARGETS = ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]
ATTENTION_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


NO_AUTOCAST = {"autocast": False, "precision": "bf16", "lora_dropout": 0.0}


@pytest.mark.parametrize(
    "name, change, low, high",
    [
        ("small-glm4-moe", {"lora_targets": ATTENTION_TARGETS}, -2.0, 2.0),
        ("small-glm4-moe", {"lora_targets": ATTENTION_TARGETS, "lora_dropout": 0.0}, -2.0, 2.0),
        ("small-glm4-moe", {"lora_targets": ATTENTION_TARGETS, **NO_AUTOCAST}, -2.0, 2.0),
        # the fake kernel's copy of SDPA's output (docstring): -3.2 points of this trace
        ("small-glm4-moe", {"method": "full", "precision": "bf16"}, -4.5, 0.0),
        ("small-glm4-moe-lite", {"lora_targets": MLA_TARGETS}, -2.0, 2.0),
        ("small-glm4-moe-lite", {"lora_targets": MLA_TARGETS, **NO_AUTOCAST}, -2.0, 2.0),
        ("small-glm4-moe-lite", {"method": "full", "precision": "bf16"}, -2.0, 2.0),
        ("small-qwen3-moe", {"lora_targets": ATTENTION_TARGETS}, -2.0, 2.0),
        ("small-qwen3-moe", {"lora_targets": ATTENTION_TARGETS, **NO_AUTOCAST}, -2.0, 2.0),
    ],
    ids=[
        "glm45-attention-lora",
        "glm45-attention-lora-dropout-0",
        "glm45-attention-lora-no-autocast",
        "glm45-full",
        "glm47-flash-attention-lora",
        "glm47-flash-attention-lora-no-autocast",
        "glm47-flash-full",
        "qwen3-moe-attention-lora",
        "qwen3-moe-attention-lora-no-autocast",
    ],
)
def test_moe_activations_against_the_trainer_step(name, change, low, high):
    """GLM-4.5 (`glm4_moe`: GQA with partial rotary, DeepSeek-V3's MoE block), GLM-4.7-Flash
    (`glm4_moe_lite`: DeepSeek-V3's layers) and Qwen3-MoE with frozen experts. Their most is
    in the MoE block's recomputed forward, where `proj_out * routing weights` and its gather
    back to token order coexist, fp32 without autocast where the router's weights are fp32
    (activations.py `moe_forward_moment`). Before that moment was modelled: GLM-4.5
    attention-only LoRA without autocast -10.6 %, Qwen3-MoE -6.5 % without autocast and
    -7.0 % with it; now -1.3 %, -3.7 %, -4.0 % at 256 tokens. The attention-only LoRA of
    axolotl's GLM-4.5-Air example (examples/glm45/glm-45-air-qlora.yaml) is +2.9 / +3.0 % at
    256 / 512 tokens. Full fine-tuning of the sigmoid-routed models was over, +6.4 % and
    +8.3 %: their blocks add the shared experts last, so those are not yet made at the
    forward's routing product and already freed at the routed experts' backward, whose moments
    hold the shared experts' input gradient instead; their routers run in bf16 under autocast;
    the combine's backward takes the routing product's dtype; the forward moment holds the
    gathered tokens, not a fourth hidden-wide tensor (activations.py `_late_shared_moments`,
    `routing_product_bytes`, `moe_forward_moment`; activations_deepseek.py `router_bytes`). Now
    all within 1 % at 256 tokens but GLM-4.5's full fine-tuning, -3.3 %: the fake device's
    kernel for CPU flash attention allocates its output like the query (torch 2.13.0
    _meta_registrations.py meta__scaled_dot_product_flash_attention_for_cpu, `empty_like(query)`),
    a contiguous (b, h, s, d) tensor after partial rotary's torch.cat, so transformers'
    `transpose(1, 2).contiguous()` (integrations/sdpa_attention.py:196) copies it there and the
    trained o_proj saves the copy (tokens x heads x head_dim, 3.2 % of this trace), where both
    real kernels write (b, s, h, d) and return its transpose (aten attention.cpp / cuda
    attention.cu: a view, as `sdpa_output_reused` counts it). One length each (CI time): the
    errors at 512 tokens are within 0.1 points of these."""
    errors = _activation_errors({**BASE, **change}, name, [256])
    assert all(low <= e <= high for e in errors), errors


EXPERT_LORA = {"lora_targets": ["all-linear"], "lora_dropout": 0.0}  # peft's banks need 0


@pytest.mark.parametrize(
    "name, change",
    [
        ("small-mixtral", EXPERT_LORA),
        ("small-glm4-moe", EXPERT_LORA),
        ("small-glm4-moe-lite", EXPERT_LORA),
        ("small-qwen3-moe", {**EXPERT_LORA, "autocast": False, "precision": "bf16"}),
    ],
    ids=["mixtral", "glm45", "glm47-flash", "qwen3-moe-no-autocast"],
)
def test_expert_bank_lora_activations_against_the_trainer_step(name, change):
    """all-linear LoRA on MoE models: peft's ParamWrapper adapts the expert banks, whose merged
    weights, bf16 copies of lora_A / lora_B (peft `get_delta_factors`) and the down bank's
    gradient with its input's (activations.py `_merged_expert_weights`, `_expert_lora_moments`)
    set the layer's most; the combine's moment under the sigmoid-routed blocks' late shared
    experts. Before: +15.2 % (Mixtral), +13.4 % (GLM-4.5), +5.3 % (Qwen3-MoE) at 256 tokens,
    the gate_up bank's gradient counted over the whole SwiGLU backward; now within 2 % (the
    others at 256 tokens, with and without autocast: -0.1 .. +1.7 %)."""
    errors = _activation_errors({**BASE, **change}, name, [256])
    assert all(-2.0 <= e <= 2.0 for e in errors), errors


@pytest.mark.parametrize("name", ["small-phi3", "small-glm4"])
def test_fused_gate_up_lora_without_autocast_against_the_trainer_step(name):
    """Phi-3's and GLM-4's fused gate_up_proj under all-linear LoRA without autocast: the
    layer's most is in the recomputed forward, where peft's branch on that projection holds
    the base output, lora_B's fp32 output and its scaled copy, each twice the MLP width
    (activations.py `_input_projection_moment`). Before: -15.2 % (Phi-3), -5.7 % (GLM-4)."""
    change = {"lora_targets": ["all-linear"], "lora_dropout": 0.0, **NO_AUTOCAST}
    errors = _activation_errors({**BASE, **change}, name, [256])
    assert all(-2.0 <= e <= 2.0 for e in errors), errors


@pytest.mark.parametrize(
    "name, low", [("small-olmo2", -1.0), ("small-glm4", -4.0), ("small-gemma2", -1.0)]
)
def test_amp_full_fine_tuning_of_post_norm_layers_at_1024_tokens(name, low):
    """AMP full fine-tuning (the hf stack's `mixed`: fp32 weights under autocast) of layers
    whose backward starts in a norm of the MLP's output: that norm's incoming gradient is the
    fp32 layer output's (activations.py `layer_activations`, `trailing_norm_transient`), and
    OLMo 2's layers, which norm only their sublayers' outputs, save no fp32 input of a norm
    that would be the layer input itself (`input_reused`). Before: -5.9 % (OLMo 2), -5.0 %
    (GLM-4) at 1024 tokens; now +0.0 % and -3.0 %, GLM-4's rest being the fake kernel's copy
    of SDPA's output after partial rotary (`test_moe_activations_against_the_trainer_step`),
    which its trained o_proj saves. Gemma 2 (eager attention): its masks take the fp32
    embeddings' dtype (model.py `mask_rule`), -4.7 -> +0.9 %."""
    errors = _activation_errors({**BASE, "method": "full"}, name, [1024])
    assert all(low <= e <= 1.0 for e in errors), errors


@pytest.mark.parametrize(
    "name, change, lengths, tolerance",
    [
        ("small-llama", {}, None, 1.5),
        ("small-qwen3-moe", {"lora_dropout": 0.0}, None, 1.5),  # peft: no dropout on banks
        ("small-llama", {"method": "full", "precision": "bf16"}, None, 2.5),
        ("small-qwen3-moe", {"method": "full", "precision": "bf16"}, None, 2.5),
        ("small-llama", {"method": "full", "precision": "mixed"}, [1024], 1.5),
        ("small-qwen3.5", {"method": "full", "precision": "bf16"}, None, 3.0),
    ],
    ids=[
        "llama-lora",
        "qwen3-moe-lora",
        "llama-full-bf16",
        "qwen3-moe-full-bf16",
        "llama-amp",
        "qwen3.5-full-bf16",
    ],
)
def test_without_checkpointing_within_tolerance_of_the_trainer_step(
    name, change, lengths, tolerance
):
    """Without checkpointing the activations peak in the forward's last layer (dense LoRA:
    peft's down_proj branch, no gradient exists yet, `Context.recomputed`) or at the final
    norm's backward (five fp32 hidden-wide tensors beside every layer's saved ones and the
    norm's own, memory/outer_norms.py), and under adapters the first layer's input norm saves
    nothing (its input needs no gradient). Before, at 256 tokens: LoRA +4.7 % (small Llama),
    -3.8 % (small Qwen3-MoE); full bf16 -9.8 % / -8.9 %, small Qwen3.5 -12.2 % (its Gemma norms'
    fp32 normalised tensors, `_norm_product_fp32`); AMP at 1024 tokens -5.4 %."""
    setup = {**BASE, "checkpointing": "none", **change}
    errors = _activation_errors(setup, name, lengths)
    assert all(abs(e) <= tolerance for e in errors), errors
