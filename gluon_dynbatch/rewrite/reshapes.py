"""Reshapes seen through: parts of a reshaped pending value read as rows of its source.

A reshape keeps an array's elements in order.  A value ``r`` recorded as a
reshape of a pending value ``b`` (``x.expand_dims(0)``, ``F.reshape``,
``F.squeeze``, a stack along an axis that only axes of size 1 precede)
remembers ``b`` as its *base*.  When ``r`` is then split, sliced or reshaped
along an axis preceded only by axes of size 1, each part is a run of ``b``'s
rows, so it is recorded as those rows (a view, no step) and, where the shape
differs, a reshape of them, which batches row by row.  Recorded as written,
such a call on ``r`` depends on the sample's length (``(1, T, E)`` split
into ``T`` parts) and batches with no sample of another length.

Gluon's ``unroll`` does exactly this: it splits a ``(1, T, E)`` sentence
along axis 1, and with ``merge_outputs=True`` stacks its ``(1, H)`` outputs
along axis 1, which the user then indexes (``outs[:, -1]``).

A reshape of a reshape is one reshape of the base, and none when it gives
the base's shape back.  The values and gradients are the same: each part
holds the same elements.  Bases live as long as the values that name them
and are forgotten when a frame hands its values to the graph (see
``Frame.based``), so they never keep a value alive that nothing else reads.
"""
from math import prod

from ..ir.ops import opdef
from ..record import passes
from ..record.bases import RESHAPES, base_of, note
from ..record.frames import one_call
from ..record.lazy import LazyArray

_RESHAPE = opdef("reshape")


_TARGETS = {}       # (name, shape, kwargs items) -> target_shape


def target_shape(name, shape, kwargs):
    """The shape ``name`` (one of ``RESHAPES``) gives an input of ``shape``, or
    None where the arguments are ones this module leaves alone."""
    try:
        key = (name, shape, tuple(kwargs.items()))
        return _TARGETS[key]
    except TypeError:                   # a list among the arguments
        return _target_shape(name, shape, kwargs)
    except KeyError:
        if len(_TARGETS) > 4096:
            _TARGETS.clear()
        found = _TARGETS[key] = _target_shape(name, shape, kwargs)
        return found


def _target_shape(name, shape, kwargs):
    ndim = len(shape)
    if name == "expand_dims":
        axis = kwargs.get("axis")
        if type(axis) is not int or not -ndim - 1 <= axis <= ndim or set(kwargs) - {"axis"}:
            return None
        axis %= ndim + 1
        return shape[:axis] + (1,) + shape[axis:]
    if name == "squeeze":
        return _squeezed(shape, kwargs)
    if name in ("Flatten", "flatten"):
        return None if kwargs or ndim < 2 else (shape[0], prod(shape[1:]))
    if set(kwargs) - {"shape"}:
        return None             # reverse, target_shape, ...: left to MXNet
    return _reshaped(shape, kwargs.get("shape"))


def _squeezed(shape, kwargs):
    if set(kwargs) - {"axis"}:
        return None
    axis = kwargs.get("axis")
    ndim = len(shape)
    if axis is None:
        axes = [a for a, size in enumerate(shape) if size == 1]
    else:
        axes = [axis] if type(axis) is int else list(axis)
        if not all(type(a) is int and -ndim <= a < ndim for a in axes):
            return None
        axes = [a % ndim for a in axes]
        if any(shape[a] != 1 for a in axes):
            return None
    out = tuple(size for a, size in enumerate(shape) if a not in axes)
    return out or (1,)


def _reshaped(shape, target):
    """``shape`` reshaped to ``target`` with MXNet's 0 (copy) and -1 (infer), or None."""
    if not isinstance(target, (tuple, list)) or not target:
        return None
    out = []
    for k, size in enumerate(target):
        if type(size) is not int or size < -1:
            return None
        if size == 0:
            if k >= len(shape):
                return None
            size = shape[k]
        out.append(size)
    total = prod(shape)
    if out.count(-1) > 1:
        return None
    if -1 in out:
        known = prod([s for s in out if s != -1])
        if not known or total % known:
            return None
        out[out.index(-1)] = total // known
    return tuple(out) if prod(out) == total else None


def reshape_on_base(rec, op, args, kwargs):
    """A reshape operator (``op.name`` in ``RESHAPES``) seen through its input's
    base: one reshape of the base, none when it gives the base's shape back; a
    reshape of a value without a base makes that value its base."""
    if len(args) != 1 or type(args[0]) is not LazyArray:
        return None
    x = args[0]
    target = target_shape(op.name, x.shape, kwargs)
    if target is None:
        return None
    base = base_of(x)
    if base is None:
        return note(rec, rec.call_op(op, args, kwargs), x)
    if target == base.shape:
        return base
    return note(rec, rec.call_op(_RESHAPE, (base,), {"shape": target}), base)


def _source(x, axis):
    """(the array whose rows make up ``x``'s elements along ``axis``, the elements
    of one step along ``axis``, the elements of one of its rows), or None."""
    if type(x) is not LazyArray or any(size != 1 for size in x.shape[:axis]):
        return None
    source = base_of(x)
    if source is None:
        if axis:
            return None
        source = x
    row = prod(source.shape[1:])
    return (source, prod(x.shape[axis + 1:]), row) if row else None


def part(ns, x, axis, begin, end, shape, reshape=True):
    """Elements ``begin:end`` along ``axis`` of pending value ``x``, as an array
    of ``shape``: rows of ``x``'s base (or of ``x``, along axis 0), or None.

    Only axes of size 1 may precede ``axis``, and the part must be whole rows
    of the source; without ``reshape``, rows of the source's shape.
    """
    found = _source(x, axis)
    if found is None:
        return None
    source, inner, row = found
    first, last = begin * inner, end * inner
    if first % row or last % row or not reshape and \
            source.shape[1:] != tuple(shape[1:]):
        return None
    return _rows(ns, source, first // row, last // row, shape)


def _rows(ns, source, begin, end, shape):
    rows = ns.slice_axis(source, axis=0, begin=begin, end=end)
    return rows if rows.shape == tuple(shape) else ns.reshape(rows, shape=tuple(shape))


def _based(args, kwargs):
    """Whether ``split_on_base`` may rewrite a call: not when its data is a
    value without a base."""
    return len(args) != 1 or type(args[0]) is not LazyArray or args[0]._base is not None


def split_on_base(rec, op, args, kwargs):
    """``F.split`` of a reshaped value as rows of its base."""
    if len(args) != 1 or type(args[0]) is not LazyArray or args[0]._base is None \
            or not set(kwargs) <= {"num_outputs", "axis", "squeeze_axis"}:
        return None
    found = one_call(rec, _split, rec.F, args[0], kwargs.get("axis", 1),
                     kwargs.get("num_outputs"), bool(kwargs.get("squeeze_axis")))
    if found is None:
        return None
    return found if len(found) > 1 else found[0]


def _split(ns, x, axis, num, squeeze):
    """The parts of ``F.split(x, axis=axis, num_outputs=num, squeeze_axis=squeeze)``
    as rows of ``x``'s base, or None."""
    if type(x) is not LazyArray or base_of(x) is None:
        return None
    shape = x.shape
    if type(axis) is not int or not -len(shape) <= axis < len(shape):
        return None
    axis %= len(shape)
    if type(num) is not int or num < 1 or shape[axis] % num:
        return None
    step = shape[axis] // num
    found = _source(x, axis)
    if found is None or (squeeze and step != 1) or (step * found[1]) % found[2]:
        return None
    source, rows = found[0], step * found[1] // found[2]
    out_shape = shape[:axis] + ((step,) if not squeeze else ()) + shape[axis + 1:]
    return [_rows(ns, source, k * rows, (k + 1) * rows, out_shape or (1,))
            for k in range(num)]


def stack_after_ones(rec, op, args, kwargs):
    """``F.stack(*args, axis=axis)`` where only axes of size 1 precede ``axis``:
    the rows concatenated, reshaped (a reshape whose base is the concatenation);
    None for any other stack."""
    if not set(kwargs) <= {"axis", "num_args"} \
            or kwargs.get("num_args", len(args)) != len(args):
        return None
    ns, axis = rec.F, kwargs.get("axis", 0)
    if not args or not all(type(a) is LazyArray for a in args):
        return None
    shape = args[0].shape
    if type(axis) is not int or not -len(shape) - 1 <= axis <= len(shape):
        return None
    axis %= len(shape) + 1
    if not axis or any(size != 1 for size in shape[:axis]) \
            or any(a.shape != shape for a in args[1:]):
        return None
    rows = ns.concat(*args, dim=0)
    return ns.reshape(rows, shape=shape[:axis] + (len(args),) + shape[axis:])


def concat_numbers(rec, op, args, kwargs):
    """``F.concat(*args, dim=dim)`` of single numbers ((1, 1) scores) along an
    axis after ones: a (k, 1) column of their rows, reshaped (the column is
    the result's base); None for any other concatenation."""
    dim = kwargs.get("dim", 1)
    if dim == 0 or not args or not all(type(a) is LazyArray for a in args) \
            or args[0]._node is None or args[0].size != 1:
        return None
    ns = rec.F
    shape = args[0].shape
    if type(dim) is not int or not -len(shape) <= dim < len(shape) or len(shape) < 2 \
            or any(a.shape != shape for a in args[1:]) or any(size != 1 for size in shape):
        return None
    dim %= len(shape)
    if not dim:
        return None
    rows = [a if a.shape == (1, 1) else ns.reshape(a, shape=(1, 1)) for a in args]
    column = ns.concat(*rows, dim=0)
    return ns.reshape(column, shape=shape[:dim] + (len(args),) + shape[dim + 1:])


def slice_on_base(rec, op, args, kwargs):
    """``F.slice_axis`` of a reshaped value along an axis after ones (not 0), as
    rows of its base."""
    if len(args) != 1 or type(args[0]) is not LazyArray or args[0]._base is None \
            or set(kwargs) != {"axis", "begin", "end"}:
        return None
    shape = args[0].shape
    axis, begin, end = kwargs["axis"], kwargs["begin"], kwargs["end"]
    if type(axis) is not int or axis == 0 or not -len(shape) <= axis < len(shape) \
            or not (end is None or type(end) is int) or type(begin) is not int:
        return None
    axis %= len(shape)
    begin, end, _ = slice(begin, end).indices(shape[axis])
    if end <= begin:
        return None
    out = shape[:axis] + (end - begin,) + shape[axis + 1:]
    return part(rec.F, args[0], axis, begin, end, out)


def index_on_base(rec, x, begins, ends, shape, whole_rows):
    """``x[...]`` of a reshaped value cutting one axis (after axes of size 1): rows
    of its base, or None; ``whole_rows``: a row slice ``x[i:j]``, taken from the
    base only where its rows have ``x``'s trailing shape."""
    if whole_rows:
        return part(rec.F, x, 0, begins[0], ends[0], shape, reshape=False)
    old = x.shape
    cut = [a for a, (b, e) in enumerate(zip(begins, ends)) if (b, e) != (0, old[a])]
    if len(cut) > 1:
        return None
    if not cut:
        return rec.F.reshape(x, shape=shape) if shape != old else None
    return part(rec.F, x, cut[0], begins[cut[0]], ends[cut[0]], shape)


passes.register(list(RESHAPES), reshape_on_base)
passes.register(["split", "SliceChannel"], split_on_base, when=_based)
passes.register("stack", stack_after_ones)
passes.register(["concat", "Concat"], concat_numbers)
passes.register("slice_axis", slice_on_base)
passes.register_indexing(index_on_base)
