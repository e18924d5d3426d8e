"""The reference executor: every recorded node runs by itself, in recording order.

It is the oracle of the tests: batched plans must give its outputs and gradients.
"""
import mxnet as mx

from .graph import LEAF, Slot


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
        args = [inputs[a.k] if isinstance(a, Slot) else a for a in node.args]
        kwargs = {k: (inputs[v.k] if isinstance(v, Slot) else v)
                  for k, v in node.kwargs.items()}
        out = node.op.nd_fn(*args, **kwargs)
        outs = out if isinstance(out, (list, tuple)) else [out]
        for j, array in enumerate(outs):
            values[(node, j)] = array
    for node, idx, lazy in live:
        lazy._set_result(mx.nd.identity(values[(node, idx)]))  # pylint: disable=protected-access
