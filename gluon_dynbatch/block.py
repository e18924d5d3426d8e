"""DynBatchBlock and the interception of block calls inside a scope."""
import logging

import mxnet as mx
from mxnet import gluon

from . import budget, context
from .cache import PlanCache
from .errors import BatchingError, describe_call
from .frames import NOT_RECORDED, Frame
from .lazy import LazyArray
from .recursion import (helper_frames, recursive_closures, recursive_helpers, stop_watching,
                        watch_closures)
from .scope import STRATEGIES, check_granularity

log = logging.getLogger(__name__)


class DynBatchBlock(gluon.HybridBlock):
    """A HybridBlock whose ``hybrid_forward`` handles one sample in plain Python.

    Outside :func:`batching` a call runs eagerly with ``F = mx.nd``, like any
    Gluon block.  Inside, the calls of all samples are recorded and run batched
    when the scope ends.  ``hybrid_forward(self, F, *args)`` may take any mix of
    NDArrays and Python objects (trees, ints, lists of arrays) and may call the
    block itself recursively.

    Parameters
    ----------
    strategy : str, default "depth"
        Planning strategy: ``"depth"`` (Fold: one step per depth and signature;
        the cheapest to plan), ``"agenda"`` (DyNet's agenda), ``"unbatched"`` or
        ``"reference"``.
    analysis_budget : float or "auto", optional
        Seconds of planning per flush spent trying strategies besides the
        depth plan (see :func:`batching`); ``"auto"`` searches only where the
        depth plan is above its lower bound.  None (the default) is ``"auto"``
        with ``strategy="depth"`` and no search with the others; 0 never searches.
    compiled : bool or "step", default False
        Run flushes as compiled MXNet graphs (CachedOp) kept in a plan cache:
        one graph per plan (``True``) or one per step (``"step"``).
    max_cached_plans : int, default 64
        Bound of this block's plan cache (least recently used plans go first).
    max_pending_nodes : int, optional
        Bound on recorded, not yet executed nodes of a scope this block starts
        (see :func:`batching`; default 500,000).
    granularity : {"call", "op"}, default "call"
        Record each child-block call that batches row by row as one node
        (``"call"``) or always operator by operator (see :func:`batching`).
    **kwargs
        Passed to ``gluon.HybridBlock`` (``prefix``, ``params``).
    """

    def __init__(self, strategy="depth", analysis_budget=None, compiled=False,
                 max_cached_plans=64, max_pending_nodes=None, granularity="call",
                 **kwargs):
        super().__init__(**kwargs)
        check_granularity(granularity)
        self.granularity = granularity
        if strategy not in STRATEGIES:
            raise ValueError("unknown strategy %r; choose one of %s" % (strategy, STRATEGIES))
        self.strategy = strategy
        if analysis_budget is not None:
            budget.resolve_budget(analysis_budget)       # validates
        self.analysis_budget = analysis_budget
        self.recent_execute_s = None        # smoothed, for analysis_budget="auto"
        self.plan_memory = budget.new_memory()  # plan structure -> winning planner
        self.reads_inside = False           # its samples read values (``BatchingScope.read``)
        self.whole_plans = 0                # compiled=True flushes counted, and those
        self.whole_plan_misses = 0          # that met a new plan (``scope._whole_plans_repeat``)
        self.compiled = compiled
        self.plan_cache = PlanCache(max_cached_plans)
        if max_pending_nodes is not None and max_pending_nodes < 1:
            raise ValueError("max_pending_nodes must be at least 1, got %r"
                             % (max_pending_nodes,))
        self.max_pending_nodes = max_pending_nodes

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in recursive_helpers(vars(cls)):
            setattr(cls, name, helper_frames(vars(cls)[name]))
        if "hybrid_forward" in vars(cls):
            cls._closure_codes = recursive_closures(cls.hybrid_forward)

    _closure_codes = frozenset()     # recursive closures of ``hybrid_forward``

    def forward(self, *args):
        """Eager, one-sample call (outside a batching scope)."""
        ctx = _context_of(args)
        params = {name: p.data(ctx) for name, p in self._reg_params.items()}
        return self.hybrid_forward(mx.nd, *args, **params)

    def _record_call(self, rec, args):
        top = rec.depth == 0
        if top and rec.eager:
            return self._eager_call(rec, args)
        if top:
            rec.sample = rec.num_samples
            rec.num_samples += 1
            if getattr(rec, "strategy", None) is None:
                rec.strategy = self.strategy
                rec.compiled = self.compiled
                rec.cache = self.plan_cache
                rec.owner = self
                if self.max_pending_nodes is not None and rec.scope is not None \
                        and rec.scope.max_pending_nodes is None:
                    rec.max_pending = self.max_pending_nodes
            args = rec.wrap_arguments(args)
        rec.depth += 1
        outer_path = rec.path
        rec.path = outer_path + (self._name,)
        outer_frame = rec.frame
        frame = None
        if rec.frames_on():
            root = rec.frame_root(self)
            if not root.usage.irregular:
                frame = Frame(rec, root, self, rec.path)
            elif not root.usage.told:
                root.usage.told = True
                log.info("%s: calls take a new path through the code almost every time (a "
                         "structure of each sample's own); recording them operator by operator",
                         type(self).__name__)
        rec.frame = frame
        tracer = watch_closures(self, self._closure_codes) \
            if self._closure_codes and rec.frames_on() else None
        try:
            if not self._reg_params:        # a recursive model's own block often has none
                out = self.hybrid_forward(rec.F, *args)
            else:
                out = self.hybrid_forward(rec.F, *args, **rec.params_of(self))
            if frame is not None:
                frame.finish()              # ``out`` holds what the call returns
            return out
        except BatchingError:
            raise
        except Exception as err:
            if top and hasattr(err, "add_note"):
                err.add_note("gluon_dynbatch: raised while recording %s"
                             % describe_call(rec.sample, rec.path))
            raise
        finally:
            stop_watching(tracer)
            rec.frame = outer_frame
            rec.depth -= 1
            rec.path = outer_path
            if top:
                rec.sample = None

    def _record_helper(self, rec, function, args, kwargs):
        """One call of a recursive helper method or closure inside a frame: a frame
        of its own, as ``self(...)`` would be (see ``recursion.py``)."""
        root = rec.frame_root(self, function.__code__)
        outer_path, outer_frame = rec.path, rec.frame
        rec.path = outer_path + (function.__name__,)
        frame = None if root.usage.irregular else Frame(rec, root, self, rec.path)
        rec.frame = frame
        try:
            out = function(*args, **kwargs)
            if frame is not None:
                frame.finish()              # ``out`` holds what the call returns
            return out
        finally:
            rec.frame = outer_frame
            rec.path = outer_path

    def _eager_call(self, rec, args):
        """One sample run eagerly inside a scope that stopped recording (see
        ``BatchingScope.read``)."""
        stats = rec.scope.stats
        stats.samples += 1
        stats.eager_samples += 1
        context.set_current(None)
        try:
            return _ORIGINAL_CALL(self, *args)
        finally:
            context.set_current(rec)


def _context_of(args):
    for a in args:
        if isinstance(a, mx.nd.NDArray):
            return a.context
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, mx.nd.NDArray):
                    return b.context
    return mx.current_context()


def _has_lazy(args):
    for a in args:
        if isinstance(a, LazyArray):
            return True
        if isinstance(a, (list, tuple)) and _has_lazy(a):
            return True
    return False


_KINDS = {}     # block class -> how its calls are recorded (asked on every call)
_DYNBATCH, _TRACED, _CELL, _OPAQUE, _PLAIN = "dynbatch", "traced", "cell", "opaque", "plain"

# ``forward`` methods that only wrap ``hybrid_forward``: HybridBlock's own,
# and Gluon's recurrent cells' (which count their calls first).
_WRAPPERS = {gluon.HybridBlock.forward: _TRACED,
             gluon.rnn.rnn_cell.RecurrentCell.forward: _CELL}
# Cells whose ``hybrid_forward`` keeps state in the block between calls
# (ZoneoutCell remembers its previous output): run on concrete values.
STATEFUL_CELLS = (gluon.rnn.ZoneoutCell,)


def _kind(cls):
    """How calls of blocks of class ``cls`` are recorded inside a scope.

    DynBatchBlocks start frames.  A HybridBlock whose ``forward`` merely
    wraps ``hybrid_forward`` (HybridBlock's own: layers, containers,
    hybridized blocks; or a Gluon recurrent cell's) is traced: its
    ``hybrid_forward`` runs with the recording ``F``.  Other HybridBlocks
    (an overridden ``forward``, ``SymbolBlock``, the cells of
    ``STATEFUL_CELLS``) are opaque: they run on concrete values.  Plain
    Blocks run as they are.
    """
    found = _KINDS.get(cls)
    if found is None:
        if issubclass(cls, DynBatchBlock):
            found = _DYNBATCH
        elif issubclass(cls, gluon.HybridBlock):
            found = _WRAPPERS.get(cls.forward, _OPAQUE)
            if cls.hybrid_forward is gluon.HybridBlock.hybrid_forward \
                    or issubclass(cls, STATEFUL_CELLS):
                found = _OPAQUE
        else:
            found = _PLAIN
        _KINDS[cls] = found
    return found


_ORIGINAL_CALL = gluon.Block.__call__


def _dispatching_call(self, *args):
    """``Block.__call__`` that records inside a batching scope."""
    rec = context.TLS.recorder
    if rec is None:
        return _ORIGINAL_CALL(self, *args)
    kind = _KINDS.get(type(self)) or _kind(type(self))
    if kind is _DYNBATCH:
        return self._record_call(rec, args)  # pylint: disable=protected-access
    if kind is _CELL:
        self._counter += 1          # as RecurrentCell.forward counts its calls
        kind = _TRACED
    hooked = kind is not _PLAIN and (self._forward_pre_hooks or self._forward_hooks)
    frame = rec.frame
    if frame is not None and kind is not _PLAIN:
        if kind is _TRACED and not hooked:
            out = frame.block_call(self, args)
            if out is not NOT_RECORDED:
                return out
        frame.fallback("a child block that templates cannot hold")
    if kind is _TRACED and _has_lazy(args):
        if rec.frames_on() and not hooked:
            return rec.block_frame(self, args)
        return rec.trace(self, args)
    if kind is _OPAQUE and _has_lazy(args):
        # Opaque block (SymbolBlock, custom forward): run it on concrete values.
        return rec.wrap_inputs(_ORIGINAL_CALL(self, *args))
    return _ORIGINAL_CALL(self, *args)


gluon.Block.__call__ = _dispatching_call

_ORIGINAL_BEGIN_STATE = gluon.rnn.RecurrentCell.begin_state


def _begin_state(self, batch_size=0, func=None, **kwargs):
    """``RecurrentCell.begin_state`` whose zeros, inside a DynBatchBlock call, are
    recorded ``F.zeros``: one constant per graph that every sample shares.

    Gluon's default, ``mx.nd.zeros``, makes new arrays at every call (tens of
    microseconds each, once per sentence or tree node).  Outside a model's
    call, or with ``func`` given, it is Gluon's own.
    """
    if func is None:
        rec = context.TLS.recorder
        recording = rec is not None and not rec.eager and rec.depth > 0
        func = rec.F.zeros if recording else mx.nd.zeros
    return _ORIGINAL_BEGIN_STATE(self, batch_size, func=func, **kwargs)


gluon.rnn.RecurrentCell.begin_state = _begin_state
_ORIGINAL_LAYER_BEGIN_STATE = gluon.rnn.rnn_layer._RNNLayer.begin_state


def _layer_begin_state(self, batch_size=0, func=mx.nd.zeros, **kwargs):
    """The same for Gluon's fused RNN layers (``rnn.LSTM``, ``GRU``, ``RNN``),
    which make their zeros with ``mx.nd.zeros`` when called without states."""
    if func is mx.nd.zeros:
        rec = context.TLS.recorder
        if rec is not None and not rec.eager and rec.depth > 0:
            func = rec.F.zeros
    return _ORIGINAL_LAYER_BEGIN_STATE(self, batch_size, func=func, **kwargs)


gluon.rnn.rnn_layer._RNNLayer.begin_state = _layer_begin_state
_ORIGINAL_LAYER_FORWARD = gluon.rnn.rnn_layer._RNNLayer.hybrid_forward


class _OutputsOnly:
    """The recording ``F`` for a fused RNN layer called without states: its
    ``F.RNN`` makes no state outputs, which the layer would drop anyway, so
    that calls on sentences of different lengths can share one padded call
    (``layer_rules.PaddedRNNRule``)."""

    def __init__(self, F):
        self._F = F

    def __getattr__(self, name):
        return getattr(self._F, name)

    def RNN(self, *args, **kwargs):  # pylint: disable=invalid-name
        """``F.RNN`` with ``state_outputs=False``; the layer reads [outputs, states...]."""
        kwargs["state_outputs"] = False
        return [self._F.RNN(*args, **kwargs), None, None]


class _LastStepState(_OutputsOnly):
    """The recording ``F`` for a one-layer fused RNN layer given states: its
    outputs come from a call without state outputs (one padded call for
    sentences of every length) and its final hidden state is their last step
    (and, bidirectional, the backward half of their first), the same values;
    the call with state outputs (a call per length) stays for the other states
    (an LSTM's cell state), computed only if held."""

    def RNN(self, *args, **kwargs):  # pylint: disable=invalid-name
        full = self._F.RNN(*args, **kwargs)
        outputs = super().RNN(*args, **kwargs)[0]
        steps, F = args[0].shape[0], self._F
        last = F.slice_axis(outputs, axis=0, begin=steps - 1, end=steps)
        if kwargs.get("bidirectional"):
            hidden = outputs.shape[2] // 2
            first = F.slice_axis(outputs, axis=0, begin=0, end=1)
            last = F.concat(F.slice_axis(last, axis=2, begin=0, end=hidden),
                            F.slice_axis(first, axis=2, begin=hidden, end=2 * hidden), dim=0)
        return [outputs, last] + list(full[2:])


def _layer_hybrid_forward(self, F, inputs, states, sequence_length=None, **kwargs):
    rec = context.TLS.recorder
    if rec is not None and F is rec.F:
        if self.skip_states:
            F = _OutputsOnly(F)
        elif self._num_layers == 1 and not self._dropout \
                and self._projection_size is None and sequence_length is None:
            F = _LastStepState(F)
    return _ORIGINAL_LAYER_FORWARD(self, F, inputs, states, sequence_length, **kwargs)


gluon.rnn.rnn_layer._RNNLayer.hybrid_forward = _layer_hybrid_forward
