"""Execution bookkeeping: where each value's rows are, and how a step gathers them.

Every value is a list of *segments* ``(source, start, stop)``: rows of a
source (a step's batched output, a parameter, an input).  A step gathers the
segments of its nodes' inputs into one array (a slice, a concatenation or one
``take``), calls the operator once, and gives each node its rows of the outputs.
Views (row slices, axis-0 concatenations, row broadcasts) only rearrange
segments, so many rows taken from one array become a single gather.  The walk
that turns a plan into gathers and MXNet calls is ``compile.Compiler``.
"""
import numpy as np

from .graph import LEAF, VIEW
from .signatures import BROW, SHARED


class SegmentWalker:
    """Segment bookkeeping of a walk over a plan (the base of ``compile.Compiler``).

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


def shared_inputs(nodes):
    """Per input of a batch: True when it is passed once rather than gathered.

    SHARED inputs always are.  A one-row BROW input that every node shares can
    broadcast natively too, provided another input is gathered at full rows
    (otherwise the batch would have one row instead of one per node).
    """
    node0 = nodes[0]
    shared = []
    for k, role in enumerate(node0.meta):
        first = node0.inputs[k]
        shared.append(role == SHARED or (
            role == BROW and first[0].out_shapes[first[1]][0] == 1
            and all(n.inputs[k] == first for n in nodes)))
    if all(shared[k] for k, role in enumerate(node0.meta) if role != SHARED):
        for k, role in enumerate(node0.meta):
            if role != SHARED:
                shared[k] = False
                break
    return shared


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
