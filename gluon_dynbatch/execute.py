"""Execution: run a plan with batched imperative MXNet calls.

Every value is a list of *segments* ``(array, start, stop)``: rows of a concrete
array (a step's batched output, a parameter, an input).  A step gathers the
segments of its nodes' inputs into one array (a slice, a concatenation or one
``take``), calls the operator once, and gives each node its rows of the outputs.
Views (row slices, axis-0 concatenations, row broadcasts) only rearrange
segments, so many rows taken from one array become a single gather.
"""
import mxnet as mx
import numpy as np

from .graph import LEAF, VIEW, Slot
from .signatures import BROW, SHARED


class Executor:
    """Runs one plan on ``ctx`` and hands results to the live LazyArrays."""

    def __init__(self, ctx):
        self.ctx = ctx or mx.current_context()
        self.segs = {}
        self.num_gathers = 0

    # -- segments -----------------------------------------------------------------
    def segments(self, node, idx=0):
        """The segment list of output ``idx`` of ``node``."""
        key = (node, idx)
        found = self.segs.get(key)
        if found is not None:
            return found
        if node.kind == LEAF:
            array = node.value if node.value is not None else node.param.data(self.ctx)
            found = [(array, 0, node.out_shapes[0][0])]
        elif node.kind == VIEW:
            found = self._view_segments(node)
        else:
            raise RuntimeError("internal error: %r used before its step ran" % node)
        self.segs[key] = found
        return found

    def _view_segments(self, node):
        name = node.op.name
        if name in ("concat", "Concat"):
            out = []
            for src, i in node.inputs:
                out.extend(self.segments(src, i))
            return out
        src, i = node.inputs[0]
        segs = self.segments(src, i)
        if name == "slice_axis":
            return _cut(segs, node.kwargs["begin"], node.kwargs["end"], src.rows(i))
        return segs * node.out_shapes[0][0]          # broadcast of a single row

    def gather(self, segs):
        """One array holding the rows of ``segs`` in order; (array, is_new)."""
        merged = []
        for array, start, stop in segs:
            if merged and merged[-1][0] is array and merged[-1][2] == start:
                merged[-1] = (array, merged[-1][1], stop)
            else:
                merged.append((array, start, stop))
        if len(merged) == 1:
            array, start, stop = merged[0]
            if start == 0 and stop == array.shape[0]:
                return array, False
            return mx.nd.slice_axis(array, axis=0, begin=start, end=stop), True
        self.num_gathers += 1
        sources = {}
        for array, _, _ in merged:
            sources.setdefault(id(array), array)
        if len(sources) == len(merged):
            pieces = [a if (s == 0 and e == a.shape[0]) else
                      mx.nd.slice_axis(a, axis=0, begin=s, end=e) for a, s, e in merged]
            return mx.nd.concat(*pieces, dim=0), True
        offsets, base, arrays = {}, 0, []
        for key, array in sources.items():
            offsets[key] = base
            base += array.shape[0]
            arrays.append(array)
        index = np.concatenate([np.arange(s, e) + offsets[id(a)] for a, s, e in merged])
        table = arrays[0] if len(arrays) == 1 else mx.nd.concat(*arrays, dim=0)
        index = mx.nd.array(index, ctx=self.ctx, dtype="int32")
        return mx.nd.take(table, index, axis=0), True

    # -- steps ----------------------------------------------------------------------
    def run(self, plan):
        """Run every step of ``plan``."""
        for step in plan.steps:
            nodes = step.nodes
            if len(nodes) == 1:
                outs = self._run_single(nodes[0])
            elif nodes[0].rule.kind == "segment":
                outs = self._run_segment(nodes)
            else:
                outs = self._run_rows(nodes)
            self._assign(nodes, outs)

    def _call(self, node, inputs, extra_kwargs=None):
        args = [inputs[a.k] if isinstance(a, Slot) else a for a in node.args]
        kwargs = {k: (inputs[v.k] if isinstance(v, Slot) else v)
                  for k, v in node.kwargs.items()}
        if extra_kwargs:
            kwargs.update(extra_kwargs)
        out = node.op.nd_fn(*args, **kwargs)
        return list(out) if isinstance(out, (list, tuple)) else [out]

    def _run_single(self, node):
        inputs = [self.gather(self.segments(src, i))[0] for src, i in node.inputs]
        return self._call(node, inputs)

    def _run_rows(self, nodes):
        node0 = nodes[0]
        inputs = []
        for k, role in enumerate(node0.meta):
            inputs.append(self._gather_input(nodes, k, role))
        outs = self._call(node0, inputs, node0.rule.batch_kwargs(node0))
        return outs

    def _gather_input(self, nodes, k, role):
        first = nodes[0].inputs[k]
        if role == SHARED:
            return self.gather(self.segments(*first))[0]
        if role == BROW and first[0].out_shapes[first[1]][0] == 1 and \
                all(n.inputs[k] == first for n in nodes):
            return self.gather(self.segments(*first))[0]   # broadcasts natively
        segs = []
        for node in nodes:
            src, i = node.inputs[k]
            part = self.segments(src, i)
            rows_out = node.out_shapes[0][0]
            if role == BROW and src.out_shapes[i][0] == 1 and rows_out > 1:
                part = part * rows_out
            segs.extend(part)
        return self.gather(segs)[0]

    def _run_segment(self, nodes):
        """sum/mean over axis 0 of ragged rows: pad, reshape, reduce a new axis."""
        node0 = nodes[0]
        data = self._gather_input(nodes, 0, "row")
        counts = [n.inputs[0][0].out_shapes[n.inputs[0][1]][0] for n in nodes]
        longest, total = max(counts), sum(counts)
        tail = node0.inputs[0][0].out_shapes[node0.inputs[0][1]][1:]
        index = np.full((len(nodes), longest), total, dtype=np.int32)
        start = 0
        for row, count in enumerate(counts):
            index[row, :count] = np.arange(start, start + count)
            start += count
        pad = mx.nd.zeros((1,) + tuple(tail), ctx=self.ctx, dtype=data.dtype)
        padded = mx.nd.take(mx.nd.concat(data, pad, dim=0),
                            mx.nd.array(index.reshape(-1), ctx=self.ctx, dtype="int32"))
        padded = padded.reshape((len(nodes), longest) + tuple(tail))
        out = mx.nd.sum(padded, axis=1)
        if node0.op.name == "mean":
            shape = (len(nodes),) + (1,) * len(tail)
            out = mx.nd.broadcast_div(out, mx.nd.array(
                np.array(counts, dtype=np.float64).reshape(shape), ctx=self.ctx,
                dtype=out.dtype))
        return [out.reshape((-1,) + tuple(node0.out_shapes[0][1:]))]

    def _assign(self, nodes, outs):
        for j, out in enumerate(outs):
            if len(nodes) == 1:
                self.segs[(nodes[0], j)] = [(out, 0, nodes[0].out_shapes[j][0])]
                continue
            offset = 0
            for node in nodes:
                rows = node.out_shapes[j][0]
                self.segs[(node, j)] = [(out, offset, offset + rows)]
                offset += rows

    # -- results ----------------------------------------------------------------------
    def deliver(self, live):
        """Give each live LazyArray its array (with autograd history)."""
        for node, idx, lazy in live:
            array, is_new = self.gather(self.segments(node, idx))
            if not is_new:
                array = mx.nd.identity(array)
            if array.shape != node.out_shapes[idx]:
                array = array.reshape(node.out_shapes[idx])
            lazy._set_result(array)  # pylint: disable=protected-access


def _cut(segs, begin, end, total):
    """Rows ``begin:end`` of a segment list covering ``total`` rows."""
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
