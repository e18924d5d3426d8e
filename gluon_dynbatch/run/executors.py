"""Running: the walked plan as batched MXNet calls.

Three executors, chosen by ``compiled`` (see ``batching``):

* :func:`run_interpreted`: every step an imperative MXNet call (a program
  step through its cached CachedOp);
* :func:`run_compiled`: the whole plan one symbol, run as a CachedOp kept in
  a plan cache by the plan's structure key;
* :func:`run_steps`: each step, its gathers included, one cached CachedOp.

All three read the :class:`lowering.Lowering`'s walk: every index array reaches
MXNet in one copy, and the live values get their rows at the end.
"""
import contextlib
import os
import threading
import time

import mxnet as mx
import numpy as np
from mxnet import autograd
from mxnet.base import MXNetError

from .lowering import Lowering, dtype_name, leaf_value, reused_constants, step_name
from ..ir.graph import LEAF
from ..errors import BatchingError, describe_call
from ..logs import warn_once
from ..ir.ops import first_line
from ..ir.known import constant_array, row_slice
from ..ir.rules import KNOWN, ZERO_GRADIENT_INPUTS, call_as_recorded, keeps_outputs, \
    zero_gradient

_NO_CHANGE = contextlib.nullcontext()

# MXNet 1.9.1's static memory planning (CachedOp ``static_alloc``) returned
# wrong gradients for a whole-plan graph that hypothesis found (a value read
# by tanh and reverse, or tanh and cumsum, besides gathers): the same symbol
# without it is exact.  Exactness comes first, so no CachedOp here uses it
# (tests/test_fuzz.py::test_regression_static_alloc_gradient keeps that case).
STATIC_ALLOC = os.environ.get("GDB_STATIC_ALLOC", "0") == "1"


def cached_op(symbol, flags=()):
    """``mx.nd.CachedOp(symbol)`` with this package's flags (see ``STATIC_ALLOC``)."""
    return mx.nd.CachedOp(symbol, list(flags) + [("static_alloc", STATIC_ALLOC)])


def plan_symbol(walk):
    """The symbol of a walked plan (``lowering.Lowering``; on a cache miss), and
    the names of its inputs a gradient flows back to from a delivered output
    (``_CUTS``: not through ``detach()``)."""
    syms = {}
    reach = {}          # sid or var name -> the input names it has a gradient path to

    def source(sid):
        found = syms.get(sid)
        if found is None:
            found = syms[sid] = mx.sym.var("s%d" % sid)
            reach[sid] = frozenset(("s%d" % sid,))
        return found

    def gather(desc):
        if desc[0] == "direct":
            return source(desc[1])
        if desc[0] == "direct_var":
            return mx.sym.var(desc[1])
        _, sids, name = desc
        table = source(sids[0]) if len(sids) == 1 else mx.sym.concat(
            *[source(s) for s in sids], dim=0)
        return mx.sym.take(table, mx.sym.var(name), axis=0)

    def reached(desc):
        if desc[0] == "direct_var":
            return frozenset((desc[1],))
        return frozenset().union(*[reach[sid] for sid in (
            (desc[1],) if desc[0] == "direct" else desc[1])])

    kept = []
    for kind, node0, ins, outs, _, variant in walk.steps:
        inputs = [gather(d) for d in ins]
        if kind == "program":       # per output: the inputs it reads not through detach()
            paths = [frozenset().union(*[reached(ins[k]) for k in reads])
                     for reads in _program_reads(node0.op, len(outs))]
        else:
            cut = range(len(ins)) if node0.op.name in _CUTS else ()
            paths = [frozenset().union(*[reached(d) for k, d in enumerate(ins)
                                         if k not in cut])] * len(outs)
        if kind == "program":
            inputs = _detached_program_inputs(node0, inputs)
        if kind == "alone":
            results = call_as_recorded(mx.sym, node0, inputs)
        elif kind == "program":
            results = node0.op.batched(mx.sym, inputs, variant)
        else:
            results = node0.rule.batched_call(mx.sym, node0, inputs)
        if kind == "program":
            kept.extend(results[len(outs):])    # (``Program.batched``'s kept outputs)
        elif keeps_outputs(node0.op.name, node0.kwargs):
            kept.extend(results)
        for sid, sym, path in zip(outs, results, paths):
            syms[sid] = sym
            reach[sid] = path
    delivered = [gather(desc) for desc, _ in walk.outputs]
    paths = frozenset().union(*[reached(desc) for desc, _ in walk.outputs])
    # Outputs after those delivered are not delivered (``Lowering.deliver``).
    return mx.sym.Group(delivered + kept), paths


#: Operators through which no gradient flows back (``x.detach()``): eager's
#: backward does not reach what they read, so neither writes a gradient there.
_CUTS = frozenset(("BlockGrad", "stop_gradient"))


def _program_reads(program, count):
    """Per output of ``program`` (its first ``count`` exports), the positions of
    the inputs it reads other than through ``detach()``: zero-gradient calls
    (``argmax``) are read through, as eager's backward reaches their inputs."""
    found = []
    for j, _ in program.exports[:count]:
        stack, seen, positions = [j], set(), set()
        while stack:
            k = stack.pop()
            if k in seen:
                continue
            seen.add(k)
            entry = program.entries[k]
            if entry.op.name in _CUTS:
                continue
            for source in entry.sources:
                if source[0] == "in":
                    positions.add(source[1])
                else:
                    stack.append(source[1])
        found.append(sorted(positions))
    return found


def _unread_program_inputs(node0, count, outputs):
    """The inputs of a program step no output reads other than through
    ``detach()`` (``_program_reads``): a step's CachedOp would write them a zero
    gradient, marked fresh, where eager's backward does not reach them."""
    read = set()
    for reads in _program_reads(node0.op, outputs):
        read.update(reads)
    return frozenset(range(count)) - read


# Operators MXNet runs and then refuses for their values (a matrix that is not
# positive definite, a singular one, an index out of range, a custom operator's
# own check): the error surfaces when an array that depends on the output is
# read, once; a batched step reading several samples' outputs would then hand
# the others values never written.
REFUSES_VALUES = frozenset(
    [prefix + name for name in ("potrf", "potri", "inverse", "gelqf", "syevd")
     for prefix in ("", "linalg_", "_linalg_")] + ["gather_nd", "Custom"])


def _calls_of(node):
    """``(operator name, kwargs)`` of the calls ``node`` runs: a program's, else its own."""
    entries = getattr(node.op, "entries", None)
    if entries is not None:
        return [(entry.op.name, entry.kwargs) for entry in entries]
    return [(node.op.name, node.kwargs)]


def _may_refuse(node):
    return any(_refuses(name, kwargs) for name, kwargs in _calls_of(node))


def _refuses(name, kwargs):
    """Whether a call of operator ``name`` may refuse its values (``REFUSES_VALUES``,
    or ``take`` of indices out of range with ``mode="raise"``).  ``Custom``: a
    Python operator whose ``forward`` raises for some values."""
    return name in REFUSES_VALUES or name == "take" and (kwargs or {}).get("mode") == "raise"


# What MXNet raises for an operator's error (``mxnet.error``: an error of C++'s
# ``IndexError: ...`` is Python's ``IndexError``, not an ``MXNetError``).
ENGINE_ERRORS = (MXNetError, ValueError, TypeError, AttributeError, IndexError,
                 NotImplementedError)


def check_refused_values(plan, only_read=False, gathered=()):
    """Before a plan's values are handed out: if it ran an operator that may
    refuse its values, wait for them, and raise a ``BatchingError`` naming its
    calls if MXNet refused any (the scope's values then raise, none is read
    unwritten).

    ``only_read``: only where a later step reads such a call's output or the
    step ran several samples' calls; a call run alone whose output is handed
    out as it is keeps MXNet's error for its own sample's read, as eagerly
    (a flush for samples waiting at reads, whose values are each handed out
    as rows of their steps' outputs; at other flushes outputs of several
    steps are gathered into one array, which the error would reach), and
    where it is not among the ``gathered`` nodes (handed out in one array with
    other values) and no program step runs after it (MXNet hands a pending
    error to the next CachedOp run with ``static_alloc``, whatever its inputs:
    another sample's program would give out values never written)."""
    steps = [step for step in plan.steps if _may_refuse(step.nodes[0])]
    if steps and only_read:
        read = {src for step in plan.steps for node in step.nodes for src, _ in node.inputs}
        last_program = max((k for k, step in enumerate(plan.steps)
                            if getattr(step.nodes[0].op, "entries", None) is not None),
                           default=-1)
        at = {id(step): k for k, step in enumerate(plan.steps)}
        steps = [step for step in steps if len(step.nodes) > 1 or step.nodes[0] in read
                 or step.nodes[0] in gathered or at[id(step)] < last_program
                 or _custom(step.nodes[0])]
    nodes = [step.nodes[0] for step in steps]
    if not nodes:
        return
    try:
        mx.nd.waitall()
    except ENGINE_ERRORS as err:
        culprit = _refused_call(steps)
        if culprit is not None:
            raise BatchingError(
                "%s: MXNet refused its values (%s); no value of the samples batched with "
                "it is given out, where eager code raises when this sample's values are "
                "read: check its inputs, or run such samples with strategy='reference'" % (
                    describe_call(culprit.sample, culprit.path, _call_name(culprit)),
                    first_line(err))) from None
        samples = sorted({n.sample for step in plan.steps for n in step.nodes
                          if _may_refuse(n) and n.sample is not None})
        where = describe_call(nodes[0].sample, nodes[0].path, nodes[0].op.name)
        raise BatchingError(
            "calls like %s, of samples %s: MXNet refused the values of one of them (%s); "
            "no value of these samples is given out, where eager code raises when the "
            "values of the sample at fault are read: check its inputs, or run such "
            "samples with strategy='reference'" % (
                where.split(", in ", 1)[-1], samples, first_line(err))) from None


def _custom(node):
    """Whether ``node`` runs a custom operator: its error is the engine's, not its
    output's (MXNet raises it at the next wait, whatever is read)."""
    return any(name == "Custom" for name, _ in _calls_of(node))


def _call_name(node):
    """The operator of ``node`` that may refuse its values (of a program, the
    first of its calls that may)."""
    return next((name for name, kwargs in _calls_of(node) if _refuses(name, kwargs)),
                getattr(node.op, "name", "") or "")


def _refused_call(steps):
    """The first call of ``steps`` whose values MXNet refuses when it runs by
    itself, as eager code ran it (outside autograd: only the values matter),
    or None: the sample at fault, for the error."""
    values = {}
    constants = reused_constants()

    def value(src, idx):
        key = (src, idx)
        if key not in values:
            if src.kind == LEAF:
                values[key] = leaf_value(src, constants) if src.value is not None \
                    else src.param.data()
            else:
                inputs = [value(s, i) for s, i in src.inputs]
                for j, array in enumerate(call_as_recorded(mx.nd, src, inputs)):
                    values[(src, j)] = array
        return values[key]

    with autograd.pause():
        for step in steps:
            for node in step.nodes:
                try:
                    value(node, 0)
                    mx.nd.waitall()
                except ENGINE_ERRORS:
                    return node
                except Exception:       # pylint: disable=broad-except
                    return None         # (a value this search cannot rebuild)
    return None


def run_interpreted(plan, live, ctx, rows_out=False):
    """Run ``plan`` imperatively from the compiler's walk (batched nd calls).

    The walk computes every gather's indices before anything runs, so they
    reach MXNet in one copy; single-node steps run exactly as recorded.
    ``rows_out``: hand the values out as rows of the steps' outputs (a flush
    for samples waiting at a read, whose next segments read them).
    """
    walker = Lowering(ctx, slices=True, rows_out=rows_out)
    walker.walk(plan, live)
    feeds = walker.feed_arrays()
    values = {}
    detached = []
    for kind, node0, ins, outs, count, variant in walker.steps:
        zero = zero_gradient(node0.op.name, node0.args, node0.kwargs)
        with autograd.pause() if zero else _NO_CHANGE, _naming_step(node0, count):
            detach = range(len(ins)) if zero else node0.op.detached if kind == "program" \
                else _zero_gradient_positions(kind, node0, len(ins))
            if detach:
                detached.append((ins, detach))
            inputs = [_gather_detached(d, values, feeds) if k in detach
                      else _gather(d, values, feeds) for k, d in enumerate(ins)]
            if kind == "program":
                results = run_program(node0.op, inputs, variant, walker.ctx)
            elif kind == "alone" or count == 1 and KNOWN not in node0.meta:
                results = call_as_recorded(mx.nd, node0, inputs[:len(node0.inputs)])
            else:
                results = node0.rule.batched_call(mx.nd, node0, inputs)
        for sid, array in zip(outs, results):
            values[sid] = array
    results = [_gather(desc, values, feeds) for desc, _ in walker.outputs]
    gathered = {node for desc, members in walker.outputs if desc[0] != "rows"
                and len(members) > 1 for node, _, _ in members} if rows_out else ()
    check_refused_values(plan, only_read=rows_out, gathered=gathered)
    walker.deliver(_with_history(results, detached, values, feeds),
                   _gather_sources(walker.outputs, values))


def _zero_gradient_positions(kind, node0, count):
    """The positions, among the ``count`` gathered inputs of a step of ``kind``
    whose first node is ``node0``, of the inputs whose gradient is zero
    (``ZERO_GRADIENT_INPUTS``: an index, a shape).  A batched step gathers the
    node's inputs in order but those its rule reads itself (``KNOWN``); an
    optional input not given (``SequenceReverse`` without lengths) is none."""
    slots = ZERO_GRADIENT_INPUTS.get(node0.op.name, ())
    if not slots:
        return ()
    roles = node0.meta if kind != "alone" and node0.meta else ()
    found, position = [], 0
    for k in range(len(node0.inputs)):
        if k < len(roles) and roles[k] == KNOWN:
            continue
        if k in slots and position < count:
            found.append(position)
        position += 1
    return tuple(found)


def _gather_sources(outputs, values):
    """Per output group, the step outputs its gather reads (each source of a
    take, the whole output of a slice; per member of a "rows" group, its step
    output); None unless autograd records (``lazy.Rows.sources``)."""
    if not autograd.is_recording():
        return None
    found = []
    for desc, _ in outputs:
        kind = desc[0]
        if kind == "rows":
            found.append([values[sid] for sid, _, _ in desc[1]])
        elif kind == "direct_var":
            found.append([])
        else:
            sids = desc[1] if kind == "take" else (desc[1],)
            found.append([values[sid] for sid in sids if sid in values])
    return found


def _with_history(results, detached, values, feeds):
    """``results`` where each that autograd would leave without history is tied
    to the inputs of the steps run without it (``detached``: ``(inputs, slots)``)
    by a zero: ``x + sum(0 * input)``, non-finite elements of ``input`` masked.

    Steps of zero-gradient operators (``argmax``, comparisons) run outside
    autograd (``_gather_detached``).  A result computed from them alone would
    carry no history, where eager's has some (its gradient zero): a loss of
    such results alone then fails in ``backward()`` ("not in a computational
    graph") instead of giving the weights a zero gradient as eager does.  The
    zero reaches the inputs' gathers as an array, which MXNet's backward
    survives (a missing gradient there it does not: see ``_gather_detached``).
    """
    if not detached or not autograd.is_recording():
        return results
    return _tied(results, lambda: (_gather(ins[k], values, feeds)
                                   for ins, slots in detached for k in slots))


def _tied(results, inputs):
    """``results``, those without history tied by a zero to the arrays
    ``inputs()`` gives (``_with_history``)."""
    anchor = []
    seen = {}               # id(array) -> it tied: a step's output serves many results

    def tied(array):
        found = seen.get(id(array))
        if found is not None:
            return found[1]
        # (Boolean results stay as they are: MXNet adds no booleans, and no
        # gradient flows through them.)
        if array.dtype != np.bool_ and constant_array(array) \
                and _anchor(anchor, inputs) is not None:
            seen[id(array)] = (array, mx.nd.broadcast_add(array, anchor[0].astype(array.dtype)))
        else:
            seen[id(array)] = (array, array)
        return seen[id(array)][1]

    out = []
    for array in results:
        if isinstance(array, list):         # a "rows" output: (array, begin, end)
            array = [(tied(a), begin, end) for a, begin, end in array]
        else:
            array = tied(array)
        out.append(array)
    return out


def _anchor(anchor, inputs):
    """The zero tying results to the arrays ``inputs()`` gives (inputs run
    without history), made once into ``anchor``; None when no input is floating
    (integer inputs, a segment's positions, carry no gradient, and ``add_n``
    takes one dtype)."""
    if not anchor:
        # ``mx.nd``, not ``part * 0``: an input may be a value of an earlier
        # flush (a LazyArray), whose operators this scope would record.
        parts = [_zero_of(part) for part in inputs()
                 if np.issubdtype(part.dtype, np.floating)]
        anchor.append(None if not parts else
                      mx.nd.add_n(*parts) if len(parts) > 1 else parts[0])
    return anchor[0]


def _zero_of(part):
    """A float32 zero computed from floating ``part``, its gradient an array.

    Zero times a NaN or inf in one sample's input is NaN, which would reach
    every sample's result: those elements are replaced first, by a mask made
    without history.  (``zeros_like`` gives no gradient array: MXNet's
    backward crashed on the gathers it reached.)
    """
    with autograd.pause():
        # Operators, not ``mx.nd.contrib.isfinite`` (Python's ``==`` on a
        # LazyArray is recorded): ``|x| <= max`` is false at NaN and inf.
        finite = mx.nd._internal._lesser_equal_scalar(  # pylint: disable=protected-access
            mx.nd.abs(part), scalar=float(np.finfo(part.dtype).max))
    return mx.nd.sum(mx.nd.multiply(mx.nd.where(finite, part, finite), 0)).astype("float32")


@contextlib.contextmanager
def _naming_step(node0, count):
    """Name the step's calls (the first one's sample and block) in an MXNet error
    raised while it runs."""
    try:
        yield
    except MXNetError as err:
        what = "program " if node0.op.path is None else ""
        raise BatchingError(
            "running the batched plan failed at a step of %d call%s of %s%s, the first %s: %s"
            % (count, "s" if count > 1 else "", what, node0.op.name,
               describe_call(node0.sample, node0.path), first_line(err))) from err


def run_program(program, inputs, variant, ctx):
    """``program.batched`` on ``inputs`` through a CachedOp kept per thread,
    variant and context (``Program.compiled``)."""
    cache = getattr(program.compiled, "ops", None)
    if cache is None:
        cache = program.compiled.ops = {}
    key = (variant, str(ctx))
    op = cache.get(key)
    if op is None:
        names = ["x%d" % k for k in range(len(inputs))]
        outs = program.batched(mx.sym, [mx.sym.var(n) for n in names], variant)
        symbol = mx.sym.Group(outs)
        order = [names.index(n) for n in symbol.list_inputs()]
        op = cache[key] = (cached_op(symbol), order)
    cached, order = op
    out = cached(*[inputs[k] for k in order])
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _gather_detached(desc, values, feeds):
    """``_gather`` outside autograd: for a program input that only zero-gradient
    entries read (``zeros_like``, ``BlockGrad``, comparisons: ``Program.detached``).

    Its gradient is zero.  MXNet 1.9's imperative backward crashes (segfault)
    when the only gradient reaching a ``take`` of a ``concat`` is such a zero,
    so the input carries no history: neither the gathered copy nor an earlier
    step's output passed whole (rows an earlier step gathered, stacked index
    arrays for ``gather_nd``).
    """
    with autograd.pause():
        return _gather(desc, values, feeds).detach()


def _gather(desc, values, feeds):
    """The array a gather description stands for, run imperatively.

    ``values`` holds the step outputs computed so far by source id; leaves and
    index arrays are in ``feeds``.
    """
    kind = desc[0]
    if kind == "direct":
        sid = desc[1]
        return values[sid] if sid in values else feeds["s%d" % sid]
    if kind == "direct_var":
        return feeds[desc[1]]
    if kind == "rows":                  # delivered as rows of step outputs, not gathered
        return [(values[sid], begin, end) for sid, begin, end in desc[1]]
    if kind == "slice":
        return row_slice(_gather(("direct", desc[1]), values, feeds), desc[2], desc[3])
    sources = [_gather(("direct", sid), values, feeds) for sid in desc[1]]
    table = sources[0] if len(sources) == 1 else _concat_rows(sources)
    return mx.nd.take(table, feeds[desc[2]], axis=0)


def _concat_rows(arrays):
    """``arrays`` concatenated along axis 0; booleans as bytes (MXNet 1.9.1's
    ``concat`` has no boolean kernel, ``take`` and ``cast`` have)."""
    if arrays[0].dtype != np.bool_:
        return mx.nd.concat(*arrays, dim=0)
    return mx.nd.concat(*[a.astype("uint8") for a in arrays], dim=0).astype("bool")


class CompiledPlan:
    """A CachedOp and the order of its inputs.

    The plan cache shares it between threads; MXNet 1.9.1's CachedOp fails
    ("Graph attr dependency shape is required by pass MXPlanMemory") when two
    threads call it at once, so its calls take turns.
    """

    def __init__(self, symbol, param_names):
        self._lock = threading.Lock()
        self.names = symbol.list_inputs()
        flags = [("data_indices", [i for i, n in enumerate(self.names)
                                   if n not in param_names]),
                 ("param_indices", [i for i, n in enumerate(self.names) if n in param_names])]
        self.op = cached_op(symbol, flags)
        self.calls = 0
        self.detached = ()      # positions of inputs given without history

    def __call__(self, inputs):
        with self._lock:
            self.calls += 1
            out = self.op(*inputs)
        return list(out) if isinstance(out, (list, tuple)) else [out]


class RefusedPlan:
    """A plan MXNet refused to make a CachedOp of (its error's first line)."""

    def __init__(self, why):
        self.why = why


def run_compiled(plan, live, ctx, cache, stats):
    """Run ``plan`` through a cached (or new) CachedOp; fill ``stats``.

    On a miss, building the symbol, creating the CachedOp and its first call
    (where MXNet builds the graph) count as compilation.  A plan whose graph
    MXNet refuses to build runs as batched imperative calls, which compute
    the same (``RefusedPlan``, kept in the cache: not built again).  A plan
    with booleans to gather runs so too (``_booleans_in``).
    """
    if any(_booleans_in(step.nodes[0]) for step in plan.steps):
        run_interpreted(plan, live, ctx)
        return
    compiler = Lowering(ctx)
    key = (str(compiler.ctx),) + compiler.walk(plan, live)
    if compiler.sparse_grads and autograd.is_recording():
        # MXNet's CachedOp cannot add a parameter's sparse gradient to a dense
        # one (a tied embedding and output layer): its backward raises.
        warn_once(("sparse plan",), "compiled plans: %s has a sparse gradient, which MXNet's "
                  "compiled graphs cannot sum with dense ones; plans that read it run as "
                  "batched imperative calls", compiler.sparse_grads[0])
        run_interpreted(plan, live, ctx)
        return
    entry = cache.get(key)
    start = time.perf_counter()
    if entry is None:
        try:
            symbol, reached = plan_symbol(compiler)
            entry = CompiledPlan(symbol, compiler.param_names)
            # Inputs no delivered output has a gradient path to go in detached:
            # the graph's backward would write them a zero gradient, marked
            # fresh (a Trainer then updates a frozen encoder's weights).
            entry.detached = [k for k, name in enumerate(entry.names) if name not in reached]
        except MXNetError as err:
            entry = RefusedPlan(first_line(err))
        stats.evictions += cache.put(key, entry)
        stats.cache_misses += 1
    else:
        stats.cache_hits += 1
    if type(entry) is RefusedPlan:
        warn_once(("refused plan", entry.why),
                  "compiled plans: MXNet refused to build a plan's graph (%s); such plans "
                  "run as batched imperative calls", entry.why)
        run_interpreted(plan, live, ctx)
        return
    inputs = compiler.inputs(entry.names)
    given = [inputs[k] for k in entry.detached]
    for k in entry.detached:
        inputs[k] = inputs[k].detach()
    results = entry(inputs)
    if stats.cache_misses and entry.calls == 1:
        stats.compile_ms += 1000.0 * (time.perf_counter() - start)
    check_refused_values(plan)
    if given and autograd.is_recording():
        # Outputs of ``BlockGrad`` alone carry history in eager (their
        # gradient zero): a loss of them alone has a backward pass.
        results = _tied(results, lambda: given)
    compiler.deliver(results)


def run_steps(plan, live, ctx, cache, stats):
    """``compiled="step"``: each step, its gathers included, as one cached CachedOp.

    A step's graph depends on its operator, attributes, roles, trailing shapes
    and how many sources each gather reads, which repeat from batch to batch
    even when whole plans do not; so after warm-up almost every step hits.
    The walk computes every index array first, so they reach MXNet in one
    copy, as in :func:`run_interpreted`.
    """
    walker = Lowering(ctx, tables="present")
    walker.walk(plan, live)
    feeds = walker.feed_arrays()
    values = {}
    detached = []
    for kind, node0, ins, outs, count, variant in walker.steps:
        zero = zero_gradient(node0.op.name, node0.args, node0.kwargs)
        if zero:
            detached.append((ins, range(len(ins))))
        # Inputs no gradient goes back to (read only through detach(); an index,
        # a shape): their arrays are detached, as ``run_interpreted`` gathers
        # them (MXNet's backward crashed where only a zero reached a gather).
        unread = _unread_program_inputs(node0, len(ins), len(outs)) if kind == "program" \
            else _zero_gradient_positions(kind, node0, len(ins))
        if unread:
            detached.append((ins, unread))
        arrays, shape = [], []
        for k, desc in enumerate(ins):
            start = len(arrays)
            if desc[0] == "take":
                arrays.extend(_gather(("direct", sid), values, feeds) for sid in desc[1])
                arrays.append(feeds[desc[2]])
                shape.append(("t", len(desc[1])))
            else:
                arrays.append(_gather(desc, values, feeds))
                shape.append(("d",))
            if k in unread:         # read only through detach(): no gradient goes back
                arrays[start:] = [array.detach() for array in arrays[start:]]
        with autograd.pause() if zero else _NO_CHANGE, _naming_step(node0, count):
            results = _run_step(node0, tuple(shape), variant, arrays, walker.ctx, cache, stats)
        for sid, array in zip(outs, results):
            values[sid] = array
    results = [_gather(desc, values, feeds) for desc, _ in walker.outputs]
    check_refused_values(plan)
    walker.deliver(_with_history(results, detached, values, feeds),
                   _gather_sources(walker.outputs, values))


def _booleans_in(node0):
    """Whether a step of ``node0`` reads or makes booleans, which a graph's
    gathers cannot concatenate (MXNet 1.9.1's ``concat`` has no boolean kernel):
    such steps run imperatively (``_concat_rows``)."""
    return any(src.out_dtypes[i] == np.bool_ for src, i in node0.inputs) \
        or any(dtype == np.bool_ for dtype in node0.out_dtypes)


def _run_step(node0, shape, variant, arrays, ctx, cache, stats):
    """Run one step's cached CachedOp (compiled on a miss) on ``arrays``."""
    if _booleans_in(node0):
        return _step_imperative(node0, shape, variant, arrays)
    attrs = node0.attrs if node0.rule.keyed_attrs else None
    key = ("step", node0.rule.batching, step_name(node0.op), attrs, node0.meta,
           type(node0.rule).__name__, shape, variant,
           tuple(src.out_shapes[i][1:] for src, i in node0.inputs),
           tuple(dtype_name(src.out_dtypes[i]) for src, i in node0.inputs),
           tuple(s[1:] for s in node0.out_shapes), node0.rule.step_key(node0), str(ctx))
    entry = cache.get(key)
    start = time.perf_counter()
    if entry is None:
        try:
            entry = CompiledPlan(_step_symbol(node0, shape, variant), ())
            entry.order = [int(name[1:]) for name in entry.names]   # "v7" -> array 7
            outs = entry([arrays[k] for k in entry.order])
        except MXNetError as err:       # (an operator without a gradient: khatri_rao)
            entry = RefusedPlan(first_line(err))
        stats.evictions += cache.put(key, entry)
        stats.cache_misses += 1
    else:
        stats.cache_hits += 1
        if type(entry) is not RefusedPlan:
            outs = entry([arrays[k] for k in entry.order])
    if type(entry) is RefusedPlan:
        warn_once(("refused step", entry.why),
                  "compiled steps: MXNet refused to build a step's graph (%s); such steps "
                  "run as batched imperative calls", entry.why)
        return _step_imperative(node0, shape, variant, arrays)
    if entry.calls == 1:
        stats.compile_ms += 1000.0 * (time.perf_counter() - start)
    return outs


def _step_imperative(node0, descs, variant, arrays):
    """What ``_step_symbol``'s graph computes, run call by call on ``arrays``."""
    arrays = iter(arrays)
    inputs = []
    for desc in descs:
        if desc[0] == "d":
            inputs.append(next(arrays))
            continue
        sources = [next(arrays) for _ in range(desc[1])]
        table = sources[0] if len(sources) == 1 else _concat_rows(sources)
        inputs.append(mx.nd.take(table, next(arrays), axis=0))
    return list(_batched_outputs(mx.nd, node0, inputs, variant))


def _step_symbol(node0, descs, variant=None):
    """The symbol of one step: gathers (take over concatenated sources), then the op.

    ``descs`` has per input ``("d",)`` (passed whole) or ``("t", n)`` (rows
    taken from n sources); index arrays of calls and ragged sums are the
    last ``("d",)`` inputs.
    """
    count = [0]

    def var():
        count[0] += 1
        return mx.sym.var("v%d" % (count[0] - 1))
    inputs = []
    for desc in descs:
        if desc[0] == "d":
            inputs.append(var())
            continue
        sources = [var() for _ in range(desc[1])]
        table = sources[0] if len(sources) == 1 else mx.sym.concat(*sources, dim=0)
        inputs.append(mx.sym.take(table, var(), axis=0))
    if node0.rule.batching == "program":
        inputs = _detached_program_inputs(node0, inputs)
    return mx.sym.Group(_batched_outputs(mx.sym, node0, inputs, variant))


def _detached_program_inputs(node0, inputs):
    """A program's symbol ``inputs`` with those no gradient flows back to
    (``Program.detached``: read only by zero-gradient calls, ``argmax``) behind
    ``BlockGrad``, as the imperative executor gathers them outside autograd: a
    zero gradient times an infinite input would be NaN in the others'."""
    detached = node0.op.detached
    if not detached:
        return inputs
    return [mx.sym.BlockGrad(x) if k in detached else x for k, x in enumerate(inputs)]


def _batched_outputs(F, node0, inputs, variant):
    """The outputs of a step of ``node0``'s calls on its gathered ``inputs``."""
    if node0.rule.batching == "alone":
        return call_as_recorded(F, node0, inputs)
    if node0.rule.batching == "program":
        return node0.op.batched(F, inputs, variant)
    return node0.rule.batched_call(F, node0, inputs)
