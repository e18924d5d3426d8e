"""Values known before a graph runs: literals and constant arrays given to a model.

A batching rule may read such values when it plans a batch (role ``KNOWN``):
the indices of ``F.take(x, F.array(idx))``, a graph's adjacency in
``F.dot(F.array(A), H)``.  A value is known when its node is a literal's row
view (``F.array`` of Python numbers, pooled per graph by the recorder) or a
leaf holding an array that is no parameter, takes no gradient and has no
recorded history (``nd.array(...)`` given to the model).
"""
import ctypes
import math

import mxnet as mx
import numpy as np
from mxnet.base import _LIB, SymbolHandle, check_call
from mxnet.symbol import Symbol

from . import _scan
from .graph import LEAF, VIEW


class NegativeZero(float):
    """``-0.0`` as an operator's scalar (``h / k``): Python finds it equal to
    ``0.0`` (and hashes it alike), so calls keyed or batched by their scalars
    would take one for the other, and ``h / -0.0`` is not ``h / 0.0``.  Equal
    only to itself, it keeps such calls apart; MXNet reads it as ``-0.0``."""

    __slots__ = ()

    def __eq__(self, other):
        return type(other) is NegativeZero

    def __ne__(self, other):
        return type(other) is not NegativeZero

    def __hash__(self):
        return hash("-0.0")

    def __reduce__(self):
        return (NegativeZero, (-0.0,))


NEGATIVE_ZERO = NegativeZero(-0.0)
#: The one NaN scalars are recorded as: a NaN equals no other (a new one at every
#: call would be a new key every time), but a dict finds this one by identity.
NAN = float("nan")


def exact_scalar(value):
    """``float(value)``; ``NEGATIVE_ZERO`` for ``-0.0``, ``NAN`` for a NaN."""
    value = float(value)
    if value != value:
        return NAN
    return NEGATIVE_ZERO if value == 0.0 and math.copysign(1.0, value) < 0 else value


def scalars_as(numbers, dtype):
    """Python ``numbers`` as a numpy array of ``dtype``, rounded as MXNet's scalar
    operators round their number (a double, to float, then to half precision
    for float16: numpy's direct rounding to half differs by a unit in the last
    place near a tie)."""
    if np.dtype(dtype) == np.float16:
        return np.asarray(numbers, dtype=np.float32).astype(np.float16)
    return np.asarray(numbers, dtype=dtype)


def values_known(node):
    """Whether the values of graph node ``node`` (or of anything else: no) are
    known before its graph runs and constant to autograd, so that a batching
    rule may read them when it plans (``values_of``).  Asked once per leaf and
    graph."""
    kind = getattr(node, "kind", None)
    if kind == VIEW:
        return node.inputs[0][0] in node.graph.literal_leaves
    if kind != LEAF or node.param is not None or node.value is None \
            or node in node.graph.sparse_leaves:     # (read as a sparse array, not as values)
        return False
    known = node.graph.known_leaves
    found = known.get(node)
    if found is None:
        found = known[node] = constant_array(node.value)
    return found


def constant_array(array):
    """Whether autograd treats ``array`` as a constant, as eager MXNet would."""
    if array.grad is not None:
        return False
    history = autograd_symbol(array)
    # A variable has no children; listing every output of the history
    # instead costs time in proportion to its length.
    return history is None or history.get_children() is None


def autograd_symbol(array):
    """The Symbol of the history autograd holds for ``array``, or None: an array
    computed outside ``autograd.record()``, or one a backward pass went through
    without ``retain_graph`` (MXNet cleared its node's record).

    ``autograd.get_symbol``, without the Python exception it raises for the
    common answer ("not part of a computation graph").
    """
    handle = SymbolHandle()
    if _LIB.MXAutogradGetSymbol(array.handle, ctypes.byref(handle)) != 0:
        return None
    return Symbol(handle)


def values_of(node):
    """The numpy values of ``node``, known (``values_known``): a literal's view, or
    a leaf (given, or a literal run by a flush: a read, ``max_pending_nodes``)."""
    if node.kind == LEAF:
        return node.value.asnumpy()
    pool, begin, end = node.inputs[0][0], node.kwargs["begin"], node.kwargs["end"]
    found = node.graph.literal_parts.get((pool, begin))
    if found is not None and len(found) == end - begin:
        return found                    # the usual case: a literal's own view
    for leaf, parts in node.graph.literals.values():     # rows of a part, or of several
        if leaf is pool:
            for part in parts:
                if begin < len(part):
                    if end <= len(part):
                        return part[begin:end]
                    break
                begin, end = begin - len(part), end - len(part)
            return np.concatenate(parts)[node.kwargs["begin"]:node.kwargs["end"]]
    raise ValueError("%r is not a literal" % (node,))


def taken_rows(indices, size, mode):
    """The rows ``take`` reads for ``indices`` of a value of ``size`` rows, as MXNet
    computes them: each index truncated, then clipped or wrapped."""
    rows = np.trunc(indices).astype(np.int64)
    return np.clip(rows, 0, size - 1) if mode == "clip" else rows % size


def device_array(values, ctx):
    """Numpy ``values`` as a new NDArray of their dtype on ``ctx``.

    On the CPU, a copy handed over through DLPack (``_scan.dlpack_copy``): no
    engine operation, where a copy into an NDArray (``mx.nd.array``) first
    waits for everything the engine has queued (its ``WaitToWrite``: a flush
    would wait for the previous batch's backward pass to finish).  Elsewhere,
    or for a dtype DLPack does not carry here, one synchronous copy.  Made once
    per flush for every index array and literal pool together.
    """
    code = _DLPACK_TYPES.get(values.dtype)
    if code is not None and values.size and values.ndim and ctx.device_type == "cpu" \
            and ctx.device_id == 0:
        values = np.ascontiguousarray(values)
        capsule = _scan.dlpack_copy(values.reshape(-1).view(np.uint8), values.shape, *code)
        return mx.nd.from_dlpack(capsule)
    out = mx.nd.empty(values.shape, ctx=ctx, dtype=values.dtype)
    out._sync_copyfrom(values)  # pylint: disable=protected-access
    return out


def copy_into(array, source):
    """Write array-like ``source`` into NDArray ``array`` on the CPU without
    waiting for the engine (``x[:] = values``, ``mx.nd.array(values)`` inside a
    scope, where the engine computes a flush meanwhile): the values are copied
    now (``device_array``), into ``array`` by an engine operation ordered after
    those queued on it, outside autograd as a synchronous copy is.  False where
    this does not apply (the caller copies synchronously, or raises MXNet's error).
    """
    dtype = np.dtype(array.dtype)
    if dtype not in _DLPACK_TYPES or array.context != _CPU:
        return False
    try:
        values = np.asarray(source, dtype=dtype, order="C")
    except (TypeError, ValueError):
        return False
    if values.shape != array.shape or not values.size or not values.ndim:
        return False
    staged = device_array(values, _CPU)
    recording = ctypes.c_int()
    check_call(_LIB.MXAutogradSetIsRecording(0, ctypes.byref(recording)))
    try:
        staged.copyto(array)
    finally:
        if recording.value:
            check_call(_LIB.MXAutogradSetIsRecording(1, ctypes.byref(ctypes.c_int())))
    return True


_CPU = mx.cpu(0)

# dtype -> DLPack (type code, bits): 0 int, 1 uint, 2 float.
_DLPACK_TYPES = {np.dtype(name): (code, np.dtype(name).itemsize * 8) for name, code in (
    ("int8", 0), ("int32", 0), ("int64", 0), ("uint8", 1),
    ("float16", 2), ("float32", 2), ("float64", 2))}


def row_slice(array, begin, end):
    """Rows ``begin:end`` of NDArray ``array`` (``slice_axis``; ``slice`` for
    booleans, which ``slice_axis`` has no kernel for in MXNet 1.9.1)."""
    if array.dtype == np.bool_:
        return mx.nd.slice(array, begin=(begin,), end=(end,))
    return mx.nd.slice_axis(array, axis=0, begin=begin, end=end)
