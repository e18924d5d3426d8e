"""The reference executor: every recorded node runs by itself, in recording order.

It is the oracle of the tests: batched plans must give its outputs and gradients.
"""
from collections import Counter

import mxnet as mx

from ..ir.graph import LEAF
from ..ir.rules import NON_DIFFERENTIABLE, call_as_recorded
from .lowering import leaf_value, reused_constants

_DETACHING = ("BlockGrad", "stop_gradient")


def run_reference(nodes, live, ctx):
    """Run ``nodes`` one by one and deliver the ``live`` outputs."""
    ctx = ctx or mx.current_context()
    values = {}
    constants = reused_constants()
    for node in nodes:
        if node.kind == LEAF:
            array = leaf_value(node, constants) if node.value is not None \
                else node.param.data(ctx)
            values[(node, 0)] = array
            continue
        inputs = [values[(src, i)] for src, i in node.inputs]
        if node.op.name in NON_DIFFERENTIABLE or node.op.name in _DETACHING:
            # Eager code gives the former inputs without history; the latter
            # are how ``x.detach()`` is recorded, whose result eager gives no
            # history (MXNet's backward through ``BlockGrad`` can crash).
            with mx.autograd.pause(train_mode=mx.autograd.is_training()):
                outs = call_as_recorded(mx.nd, node, inputs)
        else:
            outs = call_as_recorded(mx.nd, node, inputs)
        for j, array in enumerate(outs):
            values[(node, j)] = array
    held = Counter((node, idx) for node, idx, _ in live)
    for node, idx, lazy in live:
        array = values[(node, idx)]
        if node.kind != LEAF and held[(node, idx)] == 1:
            # The operator's own output, as eager code holds it: autograd
            # frees it exactly when a backward pass frees the operator.
            lazy._set_result(array)  # pylint: disable=protected-access
        else:       # a leaf's array, or a value held twice: a handle of its own
            lazy._set_result(mx.nd.identity(array))  # pylint: disable=protected-access
