"""The reference executor: every recorded node runs by itself, in recording order.

It is the oracle of the tests: batched plans must give its outputs and gradients.
"""
import mxnet as mx

from ..ir.graph import LEAF
from ..ir.rules import call_as_recorded


def run_reference(nodes, live, ctx):
    """Run ``nodes`` one by one and deliver the ``live`` outputs."""
    ctx = ctx or mx.current_context()
    values = {}
    for node in nodes:
        if node.kind == LEAF:
            array = node.value if node.value is not None else node.param.data(ctx)
            values[(node, 0)] = array
            continue
        inputs = [values[(src, i)] for src, i in node.inputs]
        for j, array in enumerate(call_as_recorded(mx.nd, node, inputs)):
            values[(node, j)] = array
    for node, idx, lazy in live:
        lazy._set_result(mx.nd.identity(values[(node, idx)]))  # pylint: disable=protected-access
