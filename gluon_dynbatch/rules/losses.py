"""Rules of losses: ``F.softmax_cross_entropy`` of one row of scores and its label.

``RowCrossEntropyRule``: a sum over the rows, so over one row that row's loss;
the batch computes every row's loss at once, ``-log(pick(softmax(x), label))``
floored as MXNet's kernel floors it, with the kernel's gradient.
"""
from .rows import plain_layout
from ..ir.rules import ROW, Rule, Signature, _in_dtype, _in_shape, register_rule


class RowCrossEntropyRule(Rule):
    """``softmax_cross_entropy(x, label)`` of a (1, C) row and a (1,) label: per
    row, ``-log(max(softmax(x)[label], 1e-8))``; equal to MXNet's to float32 rounding."""

    batching = "calls"

    def signature(self, node):
        data, label = _in_shape(node, 0), _in_shape(node, 1)
        if len(node.inputs) != 2 or len(data) != 2 or data[0] != 1 or label != (1,):
            return None
        key = ("row_cross_entropy", data[1], _in_dtype(node, 0), _in_dtype(node, 1))
        return Signature((key,), self, (ROW, ROW))

    def batched_call(self, F, node, inputs):
        # As MXNet's kernel: the value is -log of the picked softmax floored at
        # 1e-8 (large scores), the gradient softmax - one_hot(label) however
        # small the picked probability.  ``linear - BlockGrad(linear)`` is zero
        # with that gradient.
        scores, label = plain_layout(F, inputs[0], 2), inputs[1]
        probs = F.softmax(scores, axis=-1)
        value = -F.log(F.maximum(F.pick(probs, label, axis=-1), _FLOOR))
        slope = F.BlockGrad(probs - F.one_hot(label, depth=_in_shape(node, 0)[1]))
        linear = F.sum(slope * scores, axis=-1)
        return [F.BlockGrad(value) + (linear - F.BlockGrad(linear))]


_FLOOR = 1e-8       # MXNet's floor of the picked probability


register_rule("softmax_cross_entropy", RowCrossEntropyRule())
