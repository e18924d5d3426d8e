"""Calls that only move a sample's rows, recorded as row slices and concatenations.

Row slices and axis-0 concatenations are views: they cost no step, their
readers gather the rows.  Calls written otherwise that move whole rows are
recorded that way:

* ``F.split(x, num_outputs=k, axis=0)`` of a pending value (a sentence's
  (T, E) matrix into tokens, DyNet's ``F.split(gates, 4, axis=0)`` of a 1-d
  vector): row slices, not an operator whose outputs are not its input's rows;
* ``F.stack(*xs, axis=0)`` of values of one shape: their rows concatenated,
  reshaped to ``(k,) + shape`` (the same values and gradients; a stack along
  axis 0 mixes the rows of its inputs, a concatenation and a reshape batch);
* ``F.transpose`` and ``F.swapaxes`` that only move axes of size 1 (a row
  ``(1, C)`` to a column ``(C, 1)``; Gluon's batch-first RNN layers turn
  ``(1, T, C)`` into ``(T, 1, C)``): a reshape, which batches row by row;
* ``F.broadcast_like(x, like, lhs_axes=..., rhs_axes=...)`` of a value the sample
  computed: ``broadcast_to`` of the shape it makes, which batches (a row
  repeated to another value's rows).
"""
from mxnet.ndarray import NDArray

from ..record import passes
from ..record.frames import one_call
from ..record.lazy import LazyArray


def split_rows(rec, op, args, kwargs):
    """``F.split`` of a pending value into equal parts along axis 0, as row slices."""
    parts = _row_parts(args, kwargs)
    if parts is None:
        return None
    return one_call(rec, _split_rows, rec.F, *parts)


def _split_rows(ns, data, num, squeeze):
    step = data.shape[0] // num
    if squeeze and len(data.shape) == 2:
        # Row k of (T, E) as an (E,) vector: rows k*E:(k+1)*E of the flat data.
        data, step = ns.reshape(data, shape=(-1,)), data.shape[1]
    outs = [ns.slice_axis(data, axis=0, begin=k * step, end=(k + 1) * step)
            for k in range(num)]
    if squeeze and len(data.shape) > 2:
        outs = [ns.reshape(out, shape=data.shape[1:]) for out in outs]
    return outs if num > 1 else outs[0]


def _row_parts(args, kwargs):
    """(data, num_outputs, squeeze_axis) of a split of a pending value into
    equal parts along axis 0, or None for any other split."""
    axis = kwargs.get("axis", 1)
    if type(axis) is not int or axis > 0 or len(args) != 1 or type(args[0]) is not LazyArray \
            or not set(kwargs) <= {"num_outputs", "axis", "squeeze_axis"}:
        return None
    data, num = args[0], kwargs.get("num_outputs")
    shape = data.shape
    if type(num) is not int or num < 1 or not shape \
            or axis not in (0, -len(shape)) or shape[0] % num:
        return None
    squeeze = bool(kwargs.get("squeeze_axis", False))
    if squeeze and (shape[0] != num or len(shape) < 2):
        return None
    return data, num, squeeze


def stack_rows(rec, op, args, kwargs):
    """``F.stack(*xs, axis=0)`` of arrays of one shape: their rows concatenated,
    reshaped to ``(len(xs),) + shape``."""
    if not args or kwargs.get("axis", 0) != 0 \
            or kwargs.get("num_args", len(args)) != len(args) \
            or not set(kwargs) <= {"axis", "num_args"} \
            or not all(isinstance(a, NDArray) for a in args):
        return None
    shape = args[0].shape
    if not shape or any(a.shape != shape for a in args[1:]):
        return None
    ns = rec.F
    return ns.reshape(ns.concat(*args, dim=0), shape=(len(args),) + shape)


def transpose_units(rec, op, args, kwargs):
    """``F.transpose`` that only moves axes of size 1, as a reshape (``_unit_move``)."""
    if len(args) != 1 or type(args[0]) is not LazyArray or not set(kwargs) <= {"axes"}:
        return None
    ndim = len(args[0].shape)
    axes = kwargs.get("axes") or tuple(reversed(range(ndim)))
    if not all(type(a) is int for a in axes) \
            or sorted(a % ndim for a in axes) != list(range(ndim)):
        return None
    return _unit_move(rec.F, args[0], [a % ndim for a in axes])


def swapaxes_units(rec, op, args, kwargs):
    """``F.swapaxes`` that only moves axes of size 1, as a reshape (``_unit_move``)."""
    if len(args) != 1 or type(args[0]) is not LazyArray or not set(kwargs) <= {"dim1", "dim2"}:
        return None
    ndim = len(args[0].shape)
    dims = [kwargs.get("dim1", 0), kwargs.get("dim2", 0)]
    if not all(type(d) is int and -ndim <= d < ndim for d in dims):
        return None
    perm = list(range(ndim))
    a, b = dims[0] % ndim, dims[1] % ndim
    perm[a], perm[b] = perm[b], perm[a]
    return _unit_move(rec.F, args[0], perm)


def _unit_move(ns, x, perm):
    """``x`` with its axes permuted (output axis i is input axis ``perm[i]``) as a
    reshape when only axes of size 1 move (the data keeps its order), else None.

    A reshape batches row by row; a transpose moves each sample's rows, so it
    runs per sample and keeps the calls around it out of programs (a CRF's
    ``F.broadcast_add(F.transpose(alpha), transitions)``).
    """
    shape = x.shape
    moved = [axis for axis in perm if shape[axis] != 1]
    if moved != sorted(moved):
        return None
    return ns.reshape(x, shape=tuple(shape[axis] for axis in perm))


def broadcast_like_axes(rec, op, args, kwargs):
    """``F.broadcast_like(x, like, lhs_axes=..., rhs_axes=...)`` (a row repeated to
    the rows of another value: a lattice cell's input over its words) as
    ``broadcast_to`` of the shape it makes, which batches; ``like`` a value the
    sample computed (its gradient from the call is zero either way, and a
    variable's gradient would tell a zero from none)."""
    if len(args) != 2 or set(kwargs) != {"lhs_axes", "rhs_axes"}:
        return None
    x, like = args
    lhs, rhs = kwargs["lhs_axes"], kwargs["rhs_axes"]
    if not isinstance(x, NDArray) or type(like) is not LazyArray or like._node is None \
            or not isinstance(lhs, (tuple, list)) or not isinstance(rhs, (tuple, list)) \
            or len(lhs) != len(rhs) or not lhs:
        return None
    shape, like_shape = list(x.shape), like.shape
    for left, right in zip(lhs, rhs):
        if type(left) is not int or type(right) is not int \
                or not -len(shape) <= left < len(shape) \
                or not -len(like_shape) <= right < len(like_shape):
            return None
        if shape[left] not in (1, like_shape[right]):
            return None             # (MXNet's error, as written)
        shape[left] = like_shape[right]
    return rec.F.broadcast_to(x, shape=tuple(shape))


passes.register("broadcast_like", broadcast_like_axes,
                when=lambda args, kwargs: "lhs_axes" in kwargs or "rhs_axes" in kwargs)
passes.register(["split", "SliceChannel"], split_rows,
                when=lambda args, kwargs: len(args) != 1 or not (
                    type(kwargs.get("axis", 1)) is int and kwargs.get("axis", 1) > 0))
passes.register("stack", stack_rows)
passes.register("transpose", transpose_units)
passes.register(["swapaxes", "SwapAxis"], swapaxes_units)
