"""Rules of broadcasts: elementwise operators of two arrays (``broadcast_*``).

``BroadcastRule`` batches them as ``RowRule`` does: inputs of the output's
rank are concatenated (one-row ones repeated, ``BROW``), lower-rank ones
shared (a bias).  A lower-rank input that each sample computed
(``x + F.sum(h, axis=0)``: a (1, H) row and an (H,) vector) would make
every node a signature of its own; when the recorder places such a node
(``CallInfo.low``), ``refine`` gives it ``LowRankRule``: every node's vector
is gathered and viewed as that node's row (role ``LOW``).
"""
from .rows import RowRule, _NARY, elementwise_roles
from ..ir.graph import LEAF
from ..ir.rules import LOW, _in_shape, call_as_recorded, intern, register_rule


class LowRankRule(RowRule):
    """A broadcast of one-row values and lower-rank values computed per sample.

    ``x + F.sum(h, axis=0)`` adds a (1, H) row and an (H,) vector; the vector
    broadcasts as the row (1, H).  Its role is ``LOW``: every node's vector is
    gathered and viewed as that node's row before the batched call.  Nodes get
    this rule from ``BroadcastRule.refine`` when they are recorded (a
    parameter or constant of lower rank stays ``SHARED``).
    """

    program_form = None     # programs gather such vectors themselves (``Entry.low``)

    def __init__(self):
        super().__init__(elementwise_roles, broadcasts=True)

    def step_key(self, node):
        return tuple(_in_shape(node, k) for k, role in enumerate(node.meta) if role == LOW)

    def batched_call(self, F, node, inputs):
        ndim = len(node.out_shapes[0])
        viewed = list(inputs)
        for k, role in enumerate(node.meta):
            if role == LOW:
                shape = _in_shape(node, k)
                viewed[k] = F.reshape(inputs[k], shape=(-1,) + (1,) * (ndim - 1 - len(shape))
                                      + shape)
        return call_as_recorded(F, node, viewed)


LOW_RANK = LowRankRule()


class BroadcastRule(RowRule):
    """``RowRule`` of a ``broadcast_*`` operator, refined per node where a
    lower-rank input is a value of the sample's own (see the module docstring)."""

    def __init__(self):
        super().__init__(elementwise_roles, broadcasts=True)

    def refine(self, node, info):
        """Give ``node`` (a call of ``info``, whose ``info.low`` is not empty) the
        ``LowRankRule`` when it computed a lower-rank input per sample; whether it did."""
        graph = node.graph
        low = [k for k in info.low if node.inputs[k][0].kind != LEAF
               and node.inputs[k][0] not in graph.weight_nodes]
        if not low or node.out_shapes[0][0] != 1:
            return False
        node.rule = LOW_RANK
        node.meta = tuple(LOW if k in low else role for k, role in enumerate(info.meta))
        shared = tuple((node.inputs[k][0].id, node.inputs[k][1])
                       for k in info.shared_pos if k not in low)
        node.sig = (intern((LOW, info.sig, tuple(_in_shape(node, k) for k in low))), shared)
        return True


register_rule([name for name in _NARY if name.startswith("broadcast_")], BroadcastRule())
