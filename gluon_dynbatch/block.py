"""DynBatchBlock: a HybridBlock whose ``hybrid_forward`` handles one sample."""
import mxnet as mx
from mxnet import gluon

from .plan import budget
from .record import _core, context, dispatch
from .record.recursion import helper_frames, recursive_closures, recursive_helpers
from .run.cache import PlanCache
from .run.choice import ExecutorChoice
from .scope import STRATEGIES, check_compiled, check_granularity, check_max_pending


_ASKS = {}      # class -> (its hybrid_forward, whether its code asks ``F is mx.nd``)


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
    compiled : bool, "plan" or "step", default False
        Run flushes as compiled MXNet graphs (CachedOp) kept in a plan cache:
        one graph per plan (``"plan"``) or one per step (``"step"``); ``True``
        chooses among these and imperative calls by what each costs this
        block (see :func:`batching`).
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
        self.executors = ExecutorChoice(self.name)     # for compiled=True
        self.compiled = check_compiled(compiled)
        self.plan_cache = PlanCache(max_cached_plans)
        check_max_pending(max_pending_nodes)
        self.max_pending_nodes = max_pending_nodes

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in recursive_helpers(vars(cls)):
            setattr(cls, name, helper_frames(vars(cls)[name]))
        if "hybrid_forward" in vars(cls):
            cls._closure_codes = recursive_closures(cls.hybrid_forward)

    _closure_codes = frozenset()     # recursive closures of ``hybrid_forward``

    @property
    def _asks_namespace(self):
        """Whether its code asks ``F is mx.nd`` (``dispatch.asks_namespace``):
        inside a scope it is given ``mx.nd`` itself.  Read at a call, once the
        module defining its helpers has run, and read again when its
        ``hybrid_forward`` is replaced (on the block, or its class)."""
        cls = type(self)
        own = self.__dict__.get("hybrid_forward")
        # (a method set on the block is kept as its function: not holding the block)
        current = dispatch.plain_function(own) if own is not None else cls.hybrid_forward
        found = _ASKS.get(cls)
        if found is None or found[0] is not current:
            asks = any(dispatch.asks_namespace(f) for f in dispatch.own_functions(cls)) \
                or own is not None and dispatch.asks_namespace(own)
            found = _ASKS[cls] = (current, asks)
        return found[1]

    def forward(self, *args):
        """Eager, one-sample call (outside a batching scope); traced into a
        symbol, as a HybridBlock's is, when a hybridized parent passes Symbols.

        A subclass may override it (preparing its inputs, then
        ``super().forward(...)``): inside a scope the override runs, and this
        records ``hybrid_forward``."""
        rec = context.TLS.recorder
        if rec is not None and rec.forwarding is self:
            return rec.forwarded(self, args)
        if any(isinstance(a, mx.sym.Symbol) for a in _flat(args)):
            params = {name: p.var() for name, p in self._reg_params.items()}
            with self.name_scope():
                return self.hybrid_forward(mx.sym, *args, **params)
        ctx = _context_of(args)
        params = {name: p.data(ctx) for name, p in self._reg_params.items()}
        return self.hybrid_forward(mx.nd, *args, **params)

    def export(self, path, epoch=0, remove_amp_cast=True):
        """Not possible: a DynBatchBlock's graph follows each sample's structure.

        Raises
        ------
        RuntimeError
            Always, naming what can be saved instead.
        """
        children = ", ".join(repr(name) for name in self._children) or "none"
        raise RuntimeError(
            "%s is a DynBatchBlock: its computation follows each sample's structure "
            "(recursion, loops in Python), so there is no one symbol to export; save its "
            "weights with save_parameters, or export its HybridBlock children one by one "
            "after hybridizing them (its children: %s)" % (self.name, children))

    records_frames = True       # its calls are frames (``record.dispatch``)

    def _record_call(self, rec, args):
        return dispatch.record_call(self, rec, args)

    def _record_helper(self, rec, function, args, kwargs):
        return dispatch.record_helper(self, rec, function, args, kwargs)



def _flat(args):
    for a in args:
        if isinstance(a, (list, tuple)):
            yield from a
        else:
            yield a


def _context_of(args):
    for a in args:
        if isinstance(a, mx.nd.NDArray):
            return a.context
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, mx.nd.NDArray):
                    return b.context
    return mx.current_context()


_core.bind_forward(DynBatchBlock.forward, mx.nd, _ASKS)
