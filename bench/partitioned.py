"""A torch.compile backend that shows what AOTAutograd's partition keeps for the backward, for the
bench scripts that read it (compile_saved.py, titan_sac_saved.py, tune_compiled_saved.py).

It partitions as torch.compile's default inductor backend does, with
`min_cut_rematerialization_partition` and inductor's decomposition table (`select_decomp_table`),
hands each graph's outputs to a callback and runs the graphs uncompiled (no code generation, so
it runs on any CPU). In the forward graph the outputs after the first are the tensors saved for
the backward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.fx import GraphModule

Outputs = list[tuple[str, Any]]  # (node name, fake value) of each output with a shape


def graph_outputs(graph: Any, skip: int) -> Outputs:
    """The outputs of an FX graph module after the first `skip`, with their fake values."""
    outputs = [n for n in graph.graph.nodes if n.op == "output"][0].args[0]
    found: Outputs = []
    for node in outputs[skip:]:
        val = node.meta.get("val") if hasattr(node, "meta") else None
        if val is not None and hasattr(val, "shape"):
            found.append((node.name, val))
    return found


def min_cut_backend(
    on_saved: Callable[[Outputs], None], on_gradients: Callable[[Outputs], None] | None = None
) -> Callable[[Any, Any], Any]:
    """The backend: `on_saved` gets the forward graph's saved tensors, `on_gradients` (if given)
    the backward graph's outputs."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table

    def forward(gm: GraphModule, example_inputs: Sequence[Any]) -> Any:
        on_saved(graph_outputs(gm, 1))
        return gm

    def backward(gm: GraphModule, example_inputs: Sequence[Any]) -> Any:
        if on_gradients is not None:
            on_gradients(graph_outputs(gm, 0))
        return gm

    def backend(gm: Any, example: Any) -> Any:
        return aot_module_simplified(
            gm,
            example,
            fw_compiler=forward,
            bw_compiler=backward,
            partition_fn=min_cut_rematerialization_partition,
            decompositions=select_decomp_table(),
        )

    return backend


def print_saved(label: str, saved: Outputs, name_width: int) -> int:
    """Print each saved tensor (`  <label> <name> <dtype> <shape>`) and return their bytes."""
    total = 0
    for name, val in saved:
        total += val.numel() * val.element_size()
        print(f"  {label} {name:<{name_width}} {str(val.dtype):<15} {tuple(val.shape)}")
    return total
