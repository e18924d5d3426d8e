"""Arithmetic, indexing and fluent methods of LazyArray, recorded in a scope.

Each operation uses the same MXNet operator that ``NDArray`` itself would
(``x + y`` is ``broadcast_add``, ``x + 2`` is ``_plus_scalar``, ``-x`` is
``_mul_scalar(x, -1)``), so batched and eager runs compute the same thing.
Outside a scope LazyArray behaves exactly as NDArray.
"""
import operator

import numpy as np
import mxnet as mx
from mxnet import autograd, nd
from mxnet.base import MXNetError
from mxnet.ndarray import register as _register
from mxnet.ndarray.ndarray import indexing_key_expand_implicit_axes

from . import _core
from . import aliases
from . import context
from . import passes
from . import weights as weight_calls
from .context import current
from ..errors import BatchingError, describe_call
from .lazy import LazyArray
from .tasks import NUMBERS
from ..ir.graph import LEAF
from ..ir.known import exact_scalar
from ..ir.ops import op_handle, opdef

# name: (array op, scalar op with array on the left, scalar op with array on the right, python op)
_BINARY = {
    "add": ("broadcast_add", "_plus_scalar", None, operator.add),
    "subtract": ("broadcast_sub", "_minus_scalar", "_rminus_scalar", operator.sub),
    "multiply": ("broadcast_mul", "_mul_scalar", None, operator.mul),
    "divide": ("broadcast_div", "_div_scalar", "_rdiv_scalar", operator.truediv),
    "modulo": ("broadcast_mod", "_mod_scalar", "_rmod_scalar", operator.mod),
    "power": ("broadcast_power", "_power_scalar", "_rpower_scalar", operator.pow),
    "maximum": ("broadcast_maximum", "_maximum_scalar", None, max),
    "minimum": ("broadcast_minimum", "_minimum_scalar", None, min),
    "equal": ("broadcast_equal", "_equal_scalar", None, lambda a, b: int(a == b)),
    "not_equal": ("broadcast_not_equal", "_not_equal_scalar", None,
                  lambda a, b: int(a != b)),
    "greater": ("broadcast_greater", "_greater_scalar", "_lesser_scalar",
                lambda a, b: int(a > b)),
    "greater_equal": ("broadcast_greater_equal", "_greater_equal_scalar",
                      "_lesser_equal_scalar", lambda a, b: int(a >= b)),
    "lesser": ("broadcast_lesser", "_lesser_scalar", "_greater_scalar",
               lambda a, b: int(a < b)),
    "lesser_equal": ("broadcast_lesser_equal", "_lesser_equal_scalar",
                     "_greater_equal_scalar", lambda a, b: int(a <= b)),
}


def _make_binary(name):
    array_op, lscalar, rscalar, pyop = _BINARY[name]
    eager = getattr(nd, name)

    def binary(lhs, rhs):
        rec = current()
        if rec is None:
            return eager(lhs, rhs)
        lhs_arr, rhs_arr = isinstance(lhs, nd.NDArray), isinstance(rhs, nd.NDArray)
        if lhs_arr and rhs_arr:
            return rec.record(opdef(array_op), (lhs, rhs), {})
        if not isinstance(rhs if lhs_arr else lhs, NUMBERS):
            return eager(lhs, rhs)      # a list: eager MXNet's TypeError, reading nothing
        if lhs_arr:
            return rec.record(opdef("_internal", lscalar), (lhs, exact_scalar(rhs)), {})
        if rhs_arr:
            return rec.record(opdef("_internal", rscalar or lscalar), (rhs, exact_scalar(lhs)),
                              {})
        return pyop(lhs, rhs)
    binary.__name__ = name
    return binary


PYTHON_HELPERS = {name: _make_binary(name) for name in _BINARY}
PYTHON_HELPERS["true_divide"] = PYTHON_HELPERS["divide"]


def _dunder(name, reflected=False):
    """``x op y`` (or ``y op x``) on a LazyArray: inside a frame, with a number or
    another array, keyed as ``Frame.op`` keys it, on the compiled path
    (``_core.binary_method``); anything else through the helper."""
    array_op, lscalar, rscalar, _ = _BINARY[name]
    sop = opdef("_internal", (rscalar or lscalar) if reflected else lscalar)
    method = _core.binary_method(PYTHON_HELPERS[name], opdef(array_op), sop, reflected,
                                 context.TLS, _on_weights)
    method.__name__ = "__%s__" % name
    return method


def _on_weights(rec, frame, a, b):
    """Whether ``a op b`` reads weights only (``weight_calls.py``): then it takes
    the helper, whose ``F`` call records it once per graph."""
    if a._node is frame or not weight_calls.is_weight(rec, a):
        return False
    return not isinstance(b, nd.NDArray) or (
        getattr(b, "_node", None) is not frame and weight_calls.is_weight(rec, b))


def _in_place(name):
    """``x op= y`` on a LazyArray: what eager MXNet does.

    Under ``autograd.record()`` eager MXNet refuses to assign to an array
    that is part of a recorded graph, and so does a scope.  Otherwise the
    LazyArray object itself takes the new value, so every alias of it sees
    the change, as with an eager in-place update.
    """
    fn = PYTHON_HELPERS[name]
    eager = getattr(nd.NDArray, "__i%s__" % _IN_PLACE[name])

    def in_place(self, other):
        rec = current()
        given = written_array(rec, self) if rec is not None else None
        if rec is None or self._node is None and given is None:
            out = eager(self, other)
            if rec is not None:
                aliases.follow(rec, self)
            return out
        if given is not None:
            _write_given(rec, self, given, lambda array: eager(array, other))
            return self
        if autograd.is_recording() and getattr(self._node, "kind", None) != LEAF:
            # (a constant, ``F.zeros``, is in no graph: ``rebind`` says what to write)
            symbol = _SYMBOL[name]
            raise MXNetError(
                "%s: in-place update (%s=) under autograd.record() of a value the batching "
                "scope recorded: eager MXNet refuses it for a value in autograd's graph "
                "(computed from anything with a gradient, or from an array an earlier "
                "recorded call read), and a scope, which cannot tell all of those, refuses "
                "it always; write x = x %s y instead" % (
                    describe_call(rec.sample, rec.path), symbol, symbol))
        result = fn(self, other)
        rec.rebind(self, result)
        aliases.follow(rec, self)
        return self
    in_place.__name__ = "__i%s__" % _IN_PLACE[name]
    return in_place


_IN_PLACE = {"add": "add", "subtract": "sub", "multiply": "mul", "divide": "truediv",
             "modulo": "mod"}
_SYMBOL = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/", "modulo": "%"}
for _name, _dn in list(_IN_PLACE.items()) + [("power", "pow")]:
    setattr(LazyArray, "__%s__" % _dn, _dunder(_name))
    setattr(LazyArray, "__r%s__" % _dn, _dunder(_name, reflected=True))
    if _name in _IN_PLACE:      # NDArray has no __ipow__: ``x **= y`` rebinds x
        setattr(LazyArray, "__i%s__" % _dn, _in_place(_name))
for _dn, _name in [("eq", "equal"), ("ne", "not_equal"), ("gt", "greater"),
                   ("ge", "greater_equal"), ("lt", "lesser"), ("le", "lesser_equal")]:
    setattr(LazyArray, "__%s__" % _dn, _dunder(_name))


def _neg(self):
    """``-x``: ``x * -1.0``, as NDArray computes it (``_mul_scalar``)."""
    if current() is None:
        return nd.NDArray.__neg__(self)
    return LazyArray.__mul__(self, -1.0)


def _abs(self):
    return self.abs()


def written_array(rec, lazy):
    """The array from outside the scope that ``lazy`` stands for (a sample's input,
    ``Recorder.new_leaf``), where a sample's writes into ``lazy`` go, or None: a
    constant the scope shares between calls (``F.zeros``), a value of the graph,
    one copied to another device.  Raises BatchingError for an array with a
    gradient attached, or one other samples that have not finished were given."""
    given = getattr(lazy, "_given", None)
    if type(given) is not nd.NDArray or id(given) in rec.constant_ids:
        return None
    node = lazy._node
    if node is not None and (getattr(node, "kind", None) != LEAF or node.value is not given):
        return None
    where = describe_call(rec.sample, rec.path)
    if given.grad is not None:
        raise BatchingError(
            "%s: an in-place write into an array the sample was given that has a gradient "
            "attached (x.attach_grad()): the sample's later calls would read a copy, which "
            "takes no gradient; write into a copy (x = x.copy()) or write the array outside "
            "the scope" % where)
    if rec.given_to_others(given):
        raise BatchingError(
            "%s: an in-place write into an array other samples that have not finished were "
            "given too (or one sharing its memory): eager code ran each sample to its end "
            "before the next one started; give each sample an array of its own "
            "(x.copy()), or write the array outside the scope" % where)
    if node is not None and node.graph is not rec.graph:
        # A leaf of a graph a flush ran, which calls of this graph may read:
        # known as this graph's, so that they run before the write
        # (``Recorder.before_write``).
        rec.graph.leaf_by_id.setdefault(id(given), (node, lazy, given))
    return given


def _write_given(rec, lazy, given, write):
    """``write(array)`` on the array ``lazy`` stands for (what read it runs first,
    ``Recorder.before_write``), and on ``lazy``'s own values once computed
    (a copy out of the graph)."""
    write(given)
    if lazy._node is None:
        rec.before_write((lazy,))       # calls that read the copy run first
        copy_into(given, lazy)
    aliases.follow(rec, lazy)


_RAW_INVOKE = _register._imperative_invoke      # (before ``namespace.install``)
_COPYTO = op_handle("_copyto")


def copy_into(source, target):
    """``source``'s values written into ``target`` by MXNet itself: not recorded
    (by autograd either: the copy a flush made has autograd's history, which
    eager's array, written without it, has not), not a write the scope checks
    (``target`` is a sample's own copy of ``source``)."""
    with autograd.pause():
        _RAW_INVOKE(_COPYTO, [source], [], [], target, False, False)


def _setitem(self, key, value):
    """``x[key] = value``: eager MXNet's on a computed value, and on the array a
    sample was given (its caller's, written as eagerly: what read it before
    runs first, ``Recorder.before_write``); refused on a recorded one.

    A recorded value may be shared (``F.zeros`` gives every call of a graph
    the same constant) or not computed yet, so writing into it would change
    other samples' values or be lost; the error says what to write instead.
    """
    rec = current()
    given = written_array(rec, self) if rec is not None else None
    if rec is None or self._node is None and given is None:
        nd.NDArray.__setitem__(self, key, value)
        if rec is not None:
            aliases.follow(rec, self)
        return None
    if given is not None:
        _write_given(rec, self, given, lambda array: nd.NDArray.__setitem__(array, key, value))
        return None
    raise BatchingError(
        "%s: item assignment (x[...] = v) on a value recorded in a batching scope; "
        "build the value without assigning into it (F.one_hot, F.where, F.concat, or "
        "numpy and F.array)" % describe_call(rec.sample, rec.path))


LazyArray.__neg__ = _neg
LazyArray.__abs__ = _abs
LazyArray.__setitem__ = _setitem


def _fluent(name, op_name=None):
    op_path = (op_name or name,)
    base = getattr(nd.NDArray, name)

    def method(self, *args, **kwargs):
        rec = current()
        if rec is None:
            return base(self, *args, **kwargs)
        return rec.record(opdef(*op_path), (self,) + args, kwargs)
    method.__name__ = name
    return method


_FLUENT = """sum mean max min prod nansum nanprod norm argmax argmin transpose tanh sigmoid
relu exp expm1 log log1p log2 log10 sqrt rsqrt square abs sign clip softmax log_softmax
softmin slice_axis slice take pick one_hot zeros_like
ones_like tile repeat flip topk sort argsort swapaxes sin cos tan floor ceil round rint
fix trunc reciprocal reshape_like diag
arcsin arccos arctan sinh cosh degrees radians""".split()
for _name in _FLUENT:
    if hasattr(nd.NDArray, _name):
        setattr(LazyArray, _name, _fluent(_name))


def _through_f(name):
    """``x.<name>(...)`` as ``F.<name>(x, ...)``, where the recording ``F``
    rewrites the call (``split`` along rows)."""
    base = getattr(nd.NDArray, name)

    def method(self, *args, **kwargs):
        rec = current()
        if rec is None or kwargs.get("inplace"):
            # ``inplace=True``: NDArray's own code, a view by ``self.reshape``
            return base(self, *args, **kwargs)
        kwargs.pop("inplace", None)
        return getattr(rec.F, name)(self, *args, **kwargs)
    method.__name__ = name
    return method


LazyArray.split = _through_f("split")
LazyArray.transpose = _through_f("transpose")
for _name in ("expand_dims", "flatten", "squeeze"):       # reshapes.py sees through them
    setattr(LazyArray, _name, _through_f(_name))


def _reshape(self, *shape, **kwargs):
    rec = current()
    if rec is None:
        return nd.NDArray.reshape(self, *shape, **kwargs)
    if len(shape) == 1 and isinstance(shape[0], (list, tuple)):
        shape = tuple(shape[0])
    if not shape:
        shape = tuple(kwargs.pop("shape"))
    kwargs = dict(kwargs, shape=tuple(shape))
    return aliases.note(self, rec.F.reshape(self, **kwargs), ("reshape", kwargs))


def _astype(self, dtype, copy=True):
    rec = current()
    if rec is None:
        return nd.NDArray.astype(self, dtype, copy=copy)
    if not copy and np.dtype(dtype) == np.dtype(self.dtype):
        return self
    return rec.call_op(opdef("Cast"), (self,), {"dtype": np.dtype(dtype).name})


def _copy(self):
    rec = current()
    if rec is None:
        return nd.NDArray.copy(self)
    return rec.call_op(opdef("identity"), (self,), {})


def _detach(self):
    rec = current()
    if rec is None or not self.is_pending:      # computed: MXNet's own detach
        return nd.NDArray.detach(self)
    # pending: the same values, no gradient
    return aliases.note(self, rec.F.BlockGrad(self), ("detach", None))


def _copyto(self, other):
    rec = current()
    if rec is not None and self._h is None and type(other) is nd.NDArray:
        rec.before_write((other,))      # before ``self`` is read (``h.copyto(self.memory)``)
    if rec is None or self._h is not None or not isinstance(other, mx.Context) \
            or other != self.context:
        return nd.NDArray.copyto(self, other)
    return _copy(self)


def _T(self):  # pylint: disable=invalid-name
    rec = current()
    if rec is None:
        return nd.NDArray.T.fget(self)
    return rec.F.transpose(self)


LazyArray.reshape = _reshape
LazyArray.astype = _astype
LazyArray.copy = _copy
LazyArray.detach = _detach
LazyArray.copyto = _copyto
LazyArray.T = property(_T)


def _one_step(part, size):
    """A slice with a step (``x[::-1]``) that takes one element, as the slice of
    that element: on a one-word sentence NDArray's own indexing makes it a
    view, which reads the value."""
    if isinstance(part, slice) and part.step not in (None, 1):
        taken = range(*part.indices(size))
        if len(taken) == 1:
            return slice(taken[0], taken[0] + 1)
    return part


_INDEX_TYPES = frozenset([int, np.int64, np.int32, np.int16, np.int8, np.uint8, np.uint16,
                          np.uint32, np.uint64])


def _with_new_axes(x, parts):
    """``x[parts]`` for parts of slices, ``None`` (new axes) and one ``Ellipsis``:
    the slices' value reshaped with the new axes, as eager's view of ``x``
    (NDArray's own indexing computed such a value, a copy); None for other keys."""
    if not any(p is None or p is Ellipsis for p in parts) \
            or not all(p is None or p is Ellipsis or type(p) is slice for p in parts) \
            or sum(p is Ellipsis for p in parts) > 1:
        return None
    shape = x.shape
    slices = sum(type(p) is slice for p in parts)
    if slices > len(shape):
        return None
    expanded = []
    for part in parts:
        expanded.extend([slice(None)] * (len(shape) - slices) if part is Ellipsis else [part])
    inner = tuple(p for p in expanded if p is not None)
    out = _getitem_value(x, inner) if inner else x
    dims = iter(out.shape)
    new_shape = [1 if p is None else next(dims) for p in expanded] + list(dims)
    return current().F.reshape(out, shape=tuple(new_shape))


def _getitem(self, key):
    rec = current()
    if rec is None:
        return nd.NDArray.__getitem__(self, key)
    return aliases.note(self, _getitem_value(self, key), ("index", key))


def _getitem_value(self, key):
    """``self[key]`` inside a scope (``_getitem``, which keeps it as a view)."""
    rec = current()
    if type(key) is tuple or key is None or key is Ellipsis:
        found = _with_new_axes(self, key if type(key) is tuple else (key,))
        if found is not None:
            return found
    if type(key) is slice and key.step is None and type(key.start) is int \
            and type(key.stop) is int:
        # x[i:j], rows of a table: the common case, straight to the recorder.
        shape = self.shape
        if 0 <= key.start < key.stop <= shape[0] and (key.start, key.stop) != (0, shape[0]):
            if self._base is not None:         # rows of the base, if just as cheap
                found = _indexed(rec, self, [key.start], [key.stop],
                                 (key.stop - key.start,) + shape[1:], True)
                if found is not None:
                    return found
            return rec.row_slice(self, key.start, key.stop)
    if type(key) in _INDEX_TYPES and self._base is None:
        # x[i], a word's vector of a table (DyNet's ``E[w]``): its row, reshaped
        # to the row's own shape (what the general path below makes of it).
        shape = self.shape
        if shape:
            row = int(key) + shape[0] if key < 0 else int(key)
            if 0 <= row < shape[0]:
                out = self if shape[0] == 1 else _weight_rows(rec, self, row, row + 1)
                return rec.F.reshape(out, shape=shape[1:] or (1,))
    parts = key if isinstance(key, tuple) else (key,)
    shape = self.shape
    parts = tuple(_one_step(p, shape[axis]) if axis < len(shape) else p
                  for axis, p in enumerate(parts))
    if len(parts) > len(shape) or not all(
            isinstance(p, (int, np.integer)) or (isinstance(p, slice) and p.step in (None, 1))
            for p in parts):
        if any(isinstance(p, nd.NDArray) for p in parts):
            return _advanced_getitem(rec, self, key)
        # Steps, lists as indices: NDArray's own indexing, whose operators
        # (``crop`` with steps) are recorded where they are recordable.
        return rec.wrap_inputs(nd.NDArray.__getitem__(self, key))
    begins, ends, drop = [], [], []
    for axis, part in enumerate(parts):
        size = shape[axis]
        if isinstance(part, slice):
            start, stop, _ = part.indices(size)
        else:
            start = int(part) + size if part < 0 else int(part)
            if not 0 <= start < size:
                raise IndexError("%s: index %d is out of bounds for axis %d with size %d"
                                 % (describe_call(rec.sample, rec.path), part, axis, size))
            stop = start + 1
            drop.append(axis)
        if stop <= start:
            raise IndexError("%s: empty slice %r of axis %d (size %d) inside a batching "
                             "scope" % (describe_call(rec.sample, rec.path), part, axis, size))
        begins.append(start)
        ends.append(stop)
    new_shape = tuple(e - b for a, (b, e) in enumerate(zip(begins, ends))
                      if a not in drop) + tuple(shape[len(parts):])
    if self._base is not None:
        found = _indexed(rec, self, begins, ends, new_shape or (1,), False)
        if found is not None:
            return found
    out = self
    if (begins[0], ends[0]) != (0, shape[0]):
        out = _weight_rows(rec, out, begins[0], ends[0])
    rest = [(b, e) if (b, e) != (0, shape[a + 1]) else (None, None)
            for a, (b, e) in enumerate(zip(begins[1:], ends[1:]))]
    cut = [a for a, (b, _) in enumerate(rest, 1) if b is not None]
    if len(cut) == 1 and passes.SLICES and _frame_reads(rec, out):
        found = passes.sliced(rec, out, cut[0], begins[cut[0]], ends[cut[0]])
        if found is not None:
            out, rest = found, ()
    if any(b is not None for b, _ in rest):
        out = rec.call_op(opdef("slice"), (out,), {
            "begin": (None,) + tuple(b for b, _ in rest),
            "end": (None,) + tuple(e for _, e in rest)})
    if drop:
        out = rec.F.reshape(out, shape=new_shape or (1,))
    return out


def _frame_reads(rec, x):
    """Whether ``x`` is a value of the recording frame or an array it reads
    from outside (not a value of an enclosing call)."""
    frame = rec.frame
    if frame is None:
        return False
    node = x._node
    return node is frame or not isinstance(node, _core.FrameCore)


def _weight_rows(rec, x, begin, end):
    """Rows ``begin:end`` of ``x``; of a weight inside a frame, by a pass of
    ``passes.SLICES`` where one applies (positions of a sample's own)."""
    if passes.SLICES and rec.frame is not None and weight_calls.is_weight(rec, x):
        found = passes.sliced(rec, x, 0, begin, end)
        if found is not None:
            return found
    return rec.row_slice(x, begin, end)


def _advanced_getitem(rec, x, key):
    """``x[key]`` with arrays among the indices: ``gather_nd`` of the indices
    stacked, as NDArray's own advanced indexing computes it.

    NDArray's code builds the index arrays with recorded operators, then
    stacks them only if each is exactly an ``NDArray`` (a LazyArray is a
    subclass): here they are stacked in any case.
    """
    key, _ = indexing_key_expand_implicit_axes(key, x.shape)
    indices, new_axes = x._get_index_nd(key)  # pylint: disable=protected-access
    if not isinstance(indices, nd.NDArray):
        indices = rec.F.stack(*indices)
    # No gradient flows into indices; a zero one into the batched plan's
    # gathers of them crashes MXNet 1.9's backward (``ir.rules.NO_GRADIENT``).
    out = rec.F.gather_nd(x, rec.F.BlockGrad(indices))
    if new_axes:                        # ``None`` entries of the key
        shape = list(out.shape)
        for axis in new_axes:
            shape.insert(axis, 1)
        out = rec.F.reshape(out, shape=tuple(shape))
    return out


def _indexed(rec, x, begins, ends, shape, whole_rows):
    """``x[...]`` of a reshaped value by a pass of ``passes.INDEXING``, or None."""
    if rec.faithful():
        return None
    for fn in passes.INDEXING:
        found = fn(rec, x, begins, ends, shape, whole_rows)
        if found is not None:
            return passes.checked_index(rec, fn, x, shape, found)
    return None


LazyArray.__getitem__ = _core.getitem_method(_getitem, aliases.note)


_PLAIN_GETITEM = nd.NDArray.__getitem__
_PLAIN_SETITEM = nd.NDArray.__setitem__


def _holds_lazy(key):
    """Whether tuple index ``key`` holds a LazyArray (or a waiting sample's
    result, ``tasks.Pending``)."""
    return any(isinstance(part, LazyArray) for part in key)


def _computed_key(key):
    """``key`` with each LazyArray computed and given as a plain NDArray (NDArray's
    advanced indexing takes index arrays of exactly that type)."""
    def plain(part):
        return nd.NDArray.detach(part) if isinstance(part, LazyArray) else part
    return tuple(plain(part) for part in key) if type(key) is tuple else plain(key)


def _plain_getitem(self, key):
    """NDArray's ``x[key]`` for arrays that are not LazyArrays: indexed by a value
    recorded in a scope (``table[F.array([i])]``, a buffer or a table the model
    holds), recorded as ``gather_nd`` as on a recorded value; such an index
    outside a scope is given to MXNet as a plain NDArray."""
    if isinstance(key, LazyArray) or type(key) is tuple and _holds_lazy(key):
        rec = current()
        if rec is not None:
            return _advanced_getitem(rec, self, key)
        key = _computed_key(key)
    return _PLAIN_GETITEM(self, key)


def _plain_setitem(self, key, value):
    """NDArray's ``x[key] = value`` for arrays that are not LazyArrays: an index
    recorded in a scope (``mask[0, F.argmax(h, axis=1)] = 1``) is computed first
    (inside a sample, a read: the sample waits), as eager writes the array now."""
    if isinstance(key, LazyArray) or type(key) is tuple and _holds_lazy(key):
        key = _computed_key(key)
    return _PLAIN_SETITEM(self, key, value)


def install():
    """Index plain arrays by recorded values (``_plain_getitem``, ``_plain_setitem``)."""
    nd.NDArray.__getitem__ = _plain_getitem
    nd.NDArray.__setitem__ = _plain_setitem
aliases.GETITEM[0] = _getitem_value
