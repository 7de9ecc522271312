"""Layouts a model cannot take: each error names `setup.parallel` and the rule.

- tp must divide the attention heads and the key/value heads (Megatron-LM
  megatron/training/arguments.py: `num_attention_heads % tensor_model_parallel_size == 0` and
  `num_query_groups % tensor_model_parallel_size == 0`; torchtitan's Llama TP plan shards
  wq/wk/wv column-wise by head).
- pp must not exceed the decoder layers (every stage needs a layer; Megatron: num_layers %
  pipeline_model_parallel_size == 0 unless an uneven split is configured).
- pp x virtual stages (interleaved) must not exceed the layers (torchtitan@9dec370
  torchtitan/parallelisms/pipelining_utils.py:33-34 "Total stages cannot be greater than the
  number of layers"; an uneven split is allowed there, and costed as ceil here).
- ep must divide the routed experts (Megatron: num_moe_experts % expert_model_parallel_size).
"""

from __future__ import annotations

from estimator.errors import EstimatorInputError
from estimator.parallel.layout import FIELD, Layout
from estimator.spec import ModelSpec


def check_model(layout: Layout, spec: ModelSpec) -> None:
    """Raise EstimatorInputError(setup.parallel) when `spec` cannot be split this way."""
    name = spec.name
    if layout.tp > 1:
        for what, count in (("attention heads", spec.num_heads), ("kv heads", spec.num_kv_heads)):
            if count and count % layout.tp:
                raise EstimatorInputError(
                    FIELD, f"tp={layout.tp} does not divide the {count} {what} of {name}"
                )
    if layout.pp > 1 and spec.layers and layout.pp > spec.layers:
        raise EstimatorInputError(
            FIELD, f"pp={layout.pp} stages but {name} has {spec.layers} layers"
        )
    stages_total = layout.pp * layout.virtual
    if layout.virtual > 1 and spec.layers and stages_total > spec.layers:
        raise EstimatorInputError(  # torchtitan@9dec370 pipelining_utils.py:33-34
            "setup.pp_virtual",
            f"pp={layout.pp} x {layout.virtual} virtual stages = {stages_total} stages but "
            f"{name} has {spec.layers} layers",
        )
    if layout.ep > 1:
        experts = spec.moe.num_experts if spec.moe else 0
        if not experts:
            raise EstimatorInputError(FIELD, f"ep={layout.ep} but {name} has no routed experts")
        if experts % layout.ep:
            raise EstimatorInputError(
                FIELD, f"ep={layout.ep} does not divide the {experts} experts of {name}"
            )
