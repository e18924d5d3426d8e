"""Rules of losses: ``F.softmax_cross_entropy`` of one row of scores and its label.

``RowCrossEntropyRule``: a sum over the rows, so over one row that row's loss;
the batch computes every row's loss at once, ``-log(pick(softmax(x), label))``
floored as MXNet's kernel floors it, with the kernel's gradient.
"""
import numpy as np

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
        # As MXNet's kernel: -log of the picked softmax floored at 1e-8, its
        # gradient softmax - one_hot(label) however small the picked probability
        # (a log_softmax would round the gradient differently).  Rows below the
        # floor take that gradient from ``slope * (scores - BlockGrad(scores))``,
        # a zero taken score by score: a sum of the products first could
        # overflow (scores near 3e38), and an infinite score (a masked class,
        # the label's too) gives NaN there, so it is left out.
        scores, label = plain_layout(F, inputs[0], 2), inputs[1]
        probs = F.softmax(scores, axis=-1)
        picked = F.pick(probs, label, axis=-1)
        value = -F.log(F.maximum(picked, _FLOOR))
        slope = F.BlockGrad(probs - F.one_hot(label, depth=_in_shape(node, 0)[1],
                                              dtype=np.dtype(_in_dtype(node, 0)).name))
        zero = scores - F.BlockGrad(scores)
        zero = F.where(zero == 0, zero, F.zeros_like(zero))
        floored = F.BlockGrad(picked <= _FLOOR)
        linear = F.sum(slope * zero, axis=-1)
        return [value + F.where(floored, linear, F.zeros_like(linear))]


_FLOOR = 1e-8       # MXNet's floor of the picked probability


register_rule("softmax_cross_entropy", RowCrossEntropyRule())
