"""Arithmetic with a different number per call batches as one step.

``h + f(h) * dt`` with a Python float ``dt`` of each sample's own (an ODE
solver's step, a temperature, a discount), recorded operator by operator, is
``_mul_scalar`` with the number among its constant arguments: calls with
different numbers have different signatures and each runs as a step of its
own.  At a flush, before planning, the calls of one such operator on values
of one trailing shape and dtype whose numbers differ get one signature and
:class:`ScalarColumnRule`: the step takes the numbers as a column, one per
row, and runs the broadcasting operator (``broadcast_mul(x, column)``), which
computes what each call computes (MXNet casts the number to the array's
dtype, as the column holds it).  Operators whose calls all have the same
number keep their signatures.  The reference executor runs the calls as
recorded.
"""
import numpy as np

from ..ir.graph import OP
from ..ir.known import scalars_as
from ..ir.rules import Rule

# Scalar operator: (broadcasting operator, whether the number is its left operand).
COLUMN_OPS = {
    "_plus_scalar": ("broadcast_add", False),
    "_minus_scalar": ("broadcast_sub", False),
    "_rminus_scalar": ("broadcast_sub", True),
    "_mul_scalar": ("broadcast_mul", False),
    "_div_scalar": ("broadcast_div", False),
    "_rdiv_scalar": ("broadcast_div", True),
}
_FLOATS = frozenset([np.dtype(t) for t in (np.float16, np.float32, np.float64)])


class ScalarColumnRule(Rule):
    """Calls of one scalar operator with different numbers: the numbers as a
    column of the step's rows (a ``segment`` step's extra array)."""

    batching = "segment"
    keyed_attrs = False         # the numbers are data of the step, not of its key

    def signature(self, node):
        return None             # given by ``rewrite``, never by a call's analysis

    @staticmethod
    def segment_arrays(nodes, dtype):
        """The column of the calls' numbers, each repeated over its call's rows."""
        rows = [node.out_shapes[0][0] for node in nodes]
        tail = len(nodes[0].out_shapes[0]) - 1
        numbers = scalars_as([node.kwargs["scalar"] for node in nodes], dtype)
        return [np.repeat(numbers, rows).reshape((-1,) + (1,) * tail)]

    def batched_call(self, F, node, inputs):
        name, flipped = COLUMN_OPS[node.op.name]
        x, column = inputs[0], inputs[-1]
        return [getattr(F, name)(column, x) if flipped else getattr(F, name)(x, column)]


SCALAR_COLUMN = ScalarColumnRule()


def rewrite(graph):
    """Give the scalar calls of ``graph`` whose numbers differ one signature per
    operator, trailing shape and dtype (see the module docstring); returns how
    many calls it changed."""
    groups = {}
    for node in graph.nodes:
        if node.kind != OP or node.op.name not in COLUMN_OPS:
            continue
        shape, dtype = node.out_shapes[0], node.out_dtypes[0]
        if not shape or np.dtype(dtype) not in _FLOATS or list(node.kwargs) != ["scalar"] \
                or node.sig is None or len(node.inputs) != 1:
            continue
        key = ("scalar column", node.op.name, shape[1:], np.dtype(dtype).str, node.meta)
        groups.setdefault(key, []).append(node)
    changed = 0
    for key, nodes in groups.items():
        if len({node.sig for node in nodes}) < 2:
            continue
        for node in nodes:
            node.sig = key
            node.rule = SCALAR_COLUMN
        changed += len(nodes)
    return changed
