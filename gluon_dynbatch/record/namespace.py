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
import contextlib
import ctypes
import inspect

import mxnet as mx
import numpy as np
from mxnet import gluon
from mxnet.base import _LIB, MXNetError, OpHandle, c_str, check_call, py_str
from mxnet._ctypes import ndarray as _ctypes_ndarray
from mxnet.ndarray import register as _register

from . import aliases
from . import dispatch
from . import context
from . import arithmetic
from . import literals
from . import passes
from ._core import Operator
from .lazy import LazyArray, constants_if_freed
from ..errors import BatchingError, describe_call
from ..ir import known
from ..ir.ops import op_handle, opdef
from ..ir.rules import RULES

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
        rec = self._recorder
        if rec.closed:
            return _after_close(self._module, self._path, name)
        target = getattr(self._module, name)
        path = self._path + (name,)
        if not callable(target):
            if hasattr(target, "__dict__") and type(target).__name__ == "module":
                value = RecordingNamespace(rec, target, path)
            else:
                value = target
        elif _generated(target):
            value = _operator(rec, opdef(*_canonical(path)), name)
        else:
            value = _python_function(rec, target, path)
        self.__dict__[name] = value      # later lookups skip __getattr__
        return value

    def __eq__(self, other):
        # ``F == nd`` (gluonnlp's AWDRNN picks its begin states so): the
        # recording F stands for ``mx.nd``, values with shapes known.
        return other is self or other is self._module

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = object.__hash__


_OWN = frozenset(["_recorder", "_module", "_path"])


def forget(namespace):
    """Drop what ``namespace`` looked up (its scope has ended): later lookups
    go to ``_after_close``."""
    for name in [k for k in namespace.__dict__ if k not in _OWN]:
        value = namespace.__dict__.pop(name)
        if isinstance(value, RecordingNamespace):
            forget(value)


def _after_close(module, path, name):
    """``F.<path>.<name>`` of a scope that has ended (a closure or generator of a
    sample's code called later): the recording one of the scope open now, if
    any, else ``mx.nd``'s."""
    current = context.current()
    target = current.F if current is not None else None
    if target is None:
        return getattr(module, name)
    for part in path:
        target = getattr(target, part)
    return getattr(target, name)


def _operator(rec, op, name):
    """``F.<op>``: the call as written goes to the recorder (``Recorder.record``),
    or, on the compiled path, straight to the frame recording now (``_core.Operator``)."""
    return Operator(rec, op, name, passes.applies(op.name))


_IDENTITY, _CAST = opdef("identity"), opdef("cast")


def _array(rec, fn):
    """``F.array``: lists of Python numbers become rows of one pooled leaf
    (``literals.py``); a recorded value, a recorded copy (autograd records
    eager's copy: the gradient flows through it)."""
    def array(source_array, ctx=None, dtype=None):
        if isinstance(source_array, LazyArray) and (ctx is None or ctx == rec.ctx):
            out = rec.record(_IDENTITY, (source_array,), {})
            if dtype is not None and np.dtype(dtype) != np.dtype(out.dtype):
                out = rec.record(_CAST, (out,), {"dtype": np.dtype(dtype).name})
            return out
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


def _python_function(rec, fn, path):
    """``F.<f>`` for a Python-level helper of mx.nd (not an operator)."""
    special = arithmetic.PYTHON_HELPERS.get(path[-1])
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
                if type(found) is LazyArray and found._node is not None:
                    known[key] = found._node
                return found
            # Each call a LazyArray of its own (``Recorder._constant_leaf``).
            own = LazyArray(found, 0)
            rec.graph.held.append(own)
            return own
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


_RESET_ARRAYS = op_handle("reset_arrays")
"""The operator writing its inputs in place, without ``out`` (``zero_grad``)."""


def _recording_invoke(handle, ndargs, keys, vals, out, is_np_op, output_is_list):
    """``_imperative_invoke`` that records calls on pending LazyArrays in a scope."""
    rec = context.TLS.recorder
    if rec is not None and out is None and getattr(handle, "value", handle) == _RESET_ARRAYS:
        # ``reset_arrays`` (``zero_grad``) writes its inputs: gradients
        rec.before_write(ndargs, gradients=True)
    if out is not None:                 # written in place: no longer rows of a flush's output
        outs = out if isinstance(out, (list, tuple)) else (out,)
        context.note_written(outs)
        if rec is not None:
            rec.before_write(outs)
        for array in outs:
            if type(array) is LazyArray and array._rows is not None:
                array.handle  # pylint: disable=pointless-statement  (cut out first)
                array._rows = None  # pylint: disable=protected-access
    if rec is not None and out is None and not is_np_op and not rec.eager \
            and any(type(a) is LazyArray and a.is_pending for a in ndargs):
        found = _direct_op(handle)
        # Arrays go by position, for MXNet as for the replay: a call that left
        # optional arrays out (``bias``, ``length``) passes the ones before them.
        if found is not None and (found[1] is None or found[1] >= len(ndargs)):
            result = rec.record(found[0], tuple(ndargs), dict(zip(keys, vals)))
            if output_is_list and not isinstance(result, list):
                result = [result]
            return result
    if any(type(a) is LazyArray for a in ndargs):
        ndargs = constants_if_freed(ndargs)
    given = _given_outputs(rec, out) if out is not None and rec is not None else None
    if given is not None:
        # The array a sample was given, written through ``out=`` (``copyto``):
        # the caller's array, as eagerly, then the sample's own copy of it.
        rec.before_write(tuple(array for _, array in given[1]))
        result = _INVOKE(handle, ndargs, keys, vals, given[0], is_np_op, output_is_list)
        for lazy, array in given[1]:
            if lazy._node is None:
                rec.before_write((lazy,))   # calls that read the copy run first
                arithmetic.copy_into(array, lazy)
        return result
    try:
        result = _INVOKE(handle, ndargs, keys, vals, out, is_np_op, output_is_list)
    except MXNetError as err:
        if out is not None and rec is not None and _IN_PLACE in str(err):
            raise BatchingError(
                "%s: an in-place write (x[...] = v, out=) of a value with autograd history "
                "while autograd records, which MXNet refuses; values a batching scope "
                "computed have that history even where eager's have none (a constant, "
                "v.detach()). Write under autograd.pause() (where eager's value takes no "
                "gradient, the result is the same), or build the array without writing "
                "into it (F.concat, F.where)" % describe_call(rec.sample, rec.path)) from err
        if out is None or rec is None or _IN_GRAPH not in str(err):
            raise
        raise BatchingError(
            "%s: out= writes into an array autograd records a computation of (a value the "
            "scope computed, or a view of an array made in the sample, which a batching "
            "scope computes as a row of its graph); write into an array of the sample's own "
            "(F.zeros(...) itself, not a view of it), or compute the value without out="
            % describe_call(rec.sample, rec.path)) from err
    if out is not None:
        # An output still pending above was computed by the flush its handle
        # ran, and handed out as rows of that flush's arrays: it holds the
        # written values now, not those rows.
        for array in outs:
            if type(array) is LazyArray:
                array._rows = None  # pylint: disable=protected-access
                if rec is not None:
                    aliases.follow(rec, array)     # its views share its memory
    return result



_IN_GRAPH = "Assigning to NDArrays that are already in a computational graph"
_IN_PLACE = "Inplace operations (+=, -=, x[:]=, etc) are not supported when recording"


def _given_outputs(rec, out):
    """``(out, [(lazy, array), ...])`` with each LazyArray of ``out`` that stands
    for an array a sample was given replaced by that array
    (``arithmetic.written_array``), or None when there is none."""
    outs = out if isinstance(out, (list, tuple)) else [out]
    pairs = [(a, arithmetic.written_array(rec, a) if type(a) is LazyArray else None)
             for a in outs]
    if all(array is None for _, array in pairs):
        return None
    arrays = [a if array is None else array for a, array in pairs]
    swapped = [(a, array) for a, array in pairs if array is not None]
    return (arrays if isinstance(out, (list, tuple)) else arrays[0]), swapped


# -- ``nn.HybridLambda`` given an operator by name -------------------------------------
# ``nn.HybridLambda("tanh")`` looks its operator up in a dict keyed by ``mx.nd``
# and ``mx.sym`` with the ``F`` it is given; inside a scope ``F`` is the
# recording namespace, which names the same operator.

_LAMBDA_FORWARD = gluon.nn.HybridLambda.hybrid_forward
_BY_NAME = "HybridLambda.__init__.<locals>.<lambda>"    # the function a name makes


def _lambda_hybrid_forward(self, F, x, *args):
    """``HybridLambda.hybrid_forward``: a function given by name is ``F.<name>``
    for any ``F`` (the recording one too)."""
    if F is not mx.nd and F is not mx.sym:
        if getattr(self._func, "__qualname__", None) == _BY_NAME:
            return getattr(F, self._func_name)(x, *args)
        if dispatch.asks_namespace(self._func):
            # ``if F is mx.nd:`` in the function: ``mx.nd``'s operators on the
            # pending values are recorded too.
            return _LAMBDA_FORWARD(self, mx.nd, x, *args)
    return _LAMBDA_FORWARD(self, F, x, *args)


_COPY_FROM = mx.nd.NDArray._sync_copyfrom  # pylint: disable=protected-access


def _recording_copyfrom(self, source_array):
    """``NDArray._sync_copyfrom`` (``x[:] = numpy_values``, ``mx.nd.array``):
    recorded calls that read ``x`` run first (``Recorder.before_write``); then
    the values are written in the engine's order, without waiting for it to
    finish what it has queued (``known.copy_into``)."""
    rec = context.TLS.recorder
    if rec is None:
        return _COPY_FROM(self, source_array)
    rec.before_write((self,))
    if type(self) is not mx.nd.NDArray or not known.copy_into(self, source_array):
        _COPY_FROM(self, source_array)
    return None


_PREPARE_VALUE = mx.nd.NDArray._prepare_value_nd  # pylint: disable=protected-access


def _prepare_value_nd(self, value, bcast_shape, squeeze_axes=None):
    """``NDArray._prepare_value_nd`` (``buf[i:j] = value``): a LazyArray assigned is
    an array, its values computed first (MXNet's check of the value's exact
    class took it for a sequence and recursed), with its history, as eager's
    copy keeps it (a constant once a backward pass may have freed it)."""
    if isinstance(value, LazyArray):
        rec = context.TLS.recorder
        if rec is not None:
            # Before the value is read: a sample writing state the samples share
            # runs what is pending now, not waiting as at a read (``before_write``).
            rec.before_write((self,))
        value.wait_to_read()            # a read of a pending value: it runs first
        freed = value.history_freed()
        with mx.autograd.pause() if freed else contextlib.nullcontext():
            value = mx.nd.identity(value.as_in_context(self.ctx))
    return _PREPARE_VALUE(self, value, bcast_shape, squeeze_axes)


_CACHED_OP_CALL = _ctypes_ndarray.CachedOp.__call__


def _cached_op_call(self, *args, **kwargs):
    """``CachedOp.__call__`` (a hybridized block run eagerly): values of a scope
    whose graph a backward pass freed go in as constants (``constants_if_freed``)."""
    if any(type(a) is LazyArray for a in args):
        args = constants_if_freed(args)
    return _CACHED_OP_CALL(self, *args, **kwargs)


def install():
    """Record ``mx.nd`` operators called on pending values (``_recording_invoke``);
    run what reads an array before it is written in place; take LazyArrays as
    values assigned to arrays' items; let ``nn.HybridLambda`` name its
    operator in the recording ``F``; note views of rows of plain arrays
    (``aliases.install``)."""
    _register._imperative_invoke = _recording_invoke
    _ctypes_ndarray.CachedOp.__call__ = _cached_op_call
    mx.nd.NDArray._sync_copyfrom = _recording_copyfrom  # pylint: disable=protected-access
    mx.nd.NDArray._prepare_value_nd = _prepare_value_nd  # pylint: disable=protected-access
    gluon.nn.HybridLambda.hybrid_forward = _lambda_hybrid_forward
    aliases.install()
    arithmetic.install()
