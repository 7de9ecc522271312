"""Fake-tensor traces: shapes only, no memory, as the GPU would run them."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from probe import run_probe  # noqa: E402
from probe.linear_attention import FAKE_KERNEL_NAME  # noqa: E402
from tests.probe.conftest import load  # noqa: E402

GIB = 2**30


def _peak(doc, i=0):
    res = doc["results"][i]
    assert res["status"] == "ok", res["error"]
    return res["peak_allocated_bytes"]


def test_fake_run_of_an_8b_model_completes_beyond_this_machines_memory():
    cfg = load("Llama-3.1-8B")
    # two steps: the optimizer states exist from the second step's start (ZeRO's 2+2+4+8)
    doc = run_probe(cfg, {"method": "full", "precision": "mixed"}, [1024], steps=2, device="fake")
    n = doc["model"]["params_total"]
    assert n == 8_030_261_248  # as the reference README counts it
    assert doc["environment"]["memory_counter"] == "fake_storage_tracker"
    # bf16 weights + bf16 grads + fp32 masters + two fp32 AdamW states: 16 bytes per parameter
    assert _peak(doc) >= 16 * n
    assert doc["results"][0]["tokens_per_second"] is None  # trace times are not GPU times


@pytest.mark.parametrize("setup", [{"checkpointing": "none"}, {"checkpointing": "gpu"}])
def test_fake_peak_equals_the_real_cpu_peak(setup):
    cfg = load("tiny-llama")
    setup = {**setup, "precision": "bf16", "optimizer": "lion"}
    real = run_probe(cfg, setup, [256], steps=2, device="cpu")
    fake = run_probe(cfg, setup, [256], steps=2, device="fake")
    assert _peak(fake) == _peak(real)
    assert fake["results"][0]["components"] == real["results"][0]["components"]


def _attention_probe_config():
    # one layer, tiny vocab and MLP: attention's own memory dominates the growth with seq
    cfg = load("tiny-llama")
    cfg.update(num_hidden_layers=1, vocab_size=64, intermediate_size=64)
    return cfg


def test_fake_attention_keeps_no_s_by_s_matrix():
    cfg = _attention_probe_config()
    setup = {"checkpointing": "none", "precision": "bf16", "optimizer": "sgd"}
    lengths = [2048, 4096, 8192]
    doc = run_probe(cfg, setup, lengths, steps=1, device="fake")
    assert "flash_attention" in doc["environment"]["attention_kernel"]
    p = [_peak(doc, i) for i in range(3)]
    # linear in seq: doubling the length adds the same bytes again (within 5 %)
    assert abs((p[2] - p[1]) - 2 * (p[1] - p[0])) <= 0.05 * (p[2] - p[1])
    # and far below one bf16 s x s score matrix per head at 8192
    heads = cfg["num_attention_heads"]
    assert p[2] < heads * 8192 * 8192 * 2 / 10


def test_eager_attention_in_fake_mode_grows_quadratically():
    cfg = _attention_probe_config()
    setup = {"checkpointing": "none", "precision": "bf16", "optimizer": "sgd", "attention": "eager"}
    doc = run_probe(cfg, setup, [2048, 4096], steps=1, device="fake")
    heads = cfg["num_attention_heads"]
    assert _peak(doc, 1) > heads * 4096 * 4096 * 2  # the s x s scores exist
    assert doc["environment"]["attention_kernel"].startswith("eager")


def test_fake_qwen3_5_uses_the_gated_delta_custom_op():
    doc = run_probe(
        load("tiny-qwen3.5"),
        {"method": "lora", "checkpointing": "gpu", "loss": "chunked", "loss_chunk": 64},
        [128, 256],
        steps=1,
        device="fake",
    )
    assert doc["environment"]["linear_attention_kernel"] == FAKE_KERNEL_NAME
    assert _peak(doc, 1) > _peak(doc, 0)


def test_gated_delta_op_gives_the_fallbacks_values_and_gradients():
    from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen

    import probe.linear_attention as la

    la._fallback = la._fallback or qwen.torch_chunk_gated_delta_rule
    torch.manual_seed(0)
    b, t, h, hv, k, v = 1, 100, 2, 4, 8, 8
    inputs = [
        torch.randn(b, t, h, k),
        torch.randn(b, t, h, k),
        torch.randn(b, t, hv, v),
        -torch.rand(b, t, hv),
        torch.rand(b, t, hv),
    ]
    ref_in = [x.clone().requires_grad_() for x in inputs]
    op_in = [x.clone().requires_grad_() for x in inputs]
    o_ref, _ = qwen.torch_chunk_gated_delta_rule(
        *ref_in[:3], g=ref_in[3], beta=ref_in[4], use_qk_l2norm_in_kernel=True
    )
    o_op, _ = la.gated_delta_rule(
        *op_in[:3], g=op_in[3], beta=op_in[4], use_qk_l2norm_in_kernel=True
    )
    torch.testing.assert_close(o_op, o_ref)
    for a, b_ in zip(
        torch.autograd.grad(o_op.sum(), op_in),
        torch.autograd.grad(o_ref.sum(), ref_in),
        strict=True,
    ):
        torch.testing.assert_close(a, b_, atol=1e-5, rtol=1e-4)


def test_gated_delta_fake_op_allocates_the_modelled_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        b, t, h, hv, k, v = 1, 4096, 16, 48, 128, 128
        q = torch.empty(b, t, h, k, dtype=torch.bfloat16)
        vv = torch.empty(b, t, hv, v, dtype=torch.bfloat16)
        g = torch.empty(b, t, hv)
        outs = torch.ops.trainfit.gated_delta_fwd(q, q, vv, g, g, None, False, True)
        o, final, q_s, q_rstd, k_s, k_rstd, g_s, a, scratch = outs
        assert o.shape == vv.shape and o.dtype == torch.bfloat16
        assert final.numel() == 0  # no final state unless asked for
        assert a.shape == (b, t, hv, 64)
        nt = t // 64
        assert scratch.numel() >= nt * hv * k * v * 2  # the chunk states h in bf16
