"""Multi-GPU layouts (`--parallel`): parsing, model checks, the model-parallel split and the
data-parallel states and buffers. Pure formulas: the memory and time wings compose them."""

from estimator.parallel.checks import check_model
from estimator.parallel.layout import Layout, LayoutText, parse_parallel, parse_wrap, resolve

__all__ = ["Layout", "LayoutText", "check_model", "parse_parallel", "parse_wrap", "resolve"]
