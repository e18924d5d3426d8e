"""Calls whose arguments are known before the graph runs, recorded on those values.

* ``F.take(x, F.array(idx))`` of a pending value by a known index vector (a
  literal, or a constant array given to the model: ``ir.known``) that picks a
  few runs of ``x``'s rows: those runs as row slices concatenated (views, no
  step); more runs are one take over every sample's rows
  (``rules.gathers.KnownTakeRule``);
* ``F.contrib.arange_like``: values that depend on the input's shape alone, a
  literal (pooled by ``record.literals``) when they are whole numbers and
  autograd does not record.
"""
import mxnet as mx
import numpy as np

from ..ir.graph import LEAF
from ..ir.known import taken_rows
from ..record import literals, passes, weights
from ..record.frames import one_call
from ..record.lazy import LazyArray
from ..record.literals import known_values

MAX_RUNS = 4        # more runs of rows than this: one take (rules.gathers.KnownTakeRule)


def take_rows(rec, op, args, kwargs):
    """``F.take(data, F.array(idx))`` of a pending value by a known index vector
    (``values_known``) along axis 0, picking few runs of ``data``'s rows: those runs (views, which
    move rows only) concatenated; None for any other take (a weight's rows
    batch as they are, many runs as one take: ``rules.gathers.KnownTakeRule``).

    A sample's own rows picked by a list of its own (positions of some words,
    a graph's edge ends) would otherwise be a call per sample.
    """
    if len(args) != 2:
        return None
    data, indices = args
    if not isinstance(indices, mx.nd.NDArray) or len(indices.shape) != 1 \
            or type(data) is not LazyArray \
            or not data.shape or not set(kwargs) <= {"axis", "mode"} \
            or kwargs.get("axis", 0) not in (0, -len(data.shape)) \
            or kwargs.get("mode", "clip") not in ("clip", "wrap") \
            or getattr(data._node, "kind", None) == LEAF \
            or weights.is_weight(rec, data):
        return None
    values = known_values(rec, indices)
    if values is None or not len(values):
        return None
    return one_call(rec, _runs_of_rows, rec.F, data, values, kwargs.get("mode", "clip"))


def _runs_of_rows(ns, data, values, mode):
    rows = taken_rows(values, data.shape[0], mode)
    starts = [0] + [k for k in range(1, len(rows)) if rows[k] != rows[k - 1] + 1]
    if len(starts) > MAX_RUNS:
        return None
    parts = [ns.slice_axis(data, axis=0, begin=int(rows[b]), end=int(rows[e - 1]) + 1)
             for b, e in zip(starts, starts[1:] + [len(rows)])]
    return parts[0] if len(parts) == 1 else ns.concat(*parts, dim=0)


def arange_like(rec, op, args, kwargs):
    """``F.contrib.arange_like`` of whole numbers as a literal (exact in any dtype).

    Not while autograd records: eager's output is then in the graph (its
    gradient zero), and a loss of such outputs alone must differentiate.
    """
    if mx.autograd.is_recording() or len(args) != 1 \
            or not set(kwargs) <= {"start", "step", "repeat", "ctx", "axis"} \
            or type(args[0]) is not LazyArray:
        return None
    data, shape = args[0], args[0].shape
    start, step = kwargs.get("start", 0.0), kwargs.get("step", 1.0)
    repeat, axis = kwargs.get("repeat", 1), kwargs.get("axis")
    if kwargs.get("ctx") is not None or not shape or repeat < 1 \
            or float(start) != int(start) or float(step) != int(step) \
            or not (axis is None or -len(shape) <= axis < len(shape)):
        return None
    count = int(np.prod(shape)) if axis is None else shape[axis]
    if not count:
        return None
    values = start + step * (np.arange(count) // repeat)
    return literals.record(rec, values.astype(data.dtype).reshape(
        shape if axis is None else (count,)))


passes.register("take", take_rows)
passes.register("arange_like", arange_like)
