"""Rules of gathers: ``take`` of rows.

* ``RowRule`` of ``take`` from a shared table (an embedding's rows) by each
  node's indices;
* ``KnownTakeRule``: ``F.take(x, F.array(idx))`` of a value of each sample by a
  known index vector (``ir.known``) of more than a few runs of rows (fewer are
  recorded as row views by ``rewrite.literals``): one take over the batch's
  rows, each literal's indices moved to where its sample's rows start.
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


_TAKE = RowFallback(KnownTakeRule(), RowRule(take_roles))
_TAKE.source_dependent = True       # a literal's indices, or a shared table's rows
register_rule("take", _TAKE)
