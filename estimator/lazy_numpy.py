"""numpy for the memory model, loaded on first real use: one configuration (one length, one
batch: Python floats) never loads it, a sweep or several lengths (arrays) do (issue 17: numpy's
import is ~0.07 s of a 0.3 s `trainfit estimate`).

    from estimator import lazy_numpy as np  # np.maximum(a, b), np.where(c, a, b), ...

The functions below take a Python `int`/`float` case in Python and hand anything else (arrays,
numpy scalars, a `dtype` other than float64) to numpy's function of the same name. The Python
case gives numpy's value: the same IEEE-754 double operations (`max`, `min`, `ceil`, `floor`
are exact; `log2` is C's, which agrees with numpy's on the integer-valued inputs the logits
chunk rule gives it), NaN propagated as numpy's `maximum`/`max` do, and the result type numpy
would pick (float when any argument is a float, int when all are ints). It returns a Python
float where numpy returns a float64 scalar: equal values, equal `str` and JSON.

Any other name (`np.broadcast_to`, `np.full`, ...) is numpy's own and loads numpy, except
`ndarray` before numpy is loaded (a placeholder class: no array can exist yet), `float64`
before numpy is loaded (`float`, numpy's alias of float64 as a dtype) and `nan`.

`numpy` is numpy itself, loaded on first attribute access, for modules that need its exact
behaviour on every input (`from estimator.lazy_numpy import numpy as np`)."""

from __future__ import annotations

import math
import sys
import types
from typing import Any

_SCALARS = (int, float)  # exact types: bool and numpy scalars go to numpy
NAN = math.nan


_loaded: Any = None  # numpy, once `_numpy` imported it


def _numpy() -> Any:
    """numpy, imported on the first call; later calls read it from a global (an import
    statement per call was ~50 lookups of sys.modules per 100-cell estimate, issue 17)."""
    global _loaded
    if _loaded is None:
        import numpy

        _loaded = numpy
    return _loaded


class _NoArray:
    """`ndarray` before numpy is loaded: nothing is an instance of it."""


class _LazyNumpy:
    """numpy, imported by the first attribute read; each attribute is kept once read (numpy's
    functions and types do not change), so a later read finds it without the failed lookup
    and AttributeError that precede `__getattr__`."""

    def __getattr__(self, name: str) -> Any:
        value = getattr(_numpy(), name)
        self.__dict__[name] = value
        return value


numpy: Any = _LazyNumpy()


def __getattr__(name: str) -> Any:
    if "numpy" not in sys.modules:
        if name == "ndarray":
            return _NoArray
        if name == "float64":
            return float
        if name == "nan":
            return NAN
    return getattr(_numpy(), name)


class _Module(types.ModuleType):
    """This module, with `ndarray` and `float64` (`__getattr__`'s answers) as properties: the
    memory model and the rows read them per evaluation (`type(x) is np.ndarray`,
    `dtype=np.float64`), and a property is one call where a module attribute that is not
    there costs a failed lookup, its AttributeError and `__getattr__` (~0.6 us each)."""

    @property
    def ndarray(self) -> Any:
        loaded = sys.modules.get("numpy")  # numpy itself, once imported
        return _NoArray if loaded is None else loaded.ndarray

    @property
    def float64(self) -> Any:
        loaded = sys.modules.get("numpy")
        return float if loaded is None else loaded.float64


sys.modules[__name__].__class__ = _Module


def _is_float64(dtype: Any) -> bool:
    return dtype is float or getattr(dtype, "__name__", None) == "float64"


def asarray(x: Any, dtype: Any = None) -> Any:
    """`np.asarray(x, dtype=np.float64)`; a Python scalar stays a Python float."""
    if type(x) in _SCALARS and _is_float64(dtype):
        return float(x)
    return _numpy().asarray(x, dtype=dtype)


def times_zero(x: Any) -> Any:
    """`np.asarray(x, dtype=np.float64) * 0.0`: a float zero in `x`'s shape (NaN where `x` is
    not finite, -0.0 where it is negative, as numpy); a Python scalar gives a Python float in
    one call (the memory model's usual case)."""
    if type(x) in _SCALARS:
        return float(x) * 0.0
    return _numpy().asarray(x, dtype=_numpy().float64) * 0.0


def _result(value: Any, *args: Any) -> Any:
    """numpy's result type for Python scalars: float if any argument is a float."""
    for a in args:
        if type(a) is float:
            return float(value)
    return value


def maximum(a: Any, b: Any) -> Any:
    if type(a) is float and type(b) is float:  # the memory model's usual case, `_result`'s
        if a != a or b != b:
            return NAN
        return a if a >= b else b
    if type(a) in _SCALARS and type(b) in _SCALARS:
        if a != a or b != b:  # NaN wins, as numpy's maximum
            return NAN
        return _result(a if a >= b else b, a, b)
    return _numpy().maximum(a, b)


def minimum(a: Any, b: Any) -> Any:
    if type(a) is float and type(b) is float:
        if a != a or b != b:
            return NAN
        return a if a <= b else b
    if type(a) in _SCALARS and type(b) in _SCALARS:
        if a != a or b != b:
            return NAN
        return _result(a if a <= b else b, a, b)
    return _numpy().minimum(a, b)


def where(condition: Any, a: Any, b: Any) -> Any:
    if type(condition) is bool and type(a) in _SCALARS and type(b) in _SCALARS:
        return _result(a if condition else b, a, b)
    return _numpy().where(condition, a, b)


def ceil(x: Any) -> Any:
    if type(x) in _SCALARS:
        return float(math.ceil(x)) if math.isfinite(x) else float(x)  # inf, NaN: themselves
    return _numpy().ceil(x)


def floor(x: Any) -> Any:
    if type(x) in _SCALARS:
        return float(math.floor(x)) if math.isfinite(x) else float(x)
    return _numpy().floor(x)


def log2(x: Any) -> Any:
    if type(x) in _SCALARS and 0 < x <= math.inf:
        return math.log2(x)
    return _numpy().log2(x)  # 0, negative, NaN: numpy's value and warning


def any(x: Any) -> Any:  # noqa: A001 (numpy's name)
    """`np.any(x)` of a Python scalar: whether it is non-zero (NaN counts, as in numpy)."""
    if type(x) in _SCALARS:
        return x != 0
    return _numpy().any(x)


def max(values: Any, axis: Any = None) -> Any:  # noqa: A001 (numpy's name)
    """`np.max(values, axis=0)` of a list of Python scalars: the largest, NaN winning."""
    if type(values) is list and values and all(type(v) in _SCALARS for v in values):
        for v in values:  # (not `any`: this module's `any` is numpy's)
            if v != v:
                return NAN
        top = values[0]
        for v in values[1:]:
            if v > top:
                top = v
        return _result(top, *values)
    return _numpy().max(values, axis=axis)
