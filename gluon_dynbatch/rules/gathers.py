"""Rules of gathers: ``take`` of rows.

* ``RowRule`` of ``take`` from a shared table (an embedding's rows) by each
  node's indices;
* ``KnownTakeRule``: ``F.take(x, F.array(idx))`` of a value of each sample by a
  known index vector (``ir.known``) of more than a few runs of rows (fewer are
  recorded as row views by ``rewrite.literals``): one take over the batch's
  rows, each literal's indices moved to where its sample's rows start;
* ``OwnTableTakeRule``: ``take`` from a table of each sample by computed
  indices.
"""
import numpy as np

from .products import _computed_per_sample
from .rows import RowFallback, RowRule
from ..ir.known import taken_rows, values_known, values_of
from ..ir.rules import KNOWN, ROW, SHARED, Rule, Signature, _in_dtype, _in_shape, register_rule


def take_roles(node):
    if node.kwargs.get("axis", 0) != 0 or len(_in_shape(node, 1)) < 1:
        return None
    return (SHARED, ROW)


class KnownTakeRule(Rule):
    """``take(x, idx)`` along axis 0 of a value of each sample by a known index
    vector (``F.array`` of a graph's edge ends): one take of the batch's rows
    concatenated, each literal's indices (read when the batch is planned, as
    MXNet reads them) moved to where its own rows start."""

    batching = "segment"

    def signature(self, node):
        kwargs = node.kwargs
        if len(node.inputs) != 2 or kwargs.get("axis", 0) != 0 \
                or kwargs.get("mode", "clip") not in ("clip", "wrap") \
                or not values_known(node.inputs[1][0]) or len(_in_shape(node, 1)) != 1 \
                or not _in_shape(node, 0) or not _computed_per_sample(node.inputs[0][0]):
            return None
        key = ("known_take", _in_shape(node, 0)[1:], _in_dtype(node, 0),
               kwargs.get("mode", "clip"))
        return Signature((key,), self, (ROW, KNOWN))

    @staticmethod
    def segment_arrays(nodes, dtype):
        """(where each node's indices point in the batch's rows,)"""
        mode = nodes[0].kwargs.get("mode", "clip")
        rows, start = [], 0
        for node in nodes:
            size = _in_shape(node, 0)[0]
            rows.append(taken_rows(values_of(node.inputs[1][0]), size, mode) + start)
            start += size
        return [np.concatenate(rows).astype(np.int32)]

    def batched_call(self, F, node, inputs):
        return [F.take(inputs[0], inputs[1], axis=0)]


class OwnTableTakeRule(Rule):
    """``take(table, idx)`` along axis 0 (mode ``clip``) of a table computed in
    each sample, by indices of its own (a beam search keeping the states of the
    beams it picked): one take from the batch's tables concatenated, each
    node's indices clipped to its own table's rows, then moved to where its
    table starts (offsets and bounds computed from the shapes when the batch
    is planned)."""

    batching = "segment"

    def signature(self, node):
        kwargs = node.kwargs
        if len(node.inputs) != 2 or kwargs.get("axis", 0) != 0 \
                or kwargs.get("mode", "clip") != "clip":
            return None
        table, idx = _in_shape(node, 0), _in_shape(node, 1)
        if not table or not idx or not _computed_per_sample(node.inputs[0][0]):
            return None
        key = ("own_take", table[1:], idx[1:], _in_dtype(node, 0), _in_dtype(node, 1))
        return Signature((key,), self, (ROW, ROW))

    @staticmethod
    def segment_arrays(nodes, dtype):
        """(where each index row's table starts, its table's last row), shaped to
        broadcast over the index rows, in the dtype the indices are moved in
        (``_wide``): the batch's rows may outnumber what a narrow one holds."""
        idx_shape = _in_shape(nodes[0], 1)
        tables = np.array([_in_shape(n, 0)[0] for n in nodes], dtype=np.int64)
        counts = np.array([_in_shape(n, 1)[0] for n in nodes], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(tables)[:-1]])
        shape = (-1,) + (1,) * (len(idx_shape) - 1)
        wide = _wide(_in_dtype(nodes[0], 1))
        return [np.repeat(starts, counts).reshape(shape).astype(wide),
                np.repeat(tables - 1, counts).reshape(shape).astype(wide)]

    def batched_call(self, F, node, inputs):
        table, idx, starts, lasts = inputs
        wide = _wide(_in_dtype(node, 1))
        if np.dtype(_in_dtype(node, 1)) != wide:
            idx = F.Cast(idx, dtype=wide.name)
        if wide.kind == "f":
            # MXNet's take converts an index to int64 before it clips: NaN, inf
            # and any index past int64's range take the first row of the table.
            idx = F.where(idx < 2.0 ** 63, idx, F.zeros_like(idx))
        inside = F.broadcast_minimum(F.broadcast_maximum(idx, F.zeros_like(lasts)), lasts)
        # The moved indices carry the history of the samples' own (a counter
        # ``i = i + 1``); MXNet's take then runs its backward for them even
        # where the table needs no gradient, and refuses that ("wrong req").
        # An index's gradient is zero: none is taken.
        return [F.take(table, F.BlockGrad(F.broadcast_add(inside, starts)), axis=0)]


def _wide(dtype):
    """The dtype a batch's moved indices are computed in: the indices' own, or
    for a narrow one (``uint8``, ``float16``) float32 or int32, exact for any
    batch's row count (a fraction kept, which MXNet's take truncates)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return dtype if dtype.itemsize >= 4 else np.dtype(np.float32)
    if dtype in (np.int32, np.int64):
        return dtype
    return np.dtype(np.int64 if dtype.itemsize >= 4 else np.int32)


_TAKE = RowFallback(KnownTakeRule(), RowFallback(OwnTableTakeRule(), RowRule(take_roles)))
_TAKE.source_dependent = True       # a literal's indices, or a shared table's rows
register_rule("take", _TAKE)
