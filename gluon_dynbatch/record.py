"""Recording: turn calls on lazy values into graph nodes.

The recorder of the active scope (one per thread) is reached through
``current()``.  It records

* operator calls through the ``F`` namespace handed to ``hybrid_forward``,
* calls of child HybridBlocks (traced into: their own ``hybrid_forward`` runs
  with the recording ``F`` and lazy parameter values), and
* arithmetic, indexing and fluent methods of ``LazyArray`` (see ``lazy_ops.py``).

Shapes and dtypes of outputs come from MXNet's symbolic inference, cached
per (operator, attributes, input shapes, input dtypes).
"""
import logging
import threading
import weakref

import mxnet as mx
import numpy as np
from mxnet import autograd
from mxnet.ndarray import NDArray

from . import lazy as lazy_mod
from . import calls, replay
from . import frames as frames_mod
from .errors import BatchingError, describe_call
from .frames import Frame, State, Step, is_constant
from .graph import LEAF, NO_KWARGS, OP, VIEW, Graph, Node, Slot, known_node, slot
from .lazy import LazyArray
from .signatures import ALONE, rule_for

class _Local(threading.local):
    recorder = None     # the recorder of this thread's active scope


_TLS = _Local()
log = logging.getLogger(__name__)


def current():
    """The recorder of this thread's active batching scope, or None."""
    return _TLS.recorder


def _set_current(recorder):
    _TLS.recorder = recorder


# -- autograd's modes ------------------------------------------------------------------
# A batch runs later than it is recorded, so it must run under the autograd
# modes (recording, training) its calls were recorded under.  Reading them
# costs a ctypes call each; instead every change through mxnet.autograd bumps
# a counter, and a recorder re-reads the modes only when the counter moved.
_MODE_CHANGES = [0]
_SET_RECORDING, _SET_TRAINING = autograd.set_recording, autograd.set_training


def _counting_set_recording(is_recording):
    _MODE_CHANGES[0] += 1
    return _SET_RECORDING(is_recording)


def _counting_set_training(train_mode):
    _MODE_CHANGES[0] += 1
    return _SET_TRAINING(train_mode)


def _counting_backward(backward):
    """Wrap one of MXNet's backward functions to count graph-freeing passes."""
    def wrapper(*args, **kwargs):
        result = backward(*args, **kwargs)
        retain = kwargs.get("retain_graph")
        if not retain:
            lazy_mod.BACKWARD_EPOCH[0] += 1
        return result
    wrapper.__doc__ = backward.__doc__
    wrapper.__name__ = backward.__name__
    return wrapper


NDArray.backward = _counting_backward(NDArray.backward)
autograd.backward = _counting_backward(autograd.backward)
_counting_set_recording.__doc__ = _SET_RECORDING.__doc__
_counting_set_training.__doc__ = _SET_TRAINING.__doc__
autograd.set_recording = _counting_set_recording
autograd.set_training = _counting_set_training


def autograd_mode():
    """(is_recording, is_training) of this thread, read from MXNet."""
    return (autograd.is_recording(), autograd.is_training())


class OpDef:
    """An MXNet operator reachable as ``mx.nd.<path>`` and ``mx.sym.<path>``."""

    __slots__ = ("name", "path", "nd_fn", "sym_fn")

    def __init__(self, path):
        self.path = path
        self.name = path[-1]
        self.nd_fn = _resolve(mx.nd, path)
        self.sym_fn = _resolve(mx.sym, path)

    def __repr__(self):
        return "OpDef(%s)" % ".".join(self.path)


def _resolve(module, path):
    obj = module
    for part in path:
        obj = getattr(obj, part)
    return obj


_OPDEFS = {}


def opdef(*path):
    """The cached OpDef of ``mx.nd.<path>``."""
    found = _OPDEFS.get(path)
    if found is None:
        found = _OPDEFS[path] = OpDef(path)
    return found


def _hashable(value):
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.dtype) or isinstance(value, type):
        return np.dtype(value).name
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


class _InferCache:
    """Output shapes and dtypes per (op, attributes, input shapes, dtypes)."""

    def __init__(self):
        self._cache = {}
        self._lock = threading.Lock()

    def infer(self, op, node, in_shapes, in_dtypes, attrs_key):
        key = (op.name, attrs_key, in_shapes, in_dtypes)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        result = _infer_rows_view(op, node, in_shapes, in_dtypes)
        if result is None:
            result = _infer_symbolic(op, node, in_shapes, in_dtypes)
        if all(all(s > 0 for s in shape) for shape in in_shapes):
            with self._lock:
                self._cache[key] = result
        return result


def _infer_rows_view(op, node, in_shapes, in_dtypes):
    """Shapes of axis-0 slices and concatenations, without MXNet; None otherwise.

    Their constant arguments differ per call (a word's row of an embedding
    table), so each new one would otherwise pay a symbolic inference.
    """
    if not in_shapes or any(not s or 0 in s for s in in_shapes) or node.args[1:]:
        return None
    if len(set(in_dtypes)) != 1 or not all(isinstance(a, Slot) for a in node.args):
        return None
    kwargs = node.kwargs
    if op.name == "slice_axis" and len(in_shapes) == 1 and kwargs.get("axis") == 0 \
            and set(kwargs) == {"axis", "begin", "end"}:
        rows = in_shapes[0][0]
        begin, end = kwargs["begin"], kwargs["end"]
        if not isinstance(begin, int) or not isinstance(end, (int, type(None))):
            return None
        if not -rows <= begin < rows or (end is not None and not -rows <= end <= rows):
            return None        # out of range: MXNet's inference raises its error
        start, stop, _ = slice(begin, end).indices(rows)
        if stop <= start:
            return None
        out = (stop - start,) + tuple(in_shapes[0][1:])
    elif op.name in ("concat", "Concat") and set(kwargs) <= {"dim", "num_args"} \
            and kwargs.get("dim", 1) == 0 and len(set(s[1:] for s in in_shapes)) == 1:
        out = (sum(s[0] for s in in_shapes),) + tuple(in_shapes[0][1:])
    else:
        return None
    return (out,), (in_dtypes[0],), tuple(tuple(s) for s in in_shapes)


def _infer_symbolic(op, node, in_shapes, in_dtypes):
    """Run MXNet's shape and type inference on a one-operator symbol."""
    names = ["x%d" % k for k in range(len(in_shapes))]
    syms = [mx.sym.var(n) for n in names]
    args = [syms[a.k] if isinstance(a, Slot) else a for a in node.args]
    kwargs = {k: (syms[v.k] if isinstance(v, Slot) else v) for k, v in node.kwargs.items()}
    sym = op.sym_fn(*args, **kwargs)
    known = {n: s for n, s in zip(names, in_shapes) if s and all(d > 0 for d in s)}
    arg_shapes, out_shapes, aux_shapes = sym.infer_shape(**known)
    if out_shapes is None or any(s is None or 0 in s for s in out_shapes):
        raise ValueError("cannot infer output shapes from input shapes %s" % (in_shapes,))
    all_names = sym.list_arguments() + sym.list_auxiliary_states()
    all_shapes = dict(zip(all_names, list(arg_shapes) + list(aux_shapes)))
    _, out_types, _ = sym.infer_type(**dict(zip(names, in_dtypes)))
    out_dtypes = tuple(np.dtype(t).type for t in out_types)
    inferred_inputs = tuple(tuple(all_shapes.get(n, ())) for n in names)
    return tuple(tuple(s) for s in out_shapes), out_dtypes, inferred_inputs


INFER = _InferCache()


class RecordingNamespace:
    """The ``F`` given to ``hybrid_forward`` inside a scope: ``mx.nd`` that records."""

    def __init__(self, recorder, module=mx.nd, path=()):
        self._recorder = recorder
        self._module = module
        self._path = path

    def __getattr__(self, name):
        target = getattr(self._module, name)
        path = self._path + (name,)
        if not callable(target):
            if hasattr(target, "__dict__") and type(target).__name__ == "module":
                value = RecordingNamespace(self._recorder, target, path)
            else:
                value = target
        elif getattr(target, "__module__", None) == "ndarray":
            op = opdef(*path)
            rec = self._recorder
            if path == ("slice_axis",):
                value = _slice_axis_recorder(rec, op)
            elif path in (("concat",), ("Concat",)):
                value = _concat_recorder(rec, op)
            else:
                def value(*args, **kwargs):
                    frame = rec.frame
                    if frame is not None and rec._mode_seen == _MODE_CHANGES[0]:
                        return frame.op(op, args, kwargs)
                    return rec.call_op(op, args, kwargs)
            value.__name__ = name
        else:
            value = self._recorder.wrap_python_function(target, path)
        self.__dict__[name] = value      # later lookups skip __getattr__
        return value


def _slice_axis_recorder(rec, op):
    """``F.slice_axis`` of a recording namespace: rows of one array take a fast path."""
    def slice_axis(*args, **kwargs):
        if len(args) == 1 and len(kwargs) == 3 and kwargs.get("axis") == 0 \
                and "begin" in kwargs and "end" in kwargs and isinstance(args[0], NDArray):
            return rec.row_slice(args[0], kwargs["begin"], kwargs["end"])
        return rec.call_op(op, args, kwargs)
    return slice_axis


def _concat_recorder(rec, op):
    """``F.concat`` of a recording namespace: stacking rows (``dim=0``) takes a fast path."""
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


class Recorder:
    """Records the calls of one batching scope on this thread."""

    def __init__(self, flush, ctx=None):
        self._flush = flush
        self.ctx = ctx
        self.graph = Graph(ctx, flush)
        self.F = RecordingNamespace(self)
        self.sample = None          # index of the current top-level call
        self.num_samples = 0        # top-level calls in this scope (sample numbers)
        self.samples_flushed = 0    # of which counted by earlier flushes
        self.path = ()              # block names being traced, for messages
        self.depth = 0              # nesting of DynBatchBlock calls
        self.tracing = 0            # nesting of child-block traces (see _find_template_mode)
        self._template_mode = None  # (fuse, whole_calls) once known, outside traces
        self.num_recorded = 0
        self.max_pending = DEFAULT_MAX_PENDING
        self.replay = True          # copy traced child-block calls (replay.py)
        self.owner = None           # the first top-level DynBatchBlock called
        self.last_stateful = None   # last stateful node recorded (see _STATEFUL)
        self._versions = {}         # id(block) -> parameter identity, per scope
        self._tokens = {}           # id(block) -> block_token, per scope
        self._roots = {}            # (id(block), modes) -> frame_root, per scope
        self._store = _thread_store()
        self._mode_seen = None      # _MODE_CHANGES[0] when self.mode was read
        self.mode = None            # (is_recording, is_training) of new calls
        self.frame = None           # the Frame recording now (frames.py), if any
        self.frames = None          # whether DynBatchBlock calls are frames (frames_on)
        self.num_calls = 0          # operator calls recorded (in frames or not)
        self.lazy_pool = []         # dead provisional LazyArrays, reused by frames

    @property
    def constant_ids(self):
        """id -> array of the constants this thread reuses (``make_constant``)."""
        return self._store.constant_ids

    def sync_mode(self):
        """Re-read autograd's modes if they may have changed; return them.

        Calls recorded under other modes than the pending ones cannot run in
        the same batch: the pending calls run first (a flush).
        """
        if self._mode_seen == _MODE_CHANGES[0]:
            return self.mode
        self._mode_seen = _MODE_CHANGES[0]
        mode = autograd_mode()
        if mode != self.mode:
            self.mode = mode
            pending = self.graph.mode
            if pending is not None and pending != mode:
                self._flush()
        return mode

    def close(self):
        """Drop references back to the scope (closures of F refer to the recorder)."""
        self.graph.release()
        self.lazy_pool = []
        self.F = self._flush = self.scope = None

    # -- values ---------------------------------------------------------------
    def new_graph(self):
        """Start a fresh graph (after a flush or a failure)."""
        self.graph = Graph(self.ctx, self._flush)

    def _set_ctx(self, ctx):
        if self.ctx is None:
            self.ctx = self.graph.ctx = ctx
        elif ctx != self.ctx:
            raise BatchingError("%s: arrays on different contexts (%s and %s)" % (
                describe_call(self.sample, self.path), self.ctx, ctx))

    def leaf(self, array):
        """The LazyArray standing for concrete ``array`` in this graph."""
        graph = self.graph
        found = graph.leaf_by_id.get(id(array))
        if found is not None and found[2] is array:
            return found[1]
        self._set_ctx(array.context)
        node = graph.add(Node(graph, LEAF))
        node.value = array
        if type(array) is LazyArray and array.history_freed():
            node.value = array.detach()      # as eager uses it: a constant
            self._warn_freed(array)
        node.out_shapes = (array.shape,)
        node.out_dtypes = (array.dtype,)
        lazy = LazyArray(node, 0)
        graph.leaf_by_id[id(array)] = (node, lazy, array)
        return lazy

    def _warn_freed(self, array):
        if "freed" not in _WARNED:
            _WARNED.add("freed")
            log.warning(
                "%s: a value computed in an earlier batch is used after a backward pass "
                "freed the graph that computed it; it is used as a constant (no gradient "
                "flows into that earlier batch), as eager MXNet does with such arrays",
                describe_call(self.sample, self.path))

    def param(self, parameter):
        """The LazyArray standing for a gluon Parameter (shared by every call)."""
        graph = self.graph
        found = graph.leaf_by_id.get(id(parameter))
        if found is not None:
            return found[1]
        node = graph.add(Node(graph, LEAF))
        node.param = parameter
        node.out_shapes = (tuple(parameter.shape),)
        node.out_dtypes = (np.dtype(parameter.dtype).type,)
        lazy = LazyArray(node, 0)
        graph.leaf_by_id[id(parameter)] = (node, lazy, parameter)
        return lazy

    def params_of(self, block):
        """A block's own parameters as lazy values, by name (one dict per graph).

        Every recursive call of a DynBatchBlock passes them; building the dict
        once per graph saves a lookup per parameter per call.
        """
        graph = self.graph
        found = graph.param_dicts.get(id(block))
        if found is None or found[0] is not block:
            found = graph.param_dicts[id(block)] = (
                block, {name: self.param(p) for name, p in block._reg_params.items()})
        return found[1]

    def value_of(self, x):
        """(node, index) of array ``x`` in the current graph."""
        if isinstance(x, LazyArray):
            node = x._node
            if node is not None and node.graph is self.graph:
                return node, x._idx
            if type(node) is Frame:         # a value of a call still recording
                node.cut("its value is used outside it")
                return self.value_of(x)
            if node is not None:          # pending in an older graph: run it
                x.handle  # pylint: disable=pointless-statement
        lazy = self.leaf(x)
        return lazy._node, 0

    def wrap_inputs(self, obj):
        """Replace NDArrays in (nested lists/tuples of) ``obj`` by lazy leaves."""
        if isinstance(obj, LazyArray):
            node = obj._node
            if node is not None and node.graph is self.graph:
                return obj
            return self.leaf(obj) if node is None else obj
        if isinstance(obj, mx.nd.NDArray):
            return self.leaf(obj)
        if isinstance(obj, (list, tuple)) and any(
                isinstance(o, (mx.nd.NDArray, list, tuple)) for o in obj):
            wrapped = [self.wrap_inputs(o) for o in obj]
            return wrapped if isinstance(obj, list) else type(obj)(wrapped) \
                if type(obj) is tuple else type(obj)(*wrapped)
        return obj

    def wrap_arguments(self, args):
        """The arguments of a top-level call, with NDArrays as lazy leaves.

        Only arrays passed directly or inside tuples are wrapped.  Lists,
        dicts and other containers keep their identity: a model may append
        to a list its caller passed (per-node losses), and the caller must
        see those appends.  Arrays inside them are used as they are (an
        operator reading one records it as a leaf when it runs).
        """
        return tuple(self._wrap_argument(a) for a in args)

    def _wrap_argument(self, obj):
        if isinstance(obj, mx.nd.NDArray):
            return self.wrap_inputs(obj)
        if isinstance(obj, tuple):
            wrapped = [self._wrap_argument(o) for o in obj]
            return tuple(wrapped) if type(obj) is tuple else type(obj)(*wrapped)
        return obj

    def rebind(self, lazy, result):
        """Make LazyArray ``lazy`` stand for ``result``'s value (an in-place update).

        Returns ``lazy``.  Its old value stays what other nodes read; only
        the object (and so every alias of it) now holds the new one.
        """
        node = lazy._node
        if type(node) is Frame:
            if result._node is node:          # both values of the recording frame
                lazy._idx = result._idx
                return lazy
            node.lazies.remove(lazy)
            node = result._node
            lazy._node, lazy._idx = node, result._idx
            node.outs[lazy._idx] = weakref.ref(lazy)
            result._node = None
            return lazy
        if node.kind == LEAF:
            raise BatchingError(
                "%s: in-place update of an input array inside a batching scope; "
                "write x = x + y instead" % describe_call(self.sample, self.path))
        if node.graph is not self.graph:
            lazy.handle  # pylint: disable=pointless-statement  (runs its graph)
            return lazy
        if node.outs is not None and node.outs[lazy._idx] is not None \
                and node.outs[lazy._idx]() is lazy:
            node.outs[lazy._idx] = None
        new, idx = result._node, result._idx
        lazy._node, lazy._idx = new, idx
        new.outs[idx] = weakref.ref(lazy)
        result._node = None
        return lazy

    # -- operator calls ---------------------------------------------------------
    def call_op(self, op, args, kwargs):
        """Record ``op(*args, **kwargs)``; return its LazyArray output(s).

        This runs for every operator call of every sample (see ``_values_of``).
        """
        frame = self.frame
        if frame is not None:
            if self._mode_seen == _MODE_CHANGES[0] or self._same_mode():
                return frame.op(op, args, kwargs)
            frame.fallback("autograd's mode changed")
        return self.graph_op(op, args, kwargs)

    def _same_mode(self):
        """Whether autograd's modes are still those of the calls recorded so far.

        MXNet's own code sets them too (deferred initialisation pauses
        recording), so a change seen by the counter may be none at all.
        """
        before = self.mode
        return self.sync_mode() == before

    def graph_op(self, op, args, kwargs):
        """Record ``op(*args, **kwargs)`` as a node of the graph, frame or not."""
        self.num_calls += 1
        if len(self.graph.nodes) >= self.max_pending:
            # Bounded memory: run what is pending (every value still held is
            # computed), then record on into a fresh graph.
            self._flush()
        arrays = []
        targs = []
        for a in args:
            if isinstance(a, NDArray):
                targs.append(slot(len(arrays)))
                arrays.append(a)
            else:
                targs.append(a)
        inputs = self._values_of(arrays)
        tkw = {}
        if kwargs:
            for k, v in kwargs.items():
                if k == "name":
                    continue
                if isinstance(v, NDArray):
                    tkw[k] = slot(len(inputs))
                    inputs.append(self.value_of(v))
                else:
                    tkw[k] = v
        if not inputs:
            return self.constant(op, args, kwargs)
        return self.add_node(op, inputs, tuple(targs), tkw)

    def row_slice(self, x, begin, end):
        """Rows ``begin:end`` of array ``x``: ``x[i:j]`` and ``F.slice_axis(x, axis=0, ...)``.

        A word's row of an embedding table, a label's row of a constant table:
        models take one per tree node, so once the call shape is known the
        view node is made here directly, without the generic ``call_op``.
        """
        if self.frame is not None and type(x) is LazyArray and x._node is self.frame:
            return self.call_op(_SLICE_AXIS, (x,), {"axis": 0, "begin": begin, "end": end})
        graph = self.graph
        if len(graph.nodes) >= self.max_pending:
            self._flush()
            graph = self.graph
        if self._mode_seen != _MODE_CHANGES[0]:
            self.sync_mode()
            graph = self.graph
        self.num_calls += 1
        src = x._node if type(x) is LazyArray else None
        if src is not None and src.graph is graph:
            idx = x._idx
            value = (src, idx)
        else:
            value = self.value_of(x)
            src, idx = value
        shape = src.out_shapes[idx]
        if not (type(begin) is int and type(end) is int and 0 <= begin < end <= shape[0]):
            return self.graph_op(_SLICE_AXIS, (x,), {"axis": 0, "begin": begin, "end": end})
        found = _ROW_SLICES.get((begin, end, shape, src.out_dtypes[idx]))
        if found is None:
            kwargs = {"axis": 0, "begin": begin, "end": end}
            info = _CALLS.get((_SLICE_AXIS, _ONE_SLOT,
                               (("axis", 0), ("begin", begin), ("end", end)),
                               (shape,), (src.out_dtypes[idx],)))
            if info is None or info.kind != VIEW:
                return self.add_node(_SLICE_AXIS, [value], _ONE_SLOT, kwargs)
            # Nodes never change their kwargs: views of the same rows share one dict.
            found = _ROW_SLICES[(begin, end, shape, src.out_dtypes[idx])] = (info, kwargs)
        info, kwargs = found
        if graph.mode is None:
            graph.mode = self.mode
        node = known_node(graph, VIEW, _SLICE_AXIS, (value,), _ONE_SLOT, kwargs, info,
                          self.sample, self.path)
        node.depth = src.depth
        graph.nodes.append(node)
        self.num_recorded += 1
        lazy = LazyArray(node, 0)
        node.outs = [weakref.ref(lazy)]
        return lazy

    def row_concat(self, op, args):
        """``F.concat(*args, dim=0)`` of values of this graph whose call shape is known,
        or None (``call_op`` records it).

        A node's children's states, stacked: recursive models make one or two
        per tree node, so the view node is made here directly (as in
        ``row_slice``), without the generic path of ``call_op``.
        """
        graph = self.graph
        if len(graph.nodes) >= self.max_pending or self._mode_seen != _MODE_CHANGES[0] \
                or len(args) > MAX_ROW_CONCAT:
            return None
        values = []
        shapes = []
        dtypes = []
        depth = 0
        for a in args:
            if type(a) is not LazyArray:
                return None
            src = a._node
            if src is None or src.graph is not graph:
                return None
            idx = a._idx
            values.append((src, idx))
            shapes.append(src.out_shapes[idx])
            dtypes.append(src.out_dtypes[idx])
            if src.depth > depth:
                depth = src.depth
        targs = slots_of(len(args))
        info = _CALLS.get((op, targs, _DIM0_ITEMS, tuple(shapes), tuple(dtypes)))
        if info is None or info.kind != VIEW:
            return None
        node = known_node(graph, VIEW, op, values, targs, _DIM0, info, self.sample, self.path)
        node.depth = depth
        graph.nodes.append(node)
        self.num_recorded += 1
        self.num_calls += 1
        lazy = LazyArray(node, 0)
        node.outs = [weakref.ref(lazy)]
        return lazy

    def constant(self, op, args, kwargs):
        """An operator without array inputs (zeros, random, ...) runs now."""
        return self.make_constant(op.nd_fn, op.path, args, kwargs)

    def make_constant(self, fn, path, args, kwargs):
        """Call creation function ``fn`` now and return its result as leaves.

        Deterministic ones (zeros, ones, full, ...) are computed once per
        context and reused: users only ever see copies of leaves.
        """
        if "name" in kwargs:
            kwargs = {k: v for k, v in kwargs.items() if k != "name"}
        ctx = self.ctx or mx.current_context()
        store = self._store
        key = out = None
        if path[-1] in _DETERMINISTIC:
            key = (path, args, tuple(sorted(kwargs.items())) if kwargs else (),
                   ctx.device_typeid, ctx.device_id)
            try:
                out = store.constants.get(key)
            except TypeError:           # an unhashable argument: no memo
                key = None
        if out is None:
            with ctx:
                out = fn(*args, **kwargs)
            if key is not None and len(store.constants) < 1024:
                store.constants[key] = out
                for array in (out if isinstance(out, (list, tuple)) else [out]):
                    store.constant_ids[id(array)] = array
        if isinstance(out, (list, tuple)):
            return [self.leaf(o) for o in out]
        return self.leaf(out)

    def add_node(self, op, inputs, targs, tkw):
        """Create, infer and sign one op node; return its LazyArray output(s)."""
        if self._mode_seen != _MODE_CHANGES[0]:
            self.sync_mode()
        graph = self.graph
        if graph.mode is None:
            graph.mode = self.mode
        in_shapes = tuple([src.out_shapes[i] for src, i in inputs])
        in_dtypes = tuple([src.out_dtypes[i] for src, i in inputs])
        try:
            key = (op, targs, tuple(tkw.items()) if tkw else (), in_shapes, in_dtypes)
            info = _CALLS.get(key)
        except TypeError:          # an unhashable constant argument: no memo
            key = info = None
        if info is None:
            node = Node(graph, OP, op, inputs, targs, tkw)
            node.sample = self.sample
            node.path = self.path
            info = self._analyse(node, in_shapes, in_dtypes)
            if key is not None and info.cacheable:
                _CALLS[key] = info
            node.out_shapes, node.out_dtypes = info.out_shapes, info.out_dtypes
            node.attrs, node.rule, node.meta, node.info = info.attrs, info.rule, info.meta, info
        else:
            node = known_node(graph, OP, op, inputs, targs, tkw, info, self.sample, self.path)
        self._place(node, info)
        graph.nodes.append(node)
        self.num_recorded += 1
        if len(info.out_shapes) == 1:
            lazy = LazyArray(node, 0)
            node.outs = [weakref.ref(lazy)]
            return lazy
        outs = [LazyArray(node, i) for i in range(len(info.out_shapes))]
        node.outs = [weakref.ref(lazy) for lazy in outs]
        return outs

    def _analyse(self, node, in_shapes, in_dtypes):
        """Shapes, rule and signature of a call shape seen for the first time."""
        op = node.op
        attrs_key = (tuple((i, _hashable(a)) for i, a in enumerate(node.args)
                           if not isinstance(a, Slot)),
                     tuple(sorted((k, _hashable(v)) for k, v in node.kwargs.items()
                                  if not isinstance(v, Slot))))
        try:
            out_shapes, out_dtypes, inferred = INFER.infer(
                op, node, in_shapes, in_dtypes, attrs_key)
        except Exception as err:  # MXNetError, TypeError, ValueError from MXNet
            raise BatchingError("%s: invalid call with input shapes %s: %s" % (
                describe_call(self.sample, self.path, op.name), list(in_shapes),
                _first_line(err))) from None
        deferred = self._finish_deferred(node.inputs, inferred)
        node.out_shapes, node.out_dtypes, node.attrs = out_shapes, out_dtypes, attrs_key
        rule = rule_for(op.name)
        node.rule = rule
        key = rule.signature(node)
        return CallInfo(node, key, cacheable=not deferred and op.name not in _MODAL)

    def _place(self, node, info):
        """Kind, signature and depth of a new node.

        Depth is 1 + the largest depth among the inputs (views pass their
        inputs' depth on; leaves have 0).  Which op nodes a node waits for is
        derived when a planner needs it (``graph.op_deps``); only extra
        ordering constraints are stored in ``node.deps``.
        """
        depth = 0
        for src, _ in node.inputs:
            if src.depth > depth:
                depth = src.depth
        if info.stateful and self.mode[1]:
            # Operators that update state (BatchNorm's running statistics) keep
            # their recording order: each waits for the previous one.
            previous = self.last_stateful
            if previous is not None and previous.graph is node.graph:
                node.deps = (previous,)
                if previous.depth > depth:
                    depth = previous.depth
                _warn_running_statistics(node)
            self.last_stateful = node
        if info.kind == VIEW:
            node.kind = VIEW
            node.depth = depth
            return
        node.depth = depth + 1
        if info.sig is None:
            node.sig = ("alone", node.graph, node.id)
        elif info.shared_pos:
            inputs = node.inputs
            node.sig = (info.sig, tuple([(inputs[k][0].id, inputs[k][1])
                                         for k in info.shared_pos]))
        else:
            node.sig = info.sig

    def _finish_deferred(self, inputs, inferred):
        """Give deferred-initialised parameters the shapes inference found.

        Returns True if any parameter was still waiting for its shape.
        """
        found = False
        for (src, _), shape in zip(inputs, inferred):
            if src.param is not None and 0 in src.out_shapes[0]:
                param = src.param
                param.shape = shape
                param._finish_deferred_init()  # pylint: disable=protected-access
                src.out_shapes = (tuple(shape),)
                found = True
        return found

    def wrap_python_function(self, fn, path):
        """``F.<f>`` for a Python-level helper of mx.nd (not an operator)."""
        from . import lazy_ops
        special = lazy_ops.PYTHON_HELPERS.get(path[-1])
        if special is not None:
            return special
        rec = self
        if path[-1] in _DETERMINISTIC:
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
            out = fn(*args, **kwargs)
            return rec.wrap_inputs(out)
        return fallback

    # -- frames -----------------------------------------------------------------
    def frames_on(self):
        """Whether DynBatchBlock calls are recorded as frames (``frames.py``).

        They are unless the scope records operator by operator
        (``granularity="op"``, or the reference strategy).
        """
        if self.frames is None:
            self.frames = self._whole_calls()
        return self.frames

    def frame_root(self, block):
        """The root of ``block``'s template trie for calls recorded now."""
        if self._mode_seen != _MODE_CHANGES[0]:
            self.sync_mode()
        key = (id(block), self.mode)
        root = self._roots.get(key)       # this scope's, while the modes hold
        if root is None or root.counter[0] >= frames_mod.MAX_STATES:
            full = (id(block), self.block_version(block), self.mode, self.replay)
            roots = self._store.frame_roots
            root = roots.get(full)
            if root is None or root.counter[0] >= frames_mod.MAX_STATES:
                root = roots[full] = State()
            self._roots[key] = root
        return root

    def block_token(self, block):
        """A small int naming ``block`` and its parameters (see ``block_version``)."""
        token = self._tokens.get(id(block))
        if token is None:
            tokens = self._store.block_tokens
            key = (id(block), self.block_version(block))
            token = tokens.get(key)
            if token is None:
                token = tokens[key] = len(tokens)
            self._tokens[id(block)] = token
        return token

    def block_version(self, block):
        """Identity, shapes and dtypes of ``block``'s parameters (once per scope)."""
        version = self._versions.get(id(block))
        if version is None:
            version = self._versions[id(block)] = replay.block_version(block)
        return version

    def analyse_frame_call(self, frame, op, args, kwargs, refs, kw):
        """The :class:`frames.Step` of a call a frame meets for the first time.

        ``refs`` and ``kw`` are the call's key items (see ``Frame.op``).
        Inputs that are values of the frame stand in as ``_Position``
        objects with their shapes; the analysis is the one of ``add_node``.
        """
        inputs, targs, step_refs = [], [], []
        for a, ref in zip(args, refs):
            if is_constant(ref):
                targs.append(a)
                continue
            if type(ref) is tuple and ref[0] == "x":      # read for the first time
                ref = frame.ext[id(a)]
            targs.append(slot(len(inputs)))
            inputs.append(self._frame_source(frame, a, ref))
            step_refs.append(self._step_ref(ref))
        tkw = {}
        for name, ref in kw or ():
            value = kwargs[name]
            if isinstance(value, NDArray):
                if type(ref) is tuple and ref[0] == "x":
                    ref = frame.ext[id(value)]
                tkw[name] = slot(len(inputs))
                inputs.append(self._frame_source(frame, value, ref))
                step_refs.append(self._step_ref(ref))
            else:
                tkw[name] = value
        node = Node(self.graph, OP, op, inputs, tuple(targs), tkw)
        node.sample, node.path = self.sample, self.path
        in_shapes = tuple([src.out_shapes[i] for src, i in inputs])
        in_dtypes = tuple([src.out_dtypes[i] for src, i in inputs])
        info = self._analyse(node, in_shapes, in_dtypes)
        start = len(frame.out_shapes)
        outs = tuple(range(start, start + len(info.out_shapes)))
        return Step(op, tuple(targs), tkw, tuple(step_refs), info, outs,
                    self.path[len(frame.path):])

    def analyse_stub(self, op, args, kwargs, sources):
        """The CallInfo of ``op(*args, **kwargs)`` on stand-in inputs ``sources``.

        ``sources`` are ``(node, idx)`` pairs: graph leaves for parameters,
        :class:`Stand` objects for anything else (a shape and a dtype).
        Template passes (``vectorize.py``) analyse the calls they make up.
        """
        node = Node(self.graph, OP, op, list(sources), args, kwargs)
        node.sample, node.path = self.sample, self.path
        in_shapes = tuple([src.out_shapes[i] for src, i in sources])
        in_dtypes = tuple([src.out_dtypes[i] for src, i in sources])
        return self._analyse(node, in_shapes, in_dtypes)

    def _frame_source(self, frame, array, ref):
        """``(node, idx)`` standing for an input of a frame's call during analysis."""
        if type(ref) is int:
            outside = frame.vals.get(ref)
            if outside is not None:
                return self.value_of(outside)
            return (_Position(frame, ref), 0)
        return self.value_of(array)

    def _step_ref(self, ref):
        """A key item as a step keeps it: positions, parameters, constant arrays."""
        if type(ref) is int:
            return ref
        if ref[0] == "c":
            return ("c", self._store.constant_ids[ref[1]])
        if ref[0] == "p":
            return ref
        raise AssertionError("unexpected key item %r" % (ref,))

    def trace_in_frame(self, block, args):
        """Run a child block's ``hybrid_forward`` into the current frame."""
        return self._trace(block, args)

    # -- blocks -----------------------------------------------------------------
    def trace_block(self, block, args):
        """Record a child HybridBlock call: replayed from a template when possible."""
        key = arg_values = None
        if self._mode_seen != _MODE_CHANGES[0]:
            self.sync_mode()
        if self.replay and not self._reference() and not block._forward_pre_hooks \
                and not block._forward_hooks:
            arrays, structure = replay.flatten_args(args)
            if structure is not None:
                if len(self.graph.nodes) >= self.max_pending:
                    self._flush()
                arg_values = self._values_of(arrays)
                version = self._versions.get(id(block))
                if version is None:
                    version = self._versions[id(block)] = replay.block_version(block)
                key = replay.call_key(block, structure, arg_values, version, self.mode,
                                      self._template_mode or self._find_template_mode())
                template = self._store.templates.get(key)
                if template is replay.UNTEMPLATABLE:
                    key = None
                elif template is not None:
                    pending = len(self.graph.nodes)
                    if pending and pending + len(template.entries) > self.max_pending:
                        self._flush()
                        arg_values = [self.value_of(a) for a in arrays]
                    out = replay.replay(self, template, arg_values, self.path + (block.name,))
                    if template.call is not None and arrays is args:
                        self._remember_call(block, template, arg_values)
                    return out
        graph, start = self.graph, len(self.graph.nodes)
        out = self._trace(block, args)
        if key is not None and self.graph is graph:
            templates = self._store.templates
            if len(templates) >= MAX_TEMPLATES:
                templates.clear()           # rare: many distinct call shapes or blocks
            template = templates[key] = replay.capture(
                graph, start, arg_values, out, len(self.path) + 1, self._store.constant_ids,
                fuse=key[-2], whole_calls=key[-1], block_class=type(block).__name__)
            if template is not replay.UNTEMPLATABLE and (
                    template.fused or template.call is not None) and not any(
                    e[4].stateful for e in template.entries):
                # The traced nodes are unfused and would not batch with later
                # (replayed, fused) calls: replace them by a replay.  (Not
                # with stateful nodes, which are chained by recording order.)
                self._drop_ops_since(start)
                out = replay.replay(self, template, arg_values, self.path + (block.name,))
        return out

    def known_call(self, block, args):
        """Record ``block(*args)`` as one call node if its call shape is known; else None.

        The fast path of ``trace_block`` for what recursive models do at every
        tree node: call a cell whose template is one call node (``calls.py``)
        on values of this graph.  ``_remember_call`` files each such call
        shape (argument shapes, dtypes and aliasing) with the graph, whose
        parameters and constants the node reads; a hit skips flattening the
        arguments, building the full call key and the template lookup.
        Anything unusual (an argument that is not a value of this graph, a
        hook, a trace in progress, a changed autograd mode, the pending bound)
        is left to ``trace_block``.
        """
        graph = self.graph
        known = graph.known_calls
        if not known or self.tracing or self._mode_seen != _MODE_CHANGES[0] \
                or len(graph.nodes) >= self.max_pending \
                or block._forward_pre_hooks or block._forward_hooks:
            return None
        # One pass reads the arguments and builds the call shape (as
        # _remember_call files it), like row_concat's loop: a helper shared by
        # the two cost 0.4 ms a SICK batch (min of 30), so both stay inline.
        values = []
        key = [block]
        depth = 0
        for a in args:
            if type(a) is not LazyArray:
                return None
            node = a._node
            if node is None or node.graph is not graph:
                return None
            idx = a._idx
            values.append((node, idx))
            key.append(node.out_shapes[idx])
            key.append(node.out_dtypes[idx])
            if node.depth > depth:
                depth = node.depth
        if len(values) > 1 and len(set(values)) < len(values):
            key.append(replay.aliasing(values))
        found = known.get(tuple(key))
        if found is None:
            return None
        op, info, order, tail, sig, name = found
        # The node's inputs: its row and shared arguments (``order``; None when
        # they are the arguments in order), then the parameters and constants.
        inputs = values if order is None else [values[k] for k in order]
        inputs += tail
        node = known_node(graph, OP, op, inputs, (), NO_KWARGS, info, self.sample,
                          self.path + (name,))
        node.depth = depth + 1
        node.sig = sig
        graph.nodes.append(node)
        self.num_recorded += 1
        return calls.outputs(node, info)

    def _remember_call(self, block, template, arg_values):
        """File a replayed call node's shape for ``known_call`` (see there)."""
        op, info = template.call
        graph = self.graph
        _, external, sig = graph.externals[id(template)]
        if sig is None or info.out_kind is None or self.tracing:
            return
        refs = info.inputs
        order = [ref[1] for ref in refs if ref[0] == "a"]
        if any(ref[0] != "a" for ref in refs[:len(order)]):
            return
        tail = [external[ref[1]] for ref in refs[len(order):]]
        if order == list(range(len(arg_values))):
            order = None                # known_call passes the arguments as they are
        key = [block]               # the call shape, as known_call builds it
        for src, idx in arg_values:
            key.append(src.out_shapes[idx])
            key.append(src.out_dtypes[idx])
        if len(set(arg_values)) < len(arg_values):
            key.append(replay.aliasing(arg_values))
        graph.known_calls[tuple(key)] = (op, info, order, tail, sig, block.name)

    def _fuse(self):
        """Whether templates fuse row-wise runs (``fuse.py``): in imperative scopes.

        Fewer, larger nodes record and plan faster; compiled plans gain little
        from them, and their plan shapes repeat less across batches.
        """
        scope = getattr(self, "scope", None)
        return scope is None or not scope._compiled()  # pylint: disable=protected-access

    def _values_of(self, arrays):
        """``value_of`` of each array (inline for values of the current graph)."""
        graph = self.graph
        values = []
        for a in arrays:
            if type(a) is LazyArray:
                node = a._node
                if node is not None and node.graph is graph:
                    values.append((node, a._idx))
                    continue
            values.append(self.value_of(a))
        return values

    def _find_template_mode(self):
        """(fuse, whole_calls) for templates of calls recorded now.

        A call made while another child block is being traced is copied into
        that block's template: it stays operator by operator, so the outer
        template sees plain operators and can become one call node or fuse.
        Otherwise the scope's settings decide; they are fixed once the first
        DynBatchBlock has been called, and then kept in ``_template_mode``.
        """
        if self.tracing:
            return (False, False)
        mode = (self._fuse(), self._whole_calls())
        if self.owner is not None:
            self._template_mode = mode
        return mode

    def _reference(self):
        """Whether the scope runs the reference strategy: then every operator is
        recorded as it is called (no replay, fusion, whole calls or frames), so
        the oracle shares nothing with the batched path but the user's code."""
        scope = getattr(self, "scope", None)
        return scope is not None and scope._strategy() == "reference"  # pylint: disable=W0212

    def _whole_calls(self):
        """Whether templates that batch row by row become one node per call (``calls.py``).

        On unless the scope asks for ``granularity="op"`` or runs the
        reference strategy (the per-operator oracle).
        """
        scope = getattr(self, "scope", None)
        if scope is None:
            return True
        # pylint: disable=protected-access
        return scope._granularity() == "call" and scope._strategy() != "reference"

    def _drop_ops_since(self, start):
        """Remove the op and view nodes recorded since ``start`` (leaves stay)."""
        graph = self.graph
        added = graph.nodes[start:]
        del graph.nodes[start:]
        dropped = 0
        for node in added:
            if node.kind == LEAF:
                node.id = len(graph.nodes)
                graph.nodes.append(node)
            else:
                dropped += 1
        self.num_recorded -= dropped

    def _trace(self, block, args):
        """Run a child HybridBlock's hybrid_forward with recording F."""
        outer_path = self.path
        self.path = outer_path + (block.name,)
        self.tracing += 1
        cached_mode, self._template_mode = self._template_mode, None
        try:
            for hook in block._forward_pre_hooks.values():
                hook(block, args)
            params = {name: self.param(p) for name, p in block._reg_params.items()}
            out = block.hybrid_forward(self.F, *args, **params)
            for hook in block._forward_hooks.values():
                hook(block, args, out)
            return out
        finally:
            self.path = outer_path
            self.tracing -= 1
            self._template_mode = cached_mode


# Operators whose batching rule depends on autograd's training mode.
_MODAL = frozenset(["BatchNorm"])
# Operators that update state in training mode: kept in recording order.
_STATEFUL = frozenset(["BatchNorm"])


class Stand:
    """A value standing in as a node's output during a call's analysis."""

    __slots__ = ("out_shapes", "out_dtypes", "id", "param", "value", "kind", "depth")

    def __init__(self, shape, dtype, uid):
        self.out_shapes = (shape,)
        self.out_dtypes = (dtype,)
        self.id = -1 - uid
        self.param = self.value = None
        self.kind = OP
        self.depth = 0


def _Position(frame, pos):  # pylint: disable=invalid-name
    """Position ``pos`` of ``frame`` standing in as a node."""
    return Stand(frame.out_shapes[pos], frame.out_dtypes[pos], pos)


class CallInfo:
    """What the recorder learns once per call shape (operator, constants, input shapes).

    ``sig`` is the signature without the ids of shared inputs, which are
    added per node from ``shared_pos``; None means the node runs alone.
    """

    __slots__ = ("out_shapes", "out_dtypes", "attrs", "rule", "meta", "kind", "sig",
                 "shared_pos", "cacheable", "stateful")

    def __init__(self, node, key, cacheable):
        rule = node.rule
        self.stateful = node.op.name in _STATEFUL
        self.out_shapes, self.out_dtypes = node.out_shapes, node.out_dtypes
        self.attrs, self.meta, self.cacheable = node.attrs, node.meta, cacheable
        self.kind = VIEW if (rule.kind == "view" and key is not None) else OP
        self.shared_pos = ()
        self.rule = rule
        self.sig = None
        if key is None:
            self.rule = ALONE
            return
        if self.kind == VIEW:
            return
        if isinstance(key, tuple):
            self.shared_pos = tuple(k for k, part in enumerate(key)
                                    if isinstance(part, tuple) and part and part[0] == "shared")
            key = tuple(("shared",) if k in self.shared_pos else part
                        for k, part in enumerate(key))
        attrs = node.attrs if rule.keyed_attrs else None
        self.sig = (node.op.name, attrs, len(node.out_shapes), key)


_CALLS = {}
_ROW_SLICES = {}   # (begin, end, shape, dtype) -> (CallInfo, kwargs) of a row-slice view
_SLICE_AXIS = opdef("slice_axis")
_ONE_SLOT = (slot(0),)
_SLOTS_OF = {}              # n -> the n slots of an n-argument call
MAX_ROW_CONCAT = 4096       # longer row concatenations take the generic path


def slots_of(n):
    """The tuple ``(slot(0), ..., slot(n - 1))``, interned."""
    found = _SLOTS_OF.get(n)
    if found is None:
        found = _SLOTS_OF[n] = tuple(slot(k) for k in range(n))
    return found

_DIM0 = {"dim": 0}          # the kwargs of row concatenations (never mutated)
_DIM0_ITEMS = (("dim", 0),)

# Pending nodes after which a scope flushes by itself (about 1 KB each).
DEFAULT_MAX_PENDING = 500000

# Creation operators whose result depends only on their arguments.
_DETERMINISTIC = frozenset(["zeros", "ones", "full", "arange", "eye", "linspace",
                            "_zeros", "_ones", "_full", "_arange", "_eye", "_linspace"])
MAX_TEMPLATES = 4096
_STORES = threading.local()


class _ThreadStore:
    """Arrays a recorder reuses across scopes, kept per thread.

    Cached constants (``F.zeros`` ...) become inputs of autograd's graph when
    a batch runs; one NDArray recorded by two threads' autograd at once
    corrupts MXNet's bookkeeping, so every thread has its own constants, and
    its own replay templates (which refer to constants by array).
    """

    def __init__(self):
        self.constants = {}       # (path, args, kwargs, ctx) -> array(s)
        self.constant_ids = {}    # id -> array of those constants (kept alive above)
        self.templates = {}       # call shape -> replay Template, at most MAX_TEMPLATES
        self.frame_roots = {}     # (block, parameters, modes, replay) -> frames.State
        self.block_tokens = {}    # (id(block), parameters) -> small int (block_token)


def _thread_store():
    store = getattr(_STORES, "store", None)
    if store is None:
        store = _STORES.store = _ThreadStore()
    return store


_WARNED = set()


def _warn_running_statistics(node):
    """Say once per operator that running statistics may differ from eager."""
    if node.op.name in _WARNED:
        return
    _WARNED.add(node.op.name)
    log.warning(
        "%s in training mode runs one sample at a time (its statistics are per "
        "sample), so outputs and gradients are exact; but MXNet updates its running "
        "mean and variance during backward, in the order backward visits the calls, "
        "which batching can change: the running statistics may differ slightly from "
        "one-sample-at-a-time execution. strategy='unbatched' keeps eager's order.",
        node.op.name)


def _first_line(err):
    text = str(err).strip()
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("Stack trace"):
            if "Check failed" in line or "Error" in line or len(text.splitlines()) == 1:
                return line[:300]
    return text.splitlines()[0][:300] if text else type(err).__name__
