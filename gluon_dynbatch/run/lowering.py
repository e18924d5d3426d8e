"""Lowering: a plan becomes gathers and steps, with every value's rows located.

Every value is a list of *segments* ``(source, start, stop)``: rows of a
source (a step's batched output, a parameter, an input).  A step gathers the
segments of its nodes' inputs into one array (a slice, or one ``take`` over
its sources concatenated), calls the operator (or program) once, and gives
each node its rows of the outputs.  Views (row slices, axis-0
concatenations, row broadcasts) only rearrange segments, so many rows taken
from one array become a single gather.

:class:`Lowering` walks a plan once and produces what every executor of
``run.py`` needs: per step its gather descriptions, the index arrays (fed as
data, so one compiled graph serves many sample sets), the plan's structure
key, and how to hand the live values their rows.
"""
import ctypes
from itertools import chain, repeat

import mxnet as mx
import numpy as np
from mxnet.base import _LIB, NDArrayHandle, c_array, check_call, mx_uint

from ..ir.graph import LEAF, VIEW
from ..ir.known import device_array, values_known
from ..record import context
from ..record.lazy import Rows, split_rows
from ..record.trie import store
from . import _walk
from ..ir.rules import BROW, KNOWN, SHARED


class SegmentWalker:
    """Segment bookkeeping of a walk over a plan (the base of ``Lowering``).

    Subclasses say what a leaf's source is (``leaf_source``); a source has a
    row count given by ``source_rows``.
    """

    def __init__(self):
        self.segs = {}
        # Marks the positions this walk gives nodes (``node.at``, see ``assign``).
        self.token = object()

    def leaf_source(self, node):
        raise NotImplementedError

    def segments(self, node, idx=0):
        """The segment list of output ``idx`` of ``node``."""
        key = (node, idx)
        found = self.segs.get(key)
        if found is not None:
            return found
        if node.kind == LEAF:
            found = [(self.leaf_source(node), 0, node.out_shapes[0][0])]
        elif node.kind == VIEW:
            found = self._view_segments(node)
        else:
            return [self.row_of(node, idx)]
        self.segs[key] = found
        return found

    def row_of(self, node, idx):
        """The segment of output ``idx`` of ``node``, a step output of one row per node."""
        at = node.at
        if at is None or at[0][0] is not self.token:
            raise RuntimeError("internal error: %r used before its step ran" % node)
        start = at[1]
        return (at[0][idx + 1], start, start + 1)

    def _view_segments(self, node):
        name = node.op.name
        if name == "slice_axis":
            src, i = node.inputs[0]
            segs = self.segs.get((src, i)) or self.segments(src, i)
            kwargs = node.kwargs
            begin, end = kwargs["begin"], kwargs["end"]
            if not (type(begin) is int and type(end) is int and 0 <= begin < end):
                # Negative or open bounds count from the end, as in Python.
                begin, end, _ = slice(begin, end).indices(src.rows(i))
            if len(segs) == 1:
                # Rows of one segment (a word's row of a table): the common case.
                source, start, _ = segs[0]
                return [(source, start + begin, start + end)]
            return _cut(segs, begin, end)
        if name in ("concat", "Concat"):
            out = []
            for src, i in node.inputs:
                out.extend(self.segments(src, i))
            return out
        src, i = node.inputs[0]
        if name == "repeat":                # each row ``repeats`` times, in order
            repeats = node.kwargs["repeats"]
            return [(source, row, row + 1) for source, start, stop in self.segments(src, i)
                    for row in range(start, stop) for _ in range(repeats)]
        return self.segments(src, i) * node.out_shapes[0][0]   # broadcast of a single row

    def input_segments(self, nodes, k, role):
        """Segments of input ``k`` of every node, rows broadcast where ``role`` says."""
        segs = []
        extend = segs.extend
        known = self.segs.get
        brow = role == BROW
        for node in nodes:
            value = node.inputs[k]
            part = known(value)
            if part is None:
                part = self.segments(*value)
            if brow:
                rows_out = node.out_shapes[0][0]
                if rows_out > 1 and value[0].out_shapes[value[1]][0] == 1:
                    part = part * rows_out
            extend(part)
        return segs

    def assign(self, nodes, outs):
        """Record the rows of step outputs ``outs`` belonging to each node.

        Returns the row count of each output.
        """
        counts = [[node.out_shapes[j][0] for node in nodes] for j in range(len(outs))]
        if all(max(rows) == 1 for rows in counts):
            # One row per node, the common case: row k of every output is
            # node k's, which ``row_of`` reads from ``node.at`` (one tuple per
            # node instead of a segment list per output).
            marker = (self.token,) + tuple(outs)
            for k, node in enumerate(nodes):
                node.at = (marker, k)
            return [len(nodes)] * len(outs)
        segs = self.segs
        totals = []
        for j, (out, rows) in enumerate(zip(outs, counts)):
            offset = 0
            for node, count in zip(nodes, rows):
                segs[(node, j)] = [(out, offset, offset + count)]
                offset += count
            totals.append(offset)
        return totals


_NO_ROLES = repeat(None)     # the roles of an alone node's inputs


def shared_inputs(nodes):
    """Per input of a batch: True when it is passed once rather than gathered.

    SHARED inputs always are (KNOWN ones are not passed at all).  A one-row
    BROW input that every node shares can broadcast natively too, where the
    operator broadcasts (``Rule.broadcasts``: ``broadcast_add`` does,
    ``elemwise_add`` does not), provided another input is gathered at full
    rows (otherwise the batch would have one row instead of one per node).
    """
    node0 = nodes[0]
    broadcasts = node0.rule.broadcasts
    shared = []
    for k, role in enumerate(node0.meta):
        first = node0.inputs[k]
        shared.append(role == SHARED or role == KNOWN or (
            broadcasts and role == BROW and first[0].out_shapes[first[1]][0] == 1
            and all(n.inputs[k] == first for n in nodes)))
    if all(shared[k] for k, role in enumerate(node0.meta) if role not in (SHARED, KNOWN)):
        for k, role in enumerate(node0.meta):
            if role not in (SHARED, KNOWN):
                shared[k] = False
                break
    return shared


_DTYPE_NAMES = {}


def dtype_name(dtype):
    """``np.dtype(dtype).name``, remembered (numpy takes microseconds to name one)."""
    found = _DTYPE_NAMES.get(dtype)
    if found is None:
        found = _DTYPE_NAMES[dtype] = np.dtype(dtype).name
    return found


def step_name(op):
    """``op``'s name in the keys of compiled steps and plans: its ``step_name``
    where its name alone does not tell it from others (the operators of
    ``rewrite.matrix_ops``: ``_pair_outer`` of an addition or a product)."""
    return getattr(op, "step_name", None) or op.name


def reused_constants():
    """The constants this thread reuses across scopes (``F.zeros``, see
    ``Recorder.make_constant``) that a flush must copy (``leaf_value``): all of
    them while autograd records, else none."""
    return store().constant_ids if mx.autograd.is_recording() else None


def leaf_value(node, constants):
    """The array a flush feeds MXNet for leaf ``node`` (not a parameter).

    A constant among ``constants`` (``reused_constants``) goes in as a fresh
    copy, as eager makes a new array at each call: one array that two
    recorded graphs share as an input loses its autograd entry when the
    first graph's backward frees it, and the second backward fails.
    """
    value = node.value
    if constants and id(value) in constants:
        with mx.autograd.pause():
            return value.copy()
    if type(value) is mx.nd.NDArray and mx.autograd.is_recording() \
            and node not in node.graph.literal_leaves and values_known(node):
        # A constant given by the user: a batched call recorded on it would make
        # it an input of autograd's graph, where eager's calls that take no
        # gradient of it leave it out, and MXNet would refuse to write it in
        # place afterwards (an input buffer refilled per sample).  The same
        # memory under another handle is recorded instead.
        return value.detach()
    return value


def merge_segments(segs):
    """Join adjacent segments of the same source."""
    merged = []
    for source, start, stop in segs:
        if merged and merged[-1][0] is source and merged[-1][2] == start:
            merged[-1] = (source, merged[-1][1], stop)
        else:
            merged.append((source, start, stop))
    return merged


def run_indices(starts, lengths):
    """Concatenation of ``arange(start, start + length)`` for each run, vectorised."""
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lengths)
    shift = np.repeat(starts - (ends - lengths), lengths)
    return (np.arange(ends[-1], dtype=np.int64) + shift).astype(np.int32)


def _cut(segs, begin, end):
    """Rows ``begin:end`` (``0 <= begin < end``) of a segment list."""
    out, pos = [], 0
    for array, start, stop in segs:
        length = stop - start
        lo, hi = max(begin, pos), min(end, pos + length)
        if lo < hi:
            out.append((array, start + lo - pos, start + hi - pos))
        pos += length
        if pos >= end:
            break
    return out


class Lowering(SegmentWalker):
    """Walks a plan, producing its structure key and its feeds.

    Sources are integers: leaves (parameters, input arrays) and step outputs.
    """

    def __init__(self, ctx, slices=False, tables=None, rows_out=False):
        super().__init__()
        self.ctx = ctx or mx.current_context()
        self.slices = slices      # allow ("slice", sid, start, stop): not for caching
        # Hand values out as rows of the steps' outputs, not gathered into one
        # array a group: for values the scope's next flushes read, not the user.
        self.rows_out = rows_out
        # What a take reads: the sources its rows come from ("present"), or
        # every source so far of their families ("family": whole-plan keys
        # that do not depend on the trees).
        self.tables = tables or ("present" if slices else "family")
        self.constants = reused_constants()     # copied where fed (``leaf_value``)
        # Whole-plan keys and source families: only a whole-plan compiler reads them.
        self.keyed = self.tables == "family"
        self.matrix_parts = []    # (variable name, numpy array) extra inputs of segment steps
        self.source_desc = []     # per source: hashable description
        self.families = []        # per source: what kind of value it holds
        self.source_rows = []
        self.leaf_ids = {}
        self.feeds = {}           # variable name -> NDArray (leaves, segment matrices)
        self.param_names = set()
        self.sparse_grads = []    # names of parameters (and leaves) with sparse gradients
        self.unhoisted = set()    # sources of leaves with sparse gradients
        self.index_parts = []     # (variable name, int32 numpy array)
        self.steps = []           # (kind, node0, nodes, input descriptions, output sources)
        self.outputs = []         # (group description, [(node, idx, lazy)])
        self.step_outputs = {}    # (first node, j) -> (sid, nodes) of each step output
        self.key_parts = []
        self.hoisted = []         # (source, table source, index name): rows taken first

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
                                    dtype_name(param.dtype)), rows)
            name = "s%d" % sid
            self.feeds[name] = param.data(self.ctx)
            self.param_names.add(name)
            if getattr(param, "_grad_stype", "default") != "default" \
                    and param.grad_req != "null":       # (frozen: no gradient at all)
                self.sparse_grads.append(param.name)
        else:
            # The node holds the value's dtype and shape (asking the NDArray is a
            # ctypes call each).
            sid = self._new_source(("leaf", dtype_name(node.out_dtypes[0]),
                                    len(node.out_shapes[0])), rows)
            self.feeds["s%d" % sid] = leaf_value(node, self.constants)
            if node in node.graph.sparse_grad_leaves:
                self.sparse_grads.append("an array given to the samples")
                self.unhoisted.add(sid)
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
        found = _walk.step_rows(nodes, k, self.token)
        if found is None:
            values = [n.inputs[k] for n in nodes]
            found = self._row_slices(values) or self._rows_of(values)
        sids, starts, stops = found
        lengths = stops - starts
        first = sids[0]
        if (sids == first).all() and (starts[1:] == starts[:-1] + lengths[:-1]).all():
            # One run of one source: as the general path decides.
            return self._gather_desc([(int(first), int(starts[0]), stops[-1])], force_take)
        return self._take(sids, starts, lengths)

    def _rows_of(self, values):
        """(sids, starts, stops) of the segments of ``values``, in order, as numpy arrays."""
        known = self.segs.get
        parts = [known(v) or self.segments(*v) for v in values]
        if max(map(len, parts)) == 1:
            columns = zip(*[p[0] for p in parts])
        else:
            columns = zip(*chain.from_iterable(parts))
        return tuple(np.array(column, dtype=np.int64) for column in columns)

    def _row_slices(self, values):
        """(sids, starts, stops) when every value is a row slice (``x[i:j]``) of one
        array held in one segment, else None.

        Each tree node's word row of an embedding table is such a view: its rows
        come from the slices' bounds at once (``_walk.slice_bounds``), without
        resolving view by view.
        """
        found = _walk.slice_bounds(values)
        if found is None:
            return None
        base, begins, ends = found
        segs = self.segs.get(base) or self.segments(*base)
        if len(segs) != 1:
            return None
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
        key = (tuple(self.key_parts), tuple(self.source_desc[:]),
               tuple(sorted(self.param_names)))
        if not self.keyed:
            self._hoist_table_rows()
        return key

    def _hoist_table_rows(self):
        """Takes of a few rows of a large leaf (a word embedding table) read
        from one take of every row the flush reads of it, made first.

        Each step of a tagger reads its tokens' rows of the table; the
        backward pass of every such take writes a gradient of the whole table.
        Taken once, the table gets one such gradient, and the steps' takes
        read a table of the flush's rows.  Only for walks whose structure
        keys no compiled plan (``keyed``): the steps change, their key does not.
        """
        index = dict(self.index_parts)
        moved = {}
        for sid, names in self._table_takes().items():
            rows = self._rows_to_hoist(sid, names, index)
            if rows is None:
                continue
            name = "h%d" % sid
            index[name] = rows.astype(np.int32)
            self.index_parts.append((name, index[name]))
            compact = self._new_source(("rows", sid, name), len(rows))
            self.hoisted.append((compact, sid, name))
            for part in names:
                index[part] = np.searchsorted(rows, index[part]).astype(np.int32)
                moved[part] = compact
        if not moved:
            return
        self.index_parts = [(name, index[name]) for name, _ in self.index_parts]
        self.steps = [(kind, node0, tuple(("take", (moved[d[2]],), d[2])
                                          if d[0] == "take" and d[2] in moved else d
                                          for d in ins), outs, count, variant)
                      for kind, node0, ins, outs, count, variant in self.steps]

    def _table_takes(self):
        """Per source, the index names of the steps' takes of its rows alone."""
        uses = {}
        for _, _, ins, _, _, _ in self.steps:
            for desc in ins:
                if desc[0] == "take" and len(desc[1]) == 1:
                    uses.setdefault(desc[1][0], []).append(desc[2])
        return uses

    def _rows_to_hoist(self, sid, names, index):
        """The sorted rows of leaf ``sid`` its takes ``names`` read, when two or
        more read at most half of it (not a parameter with sparse gradients)."""
        source = self.source_desc[sid]
        if len(names) < 2 or source[0] not in ("param", "leaf") or sid in self.unhoisted or \
                source[0] == "param" and source[1] in self.sparse_grads:
            return None
        rows = np.unique(np.concatenate([index[name] for name in names]))
        return rows if 2 * len(rows) <= self.source_rows[sid] else None

    def _walk_step(self, nodes):
        node0 = nodes[0]
        variant = None
        if node0.rule.batching == "alone":
            kind = "alone"
            ins = tuple(self._gather_desc(self.segments(src, i)) for src, i in node0.inputs)
        else:
            kind = node0.rule.batching
            ins, variant = self._step_inputs(kind, node0, nodes)
        family = self._step_key(kind, node0, ins, variant) if self.keyed else None
        outs = [self._new_source(("step", len(self.steps), j), 0,
                                 None if family is None else family + (j,))
                for j in range(len(node0.out_shapes))]
        for j, (sid, rows) in enumerate(zip(outs, self.assign(nodes, outs))):
            self.source_rows[sid] = rows
            self.step_outputs[(node0, j)] = (sid, nodes)
        self.steps.append((kind, node0, ins, outs, len(nodes), variant))

    def _step_inputs(self, kind, node0, nodes):
        """The gather descriptions of a batched step's inputs, and its variant."""
        ins = []
        shared = shared_inputs(nodes)
        for k, role in enumerate(node0.meta):
            if role == KNOWN:               # read by the rule (segment_arrays)
                continue
            if shared[k]:
                ins.append(self._gather_desc(self.segments(*node0.inputs[k])))
            elif kind == "program" and not self.slices:
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
        return tuple(ins), variant

    def _step_key(self, kind, node0, ins, variant):
        """Append the step's part of the whole-plan key; return its outputs' family."""
        if kind == "alone":
            key = (kind, step_name(node0.op), node0.attrs, ins)
        else:
            attrs = node0.attrs if node0.rule.keyed_attrs else None
            key = (kind, step_name(node0.op), attrs, tuple(node0.meta), type(node0.rule).__name__,
                   ins, variant)
        tails = (tuple(src.out_shapes[i][1:] if role != KNOWN else None
                       for (src, i), role in zip(node0.inputs, node0.meta or _NO_ROLES)),
                 tuple(shape[1:] for shape in node0.out_shapes),
                 tuple(dtype_name(d) for d in node0.out_dtypes))
        self.key_parts.append(key + (tails, node0.rule.step_key(node0)))
        if kind == "program":
            # Calls of different programs (a leaf's cell and an internal
            # node's) feed the same consumers; whether a batch's consumers
            # read both depends on its trees, so their outputs form one family
            # per position, trailing shape and dtype.
            return (kind, tails[1:])
        return (kind, step_name(node0.op), node0.attrs if node0.rule.keyed_attrs else None,
                node0.meta, tails)

    def _walk_outputs(self, live):
        groups = _walk.output_groups(live, self.token, self.segments)
        for gkey, (members, segs) in groups.items():
            if self.rows_out and len(members) > 1 and \
                    _walk.whole_step_rows(members, segs, self.source_desc):
                # Imperative: each value is rows of one step's output, which it
                # keeps (``Rows``); no gather into one array (``deliver``).
                self.outputs.append((("rows", tuple(segs)), members))
                continue
            desc = self._gather_desc(segs, force_take=True)
            self.outputs.append((desc, members))
            if self.keyed:
                self.key_parts.append(("out", gkey, desc))

    # -- building and running ----------------------------------------------------------
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
            flat = device_array(np.concatenate([array.ravel() for _, array in group]),
                                self.ctx)
            if len(group) == 1:
                feeds[group[0][0]] = _view(flat, 0, flat.shape[0], group[0][1].shape)
                continue
            start = 0
            for name, array in group:
                feeds[name] = _view(flat, start, start + array.size, array.shape)
                start += array.size
        for sid, table, name in self.hoisted:
            feeds["s%d" % sid] = mx.nd.take(feeds["s%d" % table], feeds[name], axis=0)
        return feeds

    def deliver(self, results, sources=None):
        """Hand each output group's rows to their LazyArrays.

        Inside a scope, each value of a group of several also remembers its
        rows of the group's array (``lazy.Rows``): a later flush of the scope
        that reads it gathers those rows from that array.  ``sources`` (while
        autograd records): per group, the step outputs its array was
        gathered from, as ``_gather_sources`` gives them.
        """
        rec = context.current()
        token = getattr(rec, "rows_token", None)
        mode = context.autograd_mode()
        for k, ((desc, members), array) in enumerate(zip(self.outputs, results)):
            found = sources[k] if sources is not None else None
            if desc[0] == "rows":           # [(step output, begin, end)] of each member
                _deliver_rows(members, array, mode, token, found)
                continue
            counts = [node.out_shapes[idx][0] for node, idx, _ in members]
            # While autograd records, a value alone in its group too: whether a
            # backward pass freed the steps it was gathered from is asked of
            # them (``Rows.sources``), not of the gather, which a pass that
            # reached other values of those steps leaves with its history.
            if len(counts) > 1 and token is not None or found is not None:
                node, idx, _ = members[0]
                rows = Rows(array, counts, mode, token, node.out_shapes[idx][1:],
                            node.out_dtypes[idx], sources=found)
                rows.hand_out([lazy for _, _, lazy in members])
                continue
            # A group's rows have one trailing shape, so each piece has its
            # value's shape already: no per-piece check (a ctypes call each).
            for (_, _, lazy), piece in zip(members, split_rows(array, counts)):
                lazy._set_result(piece)  # pylint: disable=protected-access


def _deliver_rows(members, parts, mode, token, sources=None):
    """Hand each of ``members`` its rows ``(array, begin, end)`` of ``parts``, the rows
    of each array together (``Rows``; inside a scope, whose ``token`` they carry).
    ``sources``: each member's step output, before ``parts`` tied it to detached
    steps' inputs (``run.executors._with_history``), or None."""
    by_array = {}
    for k, (member, (array, begin, end)) in enumerate(zip(members, parts)):
        found = by_array.setdefault(id(array), (array, [], [], []))
        found[1].append(member[2])
        found[2].append((begin, end))
        if sources is not None and not found[3]:
            found[3].append(sources[k])
    node, idx, _ = members[0]
    tail, dtype = node.out_shapes[idx][1:], node.out_dtypes[idx]
    for array, lazies, bounds, base in by_array.values():
        Rows(array, None, mode, token, tail, dtype, bounds=bounds,
             sources=base or None).hand_out(lazies)


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


def _extra_arrays(node0, nodes, sticky=False):
    """(variant, arrays): the index arrays a batched step reads besides its inputs.

    Ragged sums read a padded index (and counts); program nodes (``programs.py``)
    read repeats and padded indices, and their variant says which (with
    ``sticky``, every repeat a program ever needed, for stable plan keys).
    """
    kind = node0.rule.batching
    if kind == "segment":
        return None, node0.rule.segment_arrays(nodes, node0.out_dtypes[0])
    if kind == "program":
        return node0.rule.batch_arrays(nodes, sticky)
    return None, []
