"""Compilation: a plan becomes one symbolic graph, run as an MXNet CachedOp.

The graph depends on the plan's *shape* only: the sequence of steps, their
operators and attributes, and which sources each gather reads.  Which rows go
where enters as index arrays fed as data (``take``), and ragged axis-0 sums
as padded index arrays, so one compiled graph serves every sample set
whose plan has the same shape.  Compiled graphs live in a ``PlanCache``.
"""
import contextlib
import ctypes
import os
import time
from itertools import chain

import mxnet as mx
import numpy as np
from mxnet import autograd
from mxnet.base import _LIB, NDArrayHandle, c_array, check_call, mx_uint

from .execute import SegmentWalker, merge_segments, run_indices, shared_inputs
from .graph import VIEW
from .signatures import BROW, NO_GRADIENT, call_as_recorded

_NO_CHANGE = contextlib.nullcontext()
_CONCATS = ("concat", "Concat")

# MXNet 1.9.1's static memory planning (CachedOp ``static_alloc``) returned
# wrong gradients for a whole-plan graph that hypothesis found (a value read
# by tanh and reverse, or tanh and cumsum, besides gathers): the same symbol
# without it is exact.  Exactness comes first, so no CachedOp here uses it
# (tests/test_fuzz.py::test_regression_static_alloc_gradient keeps that case).
STATIC_ALLOC = os.environ.get("GDB_STATIC_ALLOC", "0") == "1"


def cached_op(symbol, flags=()):
    """``mx.nd.CachedOp(symbol)`` with this package's flags (see ``STATIC_ALLOC``)."""
    return mx.nd.CachedOp(symbol, list(flags) + [("static_alloc", STATIC_ALLOC)])


class Compiler(SegmentWalker):
    """Walks a plan, producing its structure key and its feeds.

    Sources are integers: leaves (parameters, input arrays) and step outputs.
    """

    def __init__(self, ctx, slices=False, tables=None):
        super().__init__()
        self.ctx = ctx or mx.current_context()
        self.slices = slices      # allow ("slice", sid, start, stop): not for caching
        # What a take reads: the sources its rows come from ("present"), or
        # every source so far of their families ("family": whole-plan keys
        # that do not depend on the trees).
        self.tables = tables or ("present" if slices else "family")
        self.matrix_parts = []    # (variable name, numpy array) extra inputs of segment steps
        self.source_desc = []     # per source: hashable description
        self.families = []        # per source: what kind of value it holds
        self.source_rows = []
        self.leaf_ids = {}
        self.feeds = {}           # variable name -> NDArray (leaves, segment matrices)
        self.param_names = set()
        self.index_parts = []     # (variable name, int32 numpy array)
        self.steps = []           # (kind, node0, nodes, input descriptions, output sources)
        self.outputs = []         # (group description, [(node, idx, lazy)])
        self.step_outputs = {}    # (first node, j) -> (sid, nodes) of each step output
        self.key_parts = []

    # -- sources ------------------------------------------------------------------
    def _new_source(self, desc, rows, family=None):
        self.families.append(family if family is not None else ("leaf", len(self.families)))
        self.source_desc.append(desc)
        self.source_rows.append(rows)
        return len(self.source_desc) - 1

    def leaf_source(self, node):
        sid = self.leaf_ids.get(node)
        if sid is not None:
            return sid
        rows = node.out_shapes[0][0]
        if node.param is not None:
            param = node.param
            sid = self._new_source(("param", param.name, id(param), tuple(param.shape),
                                    np.dtype(param.dtype).name), rows)
            name = "s%d" % sid
            self.feeds[name] = param.data(self.ctx)
            self.param_names.add(name)
        else:
            value = node.value
            sid = self._new_source(("leaf", np.dtype(value.dtype).name, len(value.shape)),
                                   rows)
            self.feeds["s%d" % sid] = value
        self.leaf_ids[node] = sid
        return sid

    def _gather_desc(self, segs, force_take=False):
        """('direct', sid) for a whole source in order, else ('take', sids, var)."""
        merged = merge_segments(segs)
        if not force_take and len(merged) == 1:
            sid, start, stop = merged[0]
            if start == 0 and stop == self.source_rows[sid]:
                return ("direct", sid)
            if self.slices:
                return ("slice", sid, start, stop)
        sids, starts, stops = (np.array(column, dtype=np.int64) for column in zip(*merged))
        return self._take(sids, starts, stops - starts)

    def _take(self, sids, starts, lengths):
        """('take', sources, var): runs of rows of ``sids`` (numpy arrays) as one take.

        The take reads the concatenation of its sources, in table order (see
        ``_table_sources``); its index array goes to ``index_parts``.
        """
        order = self._table_sources(sids)
        offsets = np.zeros(len(self.source_rows), dtype=np.int64)
        base = 0
        for sid in order:
            offsets[sid] = base
            base += self.source_rows[sid]
        starts = starts + offsets[sids]
        if (lengths == 1).all():
            index = starts.astype(np.int32)
        else:
            index = run_indices(starts, lengths)
        name = "i%d" % len(self.index_parts)
        self.index_parts.append((name, index))
        return ("take", tuple(order), name)

    def _gather_rows(self, nodes, k, role, force_take=False):
        """``_gather_desc`` of input ``k`` of ``nodes``, vectorised where it can be.

        Each node's input is a short list of segments (one for a row of an
        earlier step's output or of a table, one per child for a
        concatenation); their sources and starts go to numpy at once instead
        of through Python loops over segments.
        """
        if role == BROW:
            return self._gather_desc(self.input_segments(nodes, k, role), force_take)
        values = [n.inputs[k] for n in nodes]
        sids, starts, stops = self._row_slices(values) or self._rows_of(values)
        lengths = stops - starts
        first = sids[0]
        if (sids == first).all() and (starts[1:] == starts[:-1] + lengths[:-1]).all():
            # One run of one source: as the general path decides.
            return self._gather_desc([(int(first), int(starts[0]), stops[-1])], force_take)
        return self._take(sids, starts, lengths)

    def _rows_of(self, values):
        """(sids, starts, stops) of the segments of ``values``, in order, as numpy arrays."""
        first = values[0][0]
        if first.kind == VIEW and first.op.name in _CONCATS:
            found = self._stacked_rows(values)
            if found is not None:
                return found
        known = self.segs.get
        parts = [known(v) or self.segments(*v) for v in values]
        if max(map(len, parts)) == 1:
            columns = zip(*[p[0] for p in parts])
        else:
            columns = zip(*chain.from_iterable(parts))
        return tuple(np.array(column, dtype=np.int64) for column in columns)

    def _stacked_rows(self, values):
        """``_rows_of`` for concatenations of one-row step outputs (a node's
        children's states), read from the outputs' ``node.at`` without
        resolving view by view; None if any value is something else."""
        token = self.token
        sids, starts = [], []
        for view, _ in values:
            if view.kind != VIEW or view.op.name not in _CONCATS:
                return None
            for src, idx in view.inputs:
                at = src.at
                if at is None or at[0][0] is not token:
                    return None
                sids.append(at[0][idx + 1])
                starts.append(at[1])
        starts = np.array(starts, dtype=np.int64)
        return np.array(sids, dtype=np.int64), starts, starts + 1

    def _row_slices(self, values):
        """(sids, starts, stops) when every value is a row slice (``x[i:j]``) of one
        array held in one segment, else None.

        Each tree node's word row of an embedding table is such a view: its rows
        come from the slices' bounds at once, without resolving view by view.
        """
        first = values[0][0]
        if first.kind != VIEW or first.op.name != "slice_axis":
            return None
        op, base = first.op, first.inputs[0]
        begins, ends = [], []
        for view, idx in values:
            if idx or view.kind != VIEW or view.op is not op or view.inputs[0] != base:
                return None
            kwargs = view.kwargs
            begins.append(kwargs["begin"])
            ends.append(kwargs["end"])
        segs = self.segs.get(base) or self.segments(*base)
        if len(segs) != 1:
            return None
        begins = np.array(begins)
        ends = np.array(ends)
        if begins.dtype.kind != "i" or ends.dtype.kind != "i" or not (
                (begins >= 0).all() and (ends > begins).all()):
            return None     # open (None) or negative bounds: resolved one by one
        sid, start, _ = segs[0]
        return np.full(len(values), sid, dtype=np.int64), begins + start, ends + start

    def _table_sources(self, sids):
        """The sources a take of rows of ``sids`` reads, in table order.

        Compiled plans read every source so far of the families needed, so
        the graph does not depend on which earlier step (tree level) each row
        came from, only on the sequence of steps.
        """
        present = np.flatnonzero(np.bincount(sids))     # sorted, as np.unique
        if self.tables == "present":
            return [int(sid) for sid in present]
        wanted = {self.families[sid] for sid in present.tolist()}
        return [sid for sid, family in enumerate(self.families) if family in wanted]

    def _whole_output(self, nodes, k, role):
        """('direct', sid) when input ``k`` of ``nodes`` is exactly output j of one
        earlier step, node for node in order, else None.

        The common case (a chain of operators over the same nodes) is found
        without building segment lists: comparing tuples of nodes runs in C.
        """
        src0, j = nodes[0].inputs[k]
        found = self.step_outputs.get((src0, j))
        if found is None:
            return None
        sid, producers = found
        if len(producers) != len(nodes):
            return None
        values = [n.inputs[k] for n in nodes]
        if tuple([v[0] for v in values]) != producers or any(v[1] != j for v in values):
            return None
        # A one-row BROW input repeated to more rows is not the producer's layout.
        if role == BROW and any(n.out_shapes[0][0] > 1 and p.out_shapes[j][0] == 1
                                for n, p in zip(nodes, producers)):
            return None
        return ("direct", sid)

    # -- walking the plan -----------------------------------------------------------
    def walk(self, plan, live):
        """Describe every step and the delivery of the ``live`` outputs."""
        for step in plan.steps:
            self._walk_step(step.nodes)
        self._walk_outputs(live)
        return (tuple(self.key_parts), tuple(self.source_desc[:]),
                tuple(sorted(self.param_names)))

    def _walk_step(self, nodes):
        node0 = nodes[0]
        variant = None
        if node0.rule.kind == "alone":
            kind = "alone"
            ins = tuple(self._gather_desc(self.segments(src, i)) for src, i in node0.inputs)
            key = (kind, node0.op.name, node0.attrs, ins)
        else:
            kind = node0.rule.kind
            ins = []
            shared = shared_inputs(nodes)
            for k, role in enumerate(node0.meta):
                if shared[k]:
                    ins.append(self._gather_desc(self.segments(*node0.inputs[k])))
                elif kind == "call" and not self.slices:
                    # Compiled: whether a call's rows lie in order in one earlier
                    # output depends on the trees; a take always keeps the
                    # plan's key the same for batches of the same shape.
                    ins.append(self._gather_rows(nodes, k, role, force_take=True))
                else:
                    ins.append(self._whole_output(nodes, k, role)
                               or self._gather_rows(nodes, k, role))
            variant, extra = _extra_arrays(node0, nodes, sticky=not self.slices)
            for k, array in enumerate(extra):
                name = "m%d_%d" % (len(self.steps), k)
                self.matrix_parts.append((name, array))
                ins.append(("direct_var", name))
            ins = tuple(ins)
            attrs = node0.attrs if node0.rule.keyed_attrs else None
            key = (kind, node0.op.name, attrs, tuple(node0.meta), type(node0.rule).__name__,
                   ins, variant)
        tails = (tuple(src.out_shapes[i][1:] for src, i in node0.inputs),
                 tuple(shape[1:] for shape in node0.out_shapes),
                 tuple(np.dtype(d).name for d in node0.out_dtypes))
        key = key + (tails,)
        family = (kind, node0.op.name, node0.attrs if node0.rule.keyed_attrs else None,
                  node0.meta, tails)
        if kind == "call":
            # Calls of different programs (a leaf's cell and an internal
            # node's) feed the same consumers; whether a batch's consumers
            # read both depends on its trees, so their outputs form one family
            # per position, trailing shape and dtype.
            family = (kind, tails[1:])
        outs = [self._new_source(("step", len(self.steps), j), 0, family + (j,))
                for j in range(len(node0.out_shapes))]
        for j, (sid, rows) in enumerate(zip(outs, self.assign(nodes, outs))):
            self.source_rows[sid] = rows
            self.step_outputs[(node0, j)] = (sid, nodes)
        self.steps.append((kind, node0, ins, outs, len(nodes), variant))
        self.key_parts.append(key)

    def _walk_outputs(self, live):
        groups = {}
        for node, idx, lazy in live:
            gkey = (node.out_dtypes[idx], node.out_shapes[idx][1:])
            groups.setdefault(gkey, []).append((node, idx, lazy))
        for gkey, members in groups.items():
            segs = []
            for node, idx, _ in members:
                segs.extend(self.segments(node, idx))
            desc = self._gather_desc(segs, force_take=True)
            self.outputs.append((desc, members))
            self.key_parts.append(("out", gkey, desc))

    # -- building and running ----------------------------------------------------------
    def build_symbol(self):
        """The symbol of the walked plan (on a cache miss)."""
        syms = {}

        def source(sid):
            found = syms.get(sid)
            if found is None:
                found = syms[sid] = mx.sym.var("s%d" % sid)
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

        for kind, node0, ins, outs, _, variant in self.steps:
            inputs = [gather(d) for d in ins]
            if kind == "alone":
                results = call_as_recorded(mx.sym, node0, inputs)
            elif kind == "call":
                results = node0.op.batched(mx.sym, inputs, variant)
            else:
                results = node0.rule.batched_call(mx.sym, node0, inputs)
            for sid, sym in zip(outs, results):
                syms[sid] = sym
        return mx.sym.Group([gather(desc) for desc, _ in self.outputs])

    def inputs(self, names):
        """NDArrays for the symbol's input ``names``."""
        feeds = self.feed_arrays()
        return [feeds[n] for n in names]

    def feed_arrays(self):
        """Every feed by name; index arrays and segment matrices copied once per dtype.

        Each ``mx.nd.array`` is a synchronous copy, so one per gather would
        cost more than the gathers themselves; the copy is then cut into the
        parts (views, see ``_view``).
        """
        feeds = dict(self.feeds)
        parts = self.index_parts + self.matrix_parts
        for dtype in {array.dtype for _, array in parts}:
            group = [(name, array) for name, array in parts if array.dtype == dtype]
            flat = mx.nd.array(np.concatenate([array.ravel() for _, array in group]),
                               ctx=self.ctx, dtype=dtype)
            if len(group) == 1:
                feeds[group[0][0]] = _view(flat, 0, flat.shape[0], group[0][1].shape)
                continue
            start = 0
            for name, array in group:
                feeds[name] = _view(flat, start, start + array.size, array.shape)
                start += array.size
        return feeds

    def deliver(self, results):
        """Split each output group and hand the pieces to their LazyArrays."""
        for (desc, members), array in zip(self.outputs, results):
            pieces = _split_rows(array, [node.out_shapes[idx][0] for node, idx, _ in members])
            # A group's rows have one trailing shape, so each piece has its
            # value's shape already: no per-piece check (a ctypes call each).
            for (_, _, lazy), piece in zip(members, pieces):
                lazy._set_result(piece)  # pylint: disable=protected-access


def _split_rows(array, counts):
    """``array`` cut along axis 0 into pieces of ``counts`` rows (one recorded op).

    Pieces of equal size (every tree's root state: one row) use ``split``,
    whose forward and backward take a third of ``split_v2``'s engine time here.
    """
    if len(counts) == 1:
        return [array]
    if counts.count(counts[0]) == len(counts):
        return mx.nd.split(array, num_outputs=len(counts), axis=0)
    bounds = np.cumsum(counts)[:-1]
    return mx.nd.split_v2(array, tuple(int(b) for b in bounds), axis=0)


def _view(flat, start, stop, shape):
    """Elements ``start:stop`` of 1-D ``flat`` as an array of ``shape``, sharing its memory.

    The index arrays of a walk reach MXNet in one copy; each is then a view
    of it, made through MXNet's C API directly (``NDArray.reshape`` and
    ``split_v2`` spend 10-15 times as long in Python per piece).  Index
    arrays take no gradient, so views of one buffer are safe.
    """
    handle = NDArrayHandle()
    check_call(_LIB.MXNDArraySlice(flat.handle, mx_uint(start), mx_uint(stop),
                                   ctypes.byref(handle)))
    if len(shape) > 1:
        piece, handle = handle, NDArrayHandle()
        check_call(_LIB.MXNDArrayReshape64(piece, len(shape), c_array(ctypes.c_int64, shape),
                                           False, ctypes.byref(handle)))
        check_call(_LIB.MXNDArrayFree(piece))
    return mx.nd.NDArray(handle)


def run_interpreted(plan, live, ctx):
    """Run ``plan`` imperatively from the compiler's walk (batched nd calls).

    The walk computes every gather's indices before anything runs, so they
    reach MXNet in one copy; single-node steps run exactly as recorded.
    """
    walker = Compiler(ctx, slices=True)
    walker.walk(plan, live)
    feeds = walker.feed_arrays()
    values = {}
    for kind, node0, ins, outs, count, variant in walker.steps:
        with autograd.pause() if node0.op.name in NO_GRADIENT else _NO_CHANGE:
            inputs = [_gather(d, values, feeds) for d in ins]
            if kind == "call":
                results = node0.op.run_cached(inputs, variant, walker.ctx)
            elif kind == "alone" or count == 1:
                results = call_as_recorded(mx.nd, node0, inputs[:len(node0.inputs)])
            else:
                results = node0.rule.batched_call(mx.nd, node0, inputs)
        for sid, array in zip(outs, results):
            values[sid] = array
    walker.deliver([_gather(desc, values, feeds) for desc, _ in walker.outputs])


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
    if kind == "slice":
        return mx.nd.slice_axis(_gather(("direct", desc[1]), values, feeds), axis=0,
                                begin=desc[2], end=desc[3])
    sources = [_gather(("direct", sid), values, feeds) for sid in desc[1]]
    table = sources[0] if len(sources) == 1 else mx.nd.concat(*sources, dim=0)
    return mx.nd.take(table, feeds[desc[2]], axis=0)


class CompiledPlan:
    """A CachedOp and the order of its inputs."""

    def __init__(self, symbol, param_names):
        self.names = symbol.list_inputs()
        flags = [("data_indices", [i for i, n in enumerate(self.names)
                                   if n not in param_names]),
                 ("param_indices", [i for i, n in enumerate(self.names) if n in param_names])]
        self.op = cached_op(symbol, flags)
        self.num_outputs = len(symbol.list_outputs())
        self.calls = 0

    def __call__(self, inputs):
        self.calls += 1
        out = self.op(*inputs)
        return list(out) if isinstance(out, (list, tuple)) else [out]


def run_compiled(plan, live, ctx, cache, stats):
    """Run ``plan`` through a cached (or new) CachedOp; fill ``stats``.

    On a miss, building the symbol, creating the CachedOp and its first call
    (where MXNet builds the graph) count as compilation.
    """
    compiler = Compiler(ctx)
    key = (str(compiler.ctx),) + compiler.walk(plan, live)
    entry = cache.get(key)
    start = time.perf_counter()
    if entry is None:
        entry = CompiledPlan(compiler.build_symbol(), compiler.param_names)
        stats.evictions += cache.put(key, entry)
        stats.cache_misses += 1
    else:
        stats.cache_hits += 1
    results = entry(compiler.inputs(entry.names))
    if stats.cache_misses and entry.calls == 1:
        stats.compile_ms += 1000.0 * (time.perf_counter() - start)
    compiler.deliver(results)


def run_steps(plan, live, ctx, cache, stats):
    """``compiled="step"``: each step, its gathers included, as one cached CachedOp.

    A step's graph depends on its operator, attributes, roles, trailing shapes
    and how many sources each gather reads, which repeat from batch to batch
    even when whole plans do not; so after warm-up almost every step hits.
    The walk computes every index array first, so they reach MXNet in one
    copy, as in :func:`run_interpreted`.
    """
    walker = Compiler(ctx, tables="present")
    walker.walk(plan, live)
    feeds = walker.feed_arrays()
    values = {}
    for kind, node0, ins, outs, _, variant in walker.steps:
        arrays, shape = [], []
        for desc in ins:
            if desc[0] == "take":
                arrays.extend(_gather(("direct", sid), values, feeds) for sid in desc[1])
                arrays.append(feeds[desc[2]])
                shape.append(("t", len(desc[1])))
            else:
                arrays.append(_gather(desc, values, feeds))
                shape.append(("d",))
        with autograd.pause() if node0.op.name in NO_GRADIENT else _NO_CHANGE:
            results = _run_step(node0, tuple(shape), variant, arrays, walker.ctx, cache, stats)
        for sid, array in zip(outs, results):
            values[sid] = array
    walker.deliver([_gather(desc, values, feeds) for desc, _ in walker.outputs])


def _run_step(node0, shape, variant, arrays, ctx, cache, stats):
    """Run one step's cached CachedOp (compiled on a miss) on ``arrays``."""
    attrs = node0.attrs if node0.rule.keyed_attrs else None
    key = ("step", node0.rule.kind, node0.op.name, attrs, node0.meta,
           type(node0.rule).__name__, shape, variant,
           tuple(src.out_shapes[i][1:] for src, i in node0.inputs),
           tuple(np.dtype(src.out_dtypes[i]).name for src, i in node0.inputs),
           tuple(s[1:] for s in node0.out_shapes), str(ctx))
    entry = cache.get(key)
    start = time.perf_counter()
    if entry is None:
        entry = CompiledPlan(_step_symbol(node0, shape, variant), ())
        entry.order = [int(name[1:]) for name in entry.names]   # "v7" -> array 7
        stats.evictions += cache.put(key, entry)
        stats.cache_misses += 1
    else:
        stats.cache_hits += 1
    outs = entry([arrays[k] for k in entry.order])
    if entry.calls == 1:
        stats.compile_ms += 1000.0 * (time.perf_counter() - start)
    return outs


def _extra_arrays(node0, nodes, sticky=False):
    """(variant, arrays): the index arrays a batched step reads besides its inputs.

    Ragged sums read a padded index (and counts); call nodes (``calls.py``)
    read repeats and padded indices, and their variant says which (with
    ``sticky``, every repeat a program ever needed, for stable plan keys).
    """
    kind = node0.rule.kind
    if kind == "segment":
        return None, node0.rule.segment_arrays(nodes, node0.out_dtypes[0])
    if kind == "call":
        return node0.rule.batch_arrays(nodes, sticky)
    return None, []


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
    if node0.rule.kind == "alone":
        outs = call_as_recorded(mx.sym, node0, inputs)
    elif node0.rule.kind == "call":
        outs = node0.op.batched(mx.sym, inputs, variant)
    else:
        outs = node0.rule.batched_call(mx.sym, node0, inputs)
    return mx.sym.Group(outs)
