"""The recording ``F``: what ``hybrid_forward`` gets as ``F`` inside a scope.

It looks like ``mx.nd``: each operator records a call instead of running
(into the frame recording now, else into the graph); row slices and row
concatenations take the recorder's short paths (a stack along axis 0 is one
of those and a reshape); deterministic creation
functions (``F.zeros``) give constants, one per graph and arguments; other
Python helpers of ``mx.nd`` run on concrete values.
"""
import mxnet as mx
import numpy as np
from mxnet.ndarray import NDArray

from . import context, lazy_ops, literals
from .lazy import LazyArray
from .ops import opdef

# Creation operators whose result depends only on their arguments.
DETERMINISTIC = frozenset(["zeros", "ones", "full", "arange", "eye", "linspace",
                           "_zeros", "_ones", "_full", "_arange", "_eye", "_linspace"])


class RecordingNamespace:
    """The ``F`` given to ``hybrid_forward`` inside a scope: ``mx.nd`` that records."""

    def __init__(self, recorder, module=mx.nd, path=()):
        self._recorder = recorder
        self._module = module
        self._path = path

    def __getattr__(self, name):
        target = getattr(self._module, name)
        path = self._path + (name,)
        rec = self._recorder
        if not callable(target):
            if hasattr(target, "__dict__") and type(target).__name__ == "module":
                value = RecordingNamespace(rec, target, path)
            else:
                value = target
        elif getattr(target, "__module__", None) == "ndarray":
            op = opdef(*path)
            if path == ("slice_axis",):
                value = _slice_axis(rec, op)
            elif path in (("concat",), ("Concat",)):
                value = _concat(rec, op)
            elif path == ("stack",):
                value = _stack(self, _operator(rec, op))
            else:
                value = _operator(rec, op)
            value.__name__ = name
        else:
            value = _python_function(rec, target, path)
        self.__dict__[name] = value      # later lookups skip __getattr__
        return value


def _operator(rec, op):
    """``F.<op>``: into the frame recording now (its short path), else the recorder."""
    modes = context.MODE_CHANGES

    def operator(*args, **kwargs):
        frame = rec.frame
        if frame is not None and rec._mode_seen == modes[0]:  # pylint: disable=W0212
            return frame.op(op, args, kwargs)
        return rec.call_op(op, args, kwargs)
    return operator


def _slice_axis(rec, op):
    """``F.slice_axis``: rows of one array take the recorder's row-slice path."""
    def slice_axis(*args, **kwargs):
        if len(args) == 1 and len(kwargs) == 3 and kwargs.get("axis") == 0 \
                and "begin" in kwargs and "end" in kwargs and isinstance(args[0], NDArray):
            return rec.row_slice(args[0], kwargs["begin"], kwargs["end"])
        return rec.call_op(op, args, kwargs)
    return slice_axis


def _concat(rec, op):
    """``F.concat``: stacking rows (``dim=0``) takes the recorder's short path."""
    def concat(*args, **kwargs):
        if len(kwargs) == 1 and kwargs.get("dim") == 0 and args:
            out = rec.row_concat(op, args)
            if out is not None:
                return out
            frame = rec.frame
            if frame is None or not any(type(a) is LazyArray and a._node is frame
                                        for a in args):
                # Rows of values outside the frame: a view in the graph, read
                # by the frame as one input.
                return rec.graph_op(op, args, kwargs)
        return rec.call_op(op, args, kwargs)
    return concat


def _stack(ns, operator):
    """``F.stack(*xs, axis=0)``: the rows concatenated, then reshaped to ``(k,) + shape``.

    The same values and gradients; a concatenation of rows is a view and a
    reshape batches, where a stack along axis 0 mixes the rows of its inputs.
    """
    def stack(*args, **kwargs):
        if args and kwargs.get("axis", 0) == 0 and kwargs.get("num_args", len(args)) == len(args) \
                and set(kwargs) <= {"axis", "num_args"} \
                and all(isinstance(a, NDArray) for a in args):
            shape = args[0].shape
            if shape and all(a.shape == shape for a in args[1:]):
                return ns.reshape(ns.concat(*args, dim=0), shape=(len(args),) + shape)
        return operator(*args, **kwargs)
    return stack


def _array(rec, fn):
    """``F.array``: lists of Python numbers become rows of one pooled leaf (``literals.py``)."""
    def array(source_array, ctx=None, dtype=None):
        if isinstance(source_array, (list, tuple, np.ndarray)) and (ctx is None or ctx == rec.ctx):
            try:
                values = np.array(source_array, dtype=dtype or np.float32)
            except (TypeError, ValueError):
                values = None
            if values is not None and values.ndim >= 1 and values.size \
                    and values.dtype.kind in "fiu":
                return literals.record(rec, values, ctx)
        return rec.wrap_inputs(fn(source_array, ctx=ctx, dtype=dtype))
    return array


def _python_function(rec, fn, path):
    """``F.<f>`` for a Python-level helper of mx.nd (not an operator)."""
    special = lazy_ops.PYTHON_HELPERS.get(path[-1])
    if special is not None:
        return special
    if path == ("array",):
        return _array(rec, fn)
    if path[-1] in DETERMINISTIC:
        def create(*args, **kwargs):
            if kwargs or rec.ctx is None:
                return rec.make_constant(fn, path, args, kwargs)
            # F.zeros((1, H)) at every leaf of a tree: one leaf per graph.
            known = rec.graph.constants
            key = (path, args)
            try:
                found = known.get(key)
            except TypeError:           # an unhashable argument: no memo
                return rec.make_constant(fn, path, args, kwargs)
            if found is None:
                found = rec.make_constant(fn, path, args, kwargs)
                if type(found) is LazyArray:
                    known[key] = found
            return found
        return create

    def fallback(*args, **kwargs):
        # Not an operator: run it on concrete values (correct, not batched).
        return rec.wrap_inputs(fn(*args, **kwargs))
    return fallback
