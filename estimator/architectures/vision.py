"""Vision towers (and the projectors into the text model) of the multimodal checkpoints, counted
as their `...ForConditionalGeneration` class instantiates them in transformers v5. A text-only
fine-tune does not train them; they are reported as an `extras` group (`vision_tower`) and enter
the weights only when a profile names them.

Sources, per family (transformers v5 modeling files):
- qwen3_5, qwen3_5_moe, qwen3_vl: `Qwen3_5VisionModel` / `Qwen3VLVisionModel` (3-D patch conv
  with bias, learned positions, LayerNorm ViT blocks with fused qkv, GELU MLP, patch mergers).
- qwen2_vl: `Qwen2VisionTransformerPretrainedModel` (conv without bias, LayerNorm blocks, fc1 /
  fc2 MLP, merger `ln_q` + two Linear).
- qwen2_5_vl: `Qwen2_5_VisionTransformerPretrainedModel` (conv without bias, RMSNorm blocks,
  gated SiLU MLP with biases, one merger `ln_q` + two Linear with bias).
- mistral3: `PixtralVisionModel` (conv without bias, RMSNorm, bias-free attention and gated MLP)
  and `Mistral3MultiModalProjector` (RMSNorm, patch merger, linear_1, linear_2).
- gemma3: `SiglipVisionModel` (conv with bias, learned positions, LayerNorm blocks, all Linear
  with bias, post LayerNorm, optional attention-pooling head) and `Gemma3MultiModalProjector`
  (`mm_input_projection_weight`, `mm_soft_emb_norm`).
- llama4: `Llama4VisionModel` (unfold-conv Linear without bias, class token, positions, LayerNorm
  pre/post, blocks with biased Linear, pixel-shuffle MLP) and `Llama4MultiModalProjector`.
"""

from __future__ import annotations

from estimator.config_fields import ConfigReader
from estimator.errors import EstimatorInputError
from estimator.spec import ParamGroup

NOTE = "not trained by a text-only run; loaded by the ForConditionalGeneration class"


def _linear(i: int, o: int, bias: bool = True) -> int:
    return i * o + (o if bias else 0)


def _vit_block(h: int, inter: int, *, bias: bool, norm_bias: bool, gated: bool = False) -> int:
    """One ViT block: two norms, q/k/v/o (fused or not, same count), the MLP."""
    norm = 2 * h * (2 if norm_bias else 1)
    attn = 4 * _linear(h, h, bias)
    if gated:
        mlp = 2 * _linear(h, inter, bias) + _linear(inter, h, bias)
    else:
        mlp = _linear(h, inter, bias) + _linear(inter, h, bias)
    return norm + attn + mlp


def qwen3_vision(v: ConfigReader) -> int:
    """Qwen3-VL / Qwen3.5 vision tower: patch conv (bias), positions, `depth` blocks, the patch
    merger (LayerNorm, two Linear with bias) and one per deepstack index (norm after the
    spatial merge)."""
    vh, vi = v.integer("hidden_size"), v.integer("intermediate_size")
    patch, temporal = v.integer("patch_size"), v.integer("temporal_patch_size", 2)
    channels = v.integer("in_channels", 3)
    out_h, merge = v.integer("out_hidden_size"), v.integer("spatial_merge_size", 2)
    patch_embed = channels * temporal * patch * patch * vh + vh
    block = _vit_block(vh, vi, bias=True, norm_bias=True)
    merged = vh * merge * merge
    mergers = _linear(merged, merged) + _linear(merged, out_h)
    deepstack = len(v.int_list("deepstack_visual_indexes"))
    return (
        patch_embed
        + v.integer("num_position_embeddings") * vh
        + v.integer("depth") * block
        + (2 * vh + mergers)
        + deepstack * (2 * merged + mergers)
    )


def qwen2_5_vision(v: ConfigReader) -> int:
    """Qwen2.5-VL vision tower: bias-free 3-D patch conv, RMSNorm blocks (fused qkv and proj with
    bias, gated MLP with biases), merger: RMSNorm `ln_q` and two Linear with bias."""
    vh, vi = v.integer("hidden_size"), v.integer("intermediate_size")
    patch, temporal = v.integer("patch_size"), v.integer("temporal_patch_size", 2)
    channels = v.integer("in_channels", 3)
    out_h, merge = v.integer("out_hidden_size"), v.integer("spatial_merge_size", 2)
    block = _vit_block(vh, vi, bias=True, norm_bias=False, gated=True)
    merged = vh * merge * merge
    merger = vh + _linear(merged, merged) + _linear(merged, out_h)
    return channels * temporal * patch * patch * vh + v.integer("depth") * block + merger


def qwen2_vision(v: ConfigReader) -> int:
    """Qwen2-VL vision tower (transformers 5.25.0 models/qwen2_vl/modeling_qwen2_vl.py:253-300,
    :427-436, :653-668): bias-free 3-D patch conv of `embed_dim`, LayerNorm blocks (fused qkv
    and proj with bias, fc1 / fc2 MLP of embed_dim * mlp_ratio with bias), merger: LayerNorm
    `ln_q` and two Linear with bias into the text model's `hidden_size`."""
    vh = v.integer("embed_dim")
    vi = vh * v.integer("mlp_ratio", 4)
    patch, temporal = v.integer("patch_size"), v.integer("temporal_patch_size", 2)
    channels = v.integer("in_channels", 3)
    out_h, merge = v.integer("hidden_size"), v.integer("spatial_merge_size", 2)
    block = _vit_block(vh, vi, bias=True, norm_bias=True)
    merged = vh * merge * merge
    merger = 2 * vh + _linear(merged, merged) + _linear(merged, out_h)
    return channels * temporal * patch * patch * vh + v.integer("depth") * block + merger


def pixtral_vision(root: ConfigReader, v: ConfigReader, text_hidden: int) -> int:
    """Pixtral tower (Mistral 3) plus `Mistral3MultiModalProjector`."""
    vh, vi = v.integer("hidden_size"), v.integer("intermediate_size")
    patch, channels = v.integer("patch_size"), v.integer("num_channels", 3)
    block = _vit_block(vh, vi, bias=False, norm_bias=False, gated=True)
    tower = channels * patch * patch * vh + vh + v.integer("num_hidden_layers") * block
    merge = root.integer("spatial_merge_size", 2)
    layers = root.data.get("vision_feature_layer", -1)
    feature_layers = len(layers) if isinstance(layers, list) else 1
    bias = root.flag("multimodal_projector_bias", False)
    projector = (
        vh
        + _linear(vh * merge * merge, vh, False)
        + _linear(vh * feature_layers, text_hidden, bias)
        + _linear(text_hidden, text_hidden, bias)
    )
    return tower + projector


def _square_patches(v: ConfigReader) -> tuple[int, int, int, int, int]:
    """hidden, intermediate, patch, channels and image size of a ViT with square patches over a
    square image (SigLIP, Llama 4 vision)."""
    vh, vi = v.integer("hidden_size"), v.integer("intermediate_size")
    patch, channels = v.integer("patch_size"), v.integer("num_channels", 3)
    image = v.integer("image_size")
    if image < patch:
        raise EstimatorInputError(v.field("image_size"), f"smaller than patch_size {patch}")
    return vh, vi, patch, channels, image


def siglip_vision(v: ConfigReader, text_hidden: int) -> int:
    """SigLIP tower (Gemma 3) plus `Gemma3MultiModalProjector`."""
    vh, vi, patch, channels, image = _square_patches(v)
    positions = (image // patch) ** 2
    block = _vit_block(vh, vi, bias=True, norm_bias=True)
    tower = _linear(channels * patch * patch, vh) + positions * vh
    tower += v.integer("num_hidden_layers") * block + 2 * vh
    if v.flag("vision_use_head", True):
        # SiglipMultiheadAttentionPoolingHead: probe, nn.MultiheadAttention, LayerNorm, MLP
        tower += vh + _linear(vh, 3 * vh) + _linear(vh, vh) + 2 * vh
        tower += _linear(vh, vi) + _linear(vi, vh)
    return tower + vh * text_hidden + vh


def llama4_vision(v: ConfigReader, text_hidden: int) -> int:
    """Llama 4 vision model plus `Llama4MultiModalProjector` (linear_1 without bias)."""
    vh, vi, patch, channels, image = _square_patches(v)
    positions = (image // patch) ** 2 + 1  # + the class token
    block = _vit_block(vh, vi, bias=True, norm_bias=True)
    tower = channels * patch * patch * vh + vh + positions * vh + 2 * 2 * vh
    tower += v.integer("num_hidden_layers") * block
    proj_in, proj_out = v.integer("projector_input_dim"), v.integer("projector_output_dim")
    adapter = vi * proj_in + proj_out * proj_out  # Llama4VisionMLP2 fc1, fc2 (no bias)
    return tower + adapter + v.integer("vision_output_dim") * text_hidden


def vision_tower(model_type: str, root: ConfigReader, text_hidden: int) -> list[ParamGroup]:
    """The `vision_tower` extras group of a multimodal config (empty when it has no vision
    config)."""
    v = root.nested("vision_config")
    if v is None:
        return []
    if model_type in ("qwen3_5", "qwen3_5_moe", "qwen3_vl"):
        count = qwen3_vision(v)
    elif model_type == "qwen2_5_vl":
        count = qwen2_5_vision(v)
    elif model_type == "qwen2_vl":
        count = qwen2_vision(v)
    elif model_type == "mistral3":
        count = pixtral_vision(root, v, text_hidden)
    elif model_type == "gemma3":
        count = siglip_vision(v, text_hidden)
    elif model_type == "llama4":
        count = llama4_vision(v, text_hidden)
    else:
        return []
    return [ParamGroup("vision_tower", count, NOTE)]
