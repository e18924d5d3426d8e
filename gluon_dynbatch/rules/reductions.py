"""Rules of reductions over every axis of a value.

* ``OneRowReduceRule``: over every axis of a one-row value (``F.sum(h * h)``,
  ``F.norm(h)``, ``loss.mean()``), the usual per-sample shape: a reduction
  over every axis but the rows;
* ``TotalRule``: ``sum``/``mean``/``max``/``min`` over every axis of a value of
  several rows (a sentence's (T,) token losses): each node's values are one
  segment of ``SegmentRule``'s batch.

A reduction over axis 0 of a node's rows is ``SegmentRule``'s (it comes first);
over other axes, a ``RowRule``.
"""
import numpy as np

from .rows import RowFallback, RowRule, axis_roles
from .segments import _SEGMENTS, SegmentRule
from ..ir.rules import ROW, Rule, Signature, _in_dtype, _in_shape, call_as_recorded, register_rule


def _one_row_total(node):
    """A reduction over every axis of a one-row input of at most 3 axes."""
    kwargs = node.kwargs
    shape = _in_shape(node, 0)
    if kwargs.get("axis") is not None or kwargs.get("exclude", False) \
            or not shape or shape[0] != 1 or len(shape) > 3 or len(node.inputs) != 1:
        return None
    if node.op.name == "norm" and kwargs.get("ord", 2) not in (1, 2):
        return None
    return (ROW,)


class TotalRule(Rule):
    """``sum``/``mean``/``max``/``min`` over every axis of a value of several rows
    (a sentence's (T,) token losses, ``F.sum(F.square(h))`` of a (T, H) matrix):
    each node's values, flattened, are one segment of ``SegmentRule``'s batch.

    One-row values take ``OneRowReduceRule`` first (no index arrays).  Programs
    do not hold these calls: a segment's count is its values, not its rows.
    """

    batching = "segment"

    def signature(self, node):
        kwargs = node.kwargs
        shape, dtype = _in_shape(node, 0), _in_dtype(node, 0)
        if len(node.inputs) != 1 or kwargs.get("exclude", False) or not shape \
                or not _all_axes(kwargs.get("axis"), len(shape)) or node.args[1:] \
                or set(kwargs) - {"axis", "keepdims"}:
            return None
        if node.op.name in ("max", "min", "mean") \
                and np.dtype(dtype) not in (np.float32, np.float64):
            # Padded with infinities; an integer mean's gradient is MXNet's
            # integer division (``SegmentRule``).
            return None
        key = ("total", shape[1:], dtype, bool(kwargs.get("keepdims", False)))
        return Signature((key,), self, (ROW,))

    @staticmethod
    def segment_arrays(nodes, dtype):
        """The padded index (and counts) of each node's values as one segment."""
        counts = [int(np.prod(_in_shape(node, 0))) for node in nodes]
        return SegmentRule.arrays_for_counts(counts, nodes[0].op.name, 1, dtype)

    def batched_call(self, F, node, inputs):
        flat = F.reshape(inputs[0], shape=(-1, 1))
        return _SEGMENTS.batched_call(F, node, [flat] + list(inputs[1:]))


def _all_axes(axis, ndim):
    """Whether a reduction's ``axis`` argument names every axis of ``ndim``."""
    if axis is None:
        return True
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    return all(type(a) is int for a in axes) \
        and sorted(a % ndim for a in axes if -ndim <= a < ndim) == list(range(ndim))


class OneRowReduceRule(RowRule):
    """A reduction over every axis of a one-row value: over all axes but the rows."""

    batching = "calls"
    program_form = None

    def __init__(self):
        super().__init__(_one_row_total)

    def batched_call(self, F, node, inputs):
        ndim = len(_in_shape(node, 0))
        if ndim == 1:                   # (1,) values: each is its own total
            return [F.abs(inputs[0]) if node.op.name == "norm" else F.identity(inputs[0])]
        axis = 1 if ndim == 2 else (1, 2)
        return call_as_recorded(F, node, inputs, extra_kwargs={"axis": axis})


for _name in ("sum", "mean", "max", "min"):        # after the ragged reduction over axis 0
    register_rule(_name, RowFallback(OneRowReduceRule(), RowFallback(
        SegmentRule(), RowFallback(TotalRule(), RowRule(axis_roles("axis", None))))))
register_rule(["prod", "nansum", "nanprod", "norm"],
              RowFallback(OneRowReduceRule(), RowRule(axis_roles("axis", None))))
