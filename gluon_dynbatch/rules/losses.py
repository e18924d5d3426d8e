"""Rules of losses: ``F.softmax_cross_entropy`` of one row of scores and its label.

``RowCrossEntropyRule``: a sum over the rows, so over one row that row's loss;
the batch computes every row's loss at once, ``-log(pick(softmax(x), label))``.
"""
from .rows import plain_layout
from ..ir.rules import ROW, Rule, Signature, _in_dtype, _in_shape, register_rule


class RowCrossEntropyRule(Rule):
    """``softmax_cross_entropy(x, label)`` of a (1, C) row and a (1,) label: per
    row, ``-log(softmax(x)[label])``; equal to MXNet's to float32 rounding."""

    batching = "calls"

    def signature(self, node):
        data, label = _in_shape(node, 0), _in_shape(node, 1)
        if len(node.inputs) != 2 or len(data) != 2 or data[0] != 1 or label != (1,):
            return None
        key = ("row_cross_entropy", data[1], _in_dtype(node, 0), _in_dtype(node, 1))
        return Signature((key,), self, (ROW, ROW))

    def batched_call(self, F, node, inputs):
        # log of the picked softmax, as MXNet's kernel computes it (a log_softmax
        # would round its gradient differently).
        scores = plain_layout(F, inputs[0], 2)
        return [-F.log(F.pick(F.softmax(scores, axis=-1), inputs[1], axis=-1))]


register_rule("softmax_cross_entropy", RowCrossEntropyRule())
