"""`estimator.lazy_numpy` gives numpy's values for Python scalars, and numpy's own results for
anything else."""

from __future__ import annotations

import math
from typing import Any

import numpy
import pytest

from estimator import lazy_numpy

SCALARS: list[Any] = [0, 1, 3, -2, 0.0, -0.5, 1.0, 2.5, 1e300, 4096.0, 2**40 + 1.0, math.inf]
NAN = math.nan


def _same(ours: Any, theirs: Any) -> bool:
    """Equal values (NaN equal to NaN) of the same kind: a Python float where numpy gives a
    float (or numpy's own result where the function handed the case to numpy)."""
    if isinstance(theirs, numpy.ndarray) and theirs.ndim == 0:
        theirs = theirs[()]
    kind = float if isinstance(theirs, numpy.floating) else int
    if type(ours) is not kind and type(ours) is not type(theirs):
        return False
    return bool(ours == theirs or (ours != ours and theirs != theirs))


@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_binary_functions_agree_with_numpy_on_python_scalars(name: str) -> None:
    for a in [*SCALARS, NAN]:
        for b in [*SCALARS, NAN]:
            ours = getattr(lazy_numpy, name)(a, b)
            assert _same(ours, getattr(numpy, name)(a, b)), (name, a, b, ours)


def test_where_agrees_with_numpy_on_python_scalars() -> None:
    for cond in (True, False):
        for a in SCALARS:
            for b in (0, 0.0, 7, 2.5):
                assert _same(lazy_numpy.where(cond, a, b), numpy.where(cond, a, b)), (cond, a, b)


@pytest.mark.parametrize("name", ["ceil", "floor", "log2"])
def test_unary_functions_agree_with_numpy_on_python_scalars(name: str) -> None:
    values = [*SCALARS, NAN, -math.inf, 0.1, 4095.5, 2.0**52 + 1, 123456789.0]
    values += [float(2**k + d) for k in range(1, 50) for d in (-1, 0, 1)]
    with numpy.errstate(all="ignore"):
        for x in values:
            ours = getattr(lazy_numpy, name)(x)
            assert _same(ours, getattr(numpy, name)(numpy.asarray(x, dtype=numpy.float64))), x


def test_max_and_asarray_agree_with_numpy_on_python_scalars() -> None:
    for values in ([1.0, 3.0, 2.0], [2, 5, 1], [1, 2.5], [0.0, NAN, 1.0], [-1.0]):
        assert _same(lazy_numpy.max(values, axis=0), numpy.max(values, axis=0)), values
    for x in (0, 3, 2.5, -1e300):
        assert type(lazy_numpy.asarray(x, dtype=lazy_numpy.float64)) is float
        assert lazy_numpy.asarray(x, dtype=lazy_numpy.float64) == numpy.asarray(x, numpy.float64)


def test_any_agrees_with_numpy_on_python_scalars() -> None:
    for x in [*SCALARS, NAN, -0.0, -math.inf]:
        assert bool(lazy_numpy.any(x)) == bool(numpy.any(x)), x
        assert type(lazy_numpy.any(x)) is bool
    assert lazy_numpy.any(numpy.asarray([0.0, 2.0])) == numpy.True_


def test_arrays_and_other_names_are_numpy_s() -> None:
    seqs = numpy.asarray([1.0, 5.0])
    assert type(lazy_numpy.maximum(seqs, 2.0)) is numpy.ndarray
    assert lazy_numpy.maximum(seqs, 2.0).tolist() == [2.0, 5.0]
    assert lazy_numpy.where(seqs > 2, seqs, 0.0).tolist() == [0.0, 5.0]
    assert type(lazy_numpy.asarray(3, dtype=None)) is numpy.ndarray  # no dtype: numpy decides
    assert lazy_numpy.ndarray is numpy.ndarray  # numpy is loaded here
    assert lazy_numpy.broadcast_to is numpy.broadcast_to
    assert lazy_numpy.numpy.full is numpy.full


def test_times_zero_is_asarray_float64_times_zero() -> None:
    """`times_zero(x)` = `np.asarray(x, dtype=np.float64) * 0.0`: the sign of a negative
    value's zero and NaN of a non-finite value kept; arrays and numpy scalars numpy's own."""
    with numpy.errstate(all="ignore"):
        for x in [*SCALARS, NAN, -0.0, -math.inf, -3, -2.5]:
            ours = lazy_numpy.times_zero(x)
            theirs = numpy.asarray(x, dtype=numpy.float64) * 0.0
            assert type(ours) is float, x
            assert _same(ours, theirs), x
            assert math.copysign(1.0, ours) == math.copysign(1.0, float(theirs)), x
        for other in (numpy.float64(-2.0), numpy.asarray([1.0, -1.0, math.inf]), True):
            ours = lazy_numpy.times_zero(other)
            theirs = numpy.asarray(other, dtype=numpy.float64) * 0.0
            assert type(ours) is type(theirs)
            assert numpy.array_equal(ours, theirs, equal_nan=True)
            assert (numpy.signbit(ours) == numpy.signbit(theirs)).all()
