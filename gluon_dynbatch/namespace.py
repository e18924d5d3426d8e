"""The recording ``F``: what ``hybrid_forward`` gets as ``F`` inside a scope.

It looks like ``mx.nd``: each operator records a call instead of running
(into the frame recording now, else into the graph); row slices and row
concatenations take the recorder's short paths (a stack along axis 0 is one
of those and a reshape); deterministic creation
functions (``F.zeros``) give constants, one per graph and arguments; other
Python helpers of ``mx.nd`` run on concrete values.  Operators of ``mx.nd``
called directly on pending values (as Gluon's ``unroll`` does) are recorded
too.
"""
import ctypes
import inspect

import mxnet as mx
import numpy as np
from mxnet.base import _LIB, OpHandle, c_str, check_call, py_str
from mxnet.ndarray import NDArray
from mxnet.ndarray import register as _register

from . import columns, context, lazy_ops, literals, reshapes, weight_calls
from .lazy import LazyArray
from .ops import opdef
from .rules import RULES

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
        elif _generated(target):
            op = opdef(*_canonical(path))
            if path == ("contrib", "arange_like"):
                value = _arange_like(rec, _operator(rec, op))
            elif path == ("slice_axis",):
                value = _slice_axis(self, op)
            elif path in (("concat",), ("Concat",)):
                value = _concat(rec, op)
            elif path == ("stack",):
                value = _stack(self, _operator(rec, op))
            elif path == ("dot",):
                value = _dot(self, _operator(rec, op))
            elif path == ("take",):
                value = _take(self, _operator(rec, op))
            elif path in (("split",), ("SliceChannel",)):
                value = _split(self, _operator(rec, op))
            elif path == ("transpose",):
                value = _transpose(self, _operator(rec, op))
            elif path in (("swapaxes",), ("SwapAxis",)):
                value = _swapaxes(self, _operator(rec, op), op)
            elif path == ("LeakyReLU",):
                value = _leaky_relu(self, _operator(rec, op))
            elif len(path) == 1 and op.name in reshapes.RESHAPES:
                value = reshapes.reshaped(self, rec, _operator(rec, op), op)
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
    arrays = op.arrays if op.arrays is not None else 1 << 30

    def operator(*args, **kwargs):
        if len(args) > arrays:              # attributes given by position
            args, kwargs = op.named(args, kwargs)
        if args and type(args[0]) is LazyArray and args[0]._base is not None:
            return columns.record(rec, op, args, kwargs)
        frame = rec.frame
        if frame is not None and rec._mode_seen == modes[0]:  # pylint: disable=W0212
            return frame.op(op, args, kwargs)
        return rec.call_op(op, args, kwargs)
    return operator


def _slice_axis(ns, op):
    """``F.slice_axis``: rows of one array take the recorder's row-slice path;
    a slice of a reshaped value may be rows of its base (``reshapes.py``)."""
    modes = context.MODE_CHANGES
    rec = ns._recorder  # pylint: disable=protected-access

    def slice_axis(*args, **kwargs):
        if len(args) > 1:                   # attributes given by position
            args, kwargs = op.named(args, kwargs)
        axis = kwargs.get("axis")
        if type(axis) is int and axis != 0:     # columns: an operator like any other
            if len(args) == 1 and type(args[0]) is LazyArray and args[0]._base is not None:
                found = _base_slice(ns, args, kwargs)
                if found is not None:
                    return found
            frame = rec.frame
            if frame is not None and rec._mode_seen == modes[0]:  # pylint: disable=W0212
                return frame.op(op, args, kwargs)
        elif len(args) == 1 and len(kwargs) == 3 and axis == 0 \
                and "begin" in kwargs and "end" in kwargs and isinstance(args[0], NDArray):
            return rec.row_slice(args[0], kwargs["begin"], kwargs["end"])
        return rec.call_op(op, args, kwargs)
    return slice_axis


def _base_slice(ns, args, kwargs):
    """``F.slice_axis`` of a reshaped value along an axis after ones, as rows
    of its base, or None."""
    if set(kwargs) != {"axis", "begin", "end"}:
        return None
    shape = args[0].shape
    axis, begin, end = kwargs["axis"], kwargs["begin"], kwargs["end"]
    if not -len(shape) <= axis < len(shape) or not (end is None or type(end) is int) \
            or type(begin) is not int:
        return None
    axis %= len(shape)
    begin, end, _ = slice(begin, end).indices(shape[axis])
    if end <= begin:
        return None
    out = shape[:axis] + (end - begin,) + shape[axis + 1:]
    return reshapes.part(ns, args[0], axis, begin, end, out)


def _concat(rec, op):
    """``F.concat``: stacking rows (``dim=0``) takes the recorder's short path."""
    def concat(*args, **kwargs):
        if kwargs.get("dim", 1) != 0 and args and type(args[0]) is LazyArray \
                and args[0]._node is not None and args[0].size == 1:
            found = reshapes.concat(rec.F, args, kwargs.get("dim", 1))   # scores in a row
            if found is not None:
                return found
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
        elif set(kwargs) <= {"axis", "num_args"} \
                and kwargs.get("num_args", len(args)) == len(args):
            found = reshapes.stack(ns, args, kwargs.get("axis", 0))
            if found is not None:
                return found
        return operator(*args, **kwargs)
    return stack


def _one_call(ns, function, *args):
    """``function(ns, *args)``, its operators recorded as parts of one call of
    the frame: ``sites.py`` then sees one call at the user's line, not a loop
    going round (several calls at one offset)."""
    frame = ns._recorder.frame  # pylint: disable=protected-access
    if frame is None or frame.call_start is not None:
        return function(ns, *args)
    frame.call_start = len(frame.out_shapes)
    try:
        return function(ns, *args)
    finally:
        frame.call_start = None


def _split(ns, operator):
    """``F.split`` of a pending value along axis 0: row slices, which are views;
    of a reshaped value, rows of its base (``reshapes.split``).

    ``F.split(gates, num_outputs=4, axis=0)`` of a 1-d vector, or a sentence's
    (T, E) matrix split into tokens, would otherwise run once per sample: its
    outputs are not the rows of its input.
    """
    def split(*args, **kwargs):
        if len(args) == 1 and type(args[0]) is LazyArray and args[0]._base is not None \
                and set(kwargs) <= {"num_outputs", "axis", "squeeze_axis"}:
            found = _one_call(ns, reshapes.split, args[0], kwargs.get("axis", 1),
                              kwargs.get("num_outputs"), bool(kwargs.get("squeeze_axis")))
            if found is not None:
                return found if len(found) > 1 else found[0]
        parts = _row_parts(args, kwargs)
        if parts is None:
            return operator(*args, **kwargs)
        return _one_call(ns, _split_rows, *parts)
    return split


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


def _transpose(ns, operator):
    """``F.transpose`` that only moves axes of size 1 (a pending row or column,
    ``(1, C)`` or ``(C, 1)``), recorded as a reshape (see ``_unit_move``).

    A reshape batches row by row; a transpose moves each sample's rows, so it
    runs per sample and keeps the calls around it out of programs (a CRF's
    ``F.broadcast_add(F.transpose(alpha), transitions)``).
    """
    def transpose(*args, **kwargs):
        if len(args) == 1 and type(args[0]) is LazyArray and set(kwargs) <= {"axes"}:
            ndim = len(args[0].shape)
            axes = kwargs.get("axes") or tuple(reversed(range(ndim)))
            if all(type(a) is int for a in axes) \
                    and sorted(a % ndim for a in axes) == list(range(ndim)):
                found = _unit_move(ns, args[0], [a % ndim for a in axes])
                if found is not None:
                    return found
        return operator(*args, **kwargs)
    return transpose


def _swapaxes(ns, operator, op):
    """``F.swapaxes`` that only moves axes of size 1 (Gluon's batch-first RNN
    layers turn (1, T, C) into (T, 1, C) and back): a reshape (``_unit_move``)."""
    def swapaxes(*args, **kwargs):
        if len(args) > 1:
            args, kwargs = op.named(args, kwargs)
        if len(args) == 1 and type(args[0]) is LazyArray and set(kwargs) <= {"dim1", "dim2"}:
            ndim = len(args[0].shape)
            dims = [kwargs.get("dim1", 0), kwargs.get("dim2", 0)]
            if all(type(d) is int and -ndim <= d < ndim for d in dims):
                perm = list(range(ndim))
                a, b = dims[0] % ndim, dims[1] % ndim
                perm[a], perm[b] = perm[b], perm[a]
                found = _unit_move(ns, args[0], perm)
                if found is not None:
                    return found
        return operator(*args, **kwargs)
    return swapaxes


def _unit_move(ns, x, perm):
    """``x`` with its axes permuted (output axis i is input axis ``perm[i]``) as a
    reshape when only axes of size 1 move (the data keeps its order), else None.
    ``reshapes.py`` sees through the reshape."""
    shape = x.shape
    moved = [axis for axis in perm if shape[axis] != 1]
    if moved != sorted(moved):
        return None
    return ns.reshape(x, shape=tuple(shape[axis] for axis in perm))


def _leaky_relu(ns, operator):
    """``F.LeakyReLU(x, gamma, act_type="prelu")`` (``nn.PReLU``) recorded as
    ``relu(x) + gamma * (x - relu(x))``: the same values and gradients.

    MXNet 1.9.1 loses part of ``gamma``'s gradient when a prelu runs inside a
    CachedOp (two of them in one graph, or one beside another input), and
    programs and compiled plans are CachedOps.
    """
    def leaky_relu(*args, **kwargs):
        if kwargs.get("act_type") == "prelu" and len(args) <= 2 \
                and set(kwargs) <= {"data", "gamma", "act_type", "name"}:
            named = dict(zip(("data", "gamma"), args), **kwargs)
            data, gamma = named.get("data"), named.get("gamma")
            if isinstance(data, NDArray) and isinstance(gamma, NDArray) \
                    and len(data.shape) >= 2 and len(gamma.shape) == 1:
                return _one_call(ns, _prelu, data, gamma)
        return operator(*args, **kwargs)
    return leaky_relu


def _prelu(ns, data, gamma):
    # gamma runs along axis 1 (channels), as MXNet's prelu broadcasts it.
    gamma = ns.reshape(gamma, shape=(1, -1) + (1,) * (len(data.shape) - 2))
    positive = ns.relu(data)
    return positive + ns.broadcast_mul(gamma, data - positive)


def _take(ns, operator):
    """``F.take`` of a pending value by a literal index vector: runs of its rows
    (``literals.take_rows``), which batch across samples as views."""
    def take(*args, **kwargs):
        if len(args) == 2:
            found = _one_call(ns, literals.take_rows, args[0], args[1], kwargs)
            if found is not None:
                return found
        return operator(*args, **kwargs)
    return take


def _dot(ns, operator):
    """``F.dot`` of a matrix and a pending 1-d vector (DyNet's ``W * x``).

    A vector's rows are its elements, so the product does not batch along
    axis 0 as it is.  Of a weight ``W`` (a parameter or a value of weights
    alone), ``dot(W, x)`` is recorded as ``FullyConnected(x, W, flatten=False)``
    and ``dot(x, W)`` as it is; a batch of either is one product of the vectors
    as rows (``layer_rules.VectorProductRule``).  Of another matrix it is
    recorded as the same product of the vector as one row, between two
    reshapes: ``dot(x, M)`` as ``dot(x.reshape((1, -1)), M)``, ``dot(M, x)`` as
    ``dot(x.reshape((1, -1)), M, transpose_b=True)``.  Attention scores of a
    query row against a sample's own rows are recorded in column form
    (``columns.scores``).
    """
    rec = ns._recorder  # pylint: disable=protected-access

    def dot(*args, **kwargs):
        if len(args) == 2 and set(kwargs) <= {"transpose_a", "transpose_b"}:
            a, b = args
            ta, tb = bool(kwargs.get("transpose_a")), bool(kwargs.get("transpose_b"))
            if _vector(a) and _matrix(b) and not ta:
                return _one_call(ns, _as_row_product, operator, a, b, tb)
            if _vector(b) and _matrix(a) and not tb:
                return _one_call(ns, _as_row_product, operator, b, a, not ta)
            if not ta:          # attention scores in column form
                found = _one_call(ns, columns.scores, rec, a, b, tb)
                if found is not None:
                    return found
        return operator(*args, **kwargs)
    return dot


def _vector(x):
    return type(x) is LazyArray and len(x.shape) == 1


def _matrix(x):
    return isinstance(x, NDArray) and len(x.shape) == 2


def _as_row_product(ns, operator, vector, matrix, transpose):
    if weight_calls.is_weight(ns._recorder, matrix):  # pylint: disable=protected-access
        # One call on the vector: a batch of them is one product of the
        # vectors as rows (``layer_rules.VectorProductRule``).
        if transpose:
            return ns.FullyConnected(vector, matrix, no_bias=True, num_hidden=matrix.shape[0],
                                     flatten=False)
        return operator(vector, matrix)
    row = ns.reshape(vector, shape=(1, -1))
    out = operator(row, matrix, transpose_b=transpose)
    return ns.reshape(out, shape=(-1,))


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


def _generated(fn):
    """Whether ``fn`` is an operator function MXNet generated (``F.sum``,
    ``F.linalg.gemm2``, ``F.contrib.arange_like``), not a Python helper of
    ``mx.nd`` (``F.contrib.foreach``, ``F.random.normal``)."""
    module = getattr(fn, "__module__", None)
    if module == "ndarray":
        return True
    code = getattr(fn, "__code__", None)
    return code is not None and code.co_filename == "<string>" and module in _SUBMODULES


# Namespaces of generated operators recorded as operators (sparse storage and
# random draws keep running as MXNet runs them).
_SUBMODULES = frozenset("mxnet.ndarray." + name for name in ("contrib", "linalg", "image", "op"))


def _arange_like(rec, operator):
    """``F.contrib.arange_like``: values that depend on the input's shape alone, a
    literal (``literals.py``) when they are whole numbers (exact in any dtype)."""
    def arange_like(data, start=0.0, step=1.0, repeat=1, ctx=None, axis=None, **kwargs):
        shape = data.shape
        if kwargs or ctx is not None or not shape or repeat < 1 \
                or float(start) != int(start) or float(step) != int(step) \
                or not (axis is None or -len(shape) <= axis < len(shape)):
            return operator(data, start=start, step=step, repeat=repeat, ctx=ctx, axis=axis,
                            **kwargs)
        count = int(np.prod(shape)) if axis is None else shape[axis]
        values = start + step * (np.arange(count) // repeat)
        values = values.astype(data.dtype).reshape(shape if axis is None else (count,))
        return literals.record(rec, values) if count else operator(data, axis=axis)
    return arange_like


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


# -- direct calls of ``mx.nd`` operators ---------------------------------------
# Gluon's own helpers call ``mx.nd`` on what they are given instead of going
# through ``F``: ``RecurrentCell.unroll`` splits its input with ``ndarray.split``
# and stacks the outputs with ``ndarray.stack``.  Every generated ``mx.nd``
# operator function ends in ``register._imperative_invoke`` (a global of that
# module), so a call whose arrays are still pending is recorded there instead
# of reading them (which would run everything pending and stop batching).

_INVOKE = _register._imperative_invoke
_BY_HANDLE = {}         # operator handle -> (OpDef, arrays it takes) or None


def _operator_names():
    """Every operator handle (as the int the generated functions pass) -> its
    names (an operator has aliases: ``SequenceMask`` is ``_npx_sequence_mask``)."""
    size, names = ctypes.c_uint(), ctypes.POINTER(ctypes.c_char_p)()
    check_call(_LIB.MXListAllOpNames(ctypes.byref(size), ctypes.byref(names)))
    found = {}
    for i in range(size.value):
        name = py_str(names[i])
        handle = OpHandle()
        check_call(_LIB.NNGetOpHandle(c_str(name), ctypes.byref(handle)))
        found.setdefault(handle.value, []).append(name)
    return found


def _direct_op(handle):
    """(OpDef, number of array arguments or None if variadic) of an operator
    handle, or None when the operator is not reachable as ``mx.nd.<name>`` or
    ``mx.nd._internal.<name>`` (and ``mx.sym``'s)."""
    found = _BY_HANDLE.get(handle, _UNKNOWN)
    if found is _UNKNOWN:
        if not _NAMES:
            _NAMES.update(_operator_names())
        found = None
        # Names with a batching rule first (``sum``, not its alias ``sum_axis``).
        for name in sorted(_NAMES.get(handle, ()), key=lambda n: n not in RULES):
            found = _resolve_direct(name)
            if found is not None:
                break
        _BY_HANDLE[handle] = found
    return found


def _canonical(path):
    """The path of an alias of operator ``path`` that has a batching rule
    (``F.sum_axis`` is ``sum``, ``F.broadcast_axes`` is ``broadcast_axis``), else
    ``path`` itself."""
    if path[-1] in RULES:
        return path
    handle = OpHandle()
    try:
        check_call(_LIB.NNGetOpHandle(c_str(path[-1]), ctypes.byref(handle)))
    except Exception:  # pylint: disable=broad-except  (no operator of that name)
        return path
    if not _NAMES:
        _NAMES.update(_operator_names())
    for alias in _NAMES.get(handle.value, ()):
        if alias in RULES:
            for found in ((alias,), ("_internal", alias)):
                try:
                    opdef(*found)
                    return found
                except AttributeError:
                    continue
    return path


_NAMES = {}             # operator handle -> its names, read once
_UNKNOWN = object()


def _resolve_direct(name):
    for path in ((name,), ("_internal", name)):
        try:
            op = opdef(*path)
        except AttributeError:
            continue
        code = getattr(op.nd_fn, "__code__", None)
        if code is None or code.co_filename != "<string>":
            continue                    # a Python helper of that name, not the operator
        params = inspect.signature(op.nd_fn).parameters.values()
        if any(p.kind is p.VAR_POSITIONAL for p in params):
            return op, None
        return op, sum(1 for p in params if p.default is None and p.name not in ("out", "name"))
    return None


# Operators the recording ``F`` rewrites, for direct ``mx.nd`` calls too.
_REWRITTEN = frozenset(["split", "SliceChannel", "stack", "slice_axis", "concat",
                        "Concat", "dot", "transpose", "swapaxes", "SwapAxis",
                        "LeakyReLU"]) | reshapes.RESHAPES


def _recording_invoke(handle, ndargs, keys, vals, out, is_np_op, output_is_list):
    """``_imperative_invoke`` that records calls on pending LazyArrays in a scope."""
    rec = context.TLS.recorder
    if rec is not None and out is None and not is_np_op and not rec.eager \
            and any(type(a) is LazyArray and a._h is None for a in ndargs):
        found = _direct_op(handle)
        # Arrays go by position, for MXNet as for the replay: a call that left
        # optional arrays out (``bias``, ``length``) passes the ones before them.
        if found is not None and (found[1] is None or found[1] >= len(ndargs)):
            kwargs = dict(zip(keys, vals))
            if found[0].path[-1] in _REWRITTEN:
                # Gluon's ``unroll`` splits and stacks with ``mx.nd`` itself.
                result = getattr(rec.F, found[0].path[-1])(*ndargs, **kwargs)
            else:
                result = columns.record(rec, found[0], tuple(ndargs), kwargs)
            if output_is_list and not isinstance(result, list):
                result = [result]
            return result
    return _INVOKE(handle, ndargs, keys, vals, out, is_np_op, output_is_list)


_register._imperative_invoke = _recording_invoke
