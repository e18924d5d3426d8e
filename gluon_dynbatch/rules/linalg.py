"""Rules of ``F.linalg``'s operators on each sample's own matrices.

MXNet's ``linalg`` operators (``slogdet``, ``sumlogdiag``, ``trsm``, ``gemm2`` ...)
take a stack of matrices, ``(..., n, m)``, and work on each matrix of it.
:class:`MatrixStackRule` batches calls whose matrices have the same shapes: the
calls' inputs, concatenated along axis 0, are reshaped into one stack (one
matrix a call), the operator runs once, and its outputs are reshaped back to
the calls' outputs laid end to end.  A matrix-tree parser's ``slogdet`` of each
sentence's Laplacian, or a triangular solve per sample, runs as one call per
matrix size, not one per sample; a Cholesky factor (``potrf``, which LAPACK
refuses for a matrix not positive definite) runs one call at a time.
"""
from .products import Gemm2Rule, _gemm2_roles
from .rows import RowFallback
from ..ir.graph import weight_node
from ..ir.rules import (ROW, Rule, Signature, _in_dtype, _in_shape, call_as_recorded,
                        register_rule)

STACKED = ("det", "slogdet", "sumlogdiag", "extractdiag", "makediag", "extracttrian",
           "maketrian", "syrk", "trmm", "trsm", "gemm")
"""``F.linalg`` operators working on each matrix of a stack (by their last name).
Those LAPACK refuses some values for (``potrf`` of a matrix not positive
definite, ``inverse`` and ``potri`` of a singular one, ``gelqf``, ``syevd``) run
one call at a time: a sample's failure stays its own, as eagerly (a sample may
catch it at its read)."""


class MatrixStackRule(Rule):
    """Calls of a ``linalg`` operator whose inputs have the same shapes: one call on
    the stack of every call's matrices (see the module docstring)."""

    batching = "calls"

    def signature(self, node):
        if not node.inputs or node.kwargs.get("axis", -2) != -2:
            return None
        if any(not shape for shape in node.out_shapes):
            return None         # (a 0-d output has no rows to lay end to end)
        shapes = tuple(_in_shape(node, k) for k in range(len(node.inputs)))
        if any(not shape for shape in shapes):
            return None
        dtypes = tuple(_in_dtype(node, k) for k in range(len(node.inputs)))
        return Signature((("matrix_stack", shapes, dtypes),), self, (ROW,) * len(shapes))

    def step_key(self, node):
        return tuple(_in_shape(node, k) for k in range(len(node.inputs)))

    def batched_call(self, F, node, inputs):
        stacked = [F.reshape(array, shape=(-1,) + _in_shape(node, k))
                   for k, array in enumerate(inputs)]
        outs = call_as_recorded(F, node, stacked)
        return [F.reshape(array, shape=(-1,) + shape[1:])
                for array, shape in zip(outs, node.out_shapes)]


class _PerSampleGemm2(MatrixStackRule):
    """``gemm2(a, b)`` where ``b`` is a value of each call (not weights)."""

    def signature(self, node):
        if len(node.inputs) != 2 or weight_node(node.inputs[1][0]):
            return None
        return super().signature(node)


register_rule(list(STACKED), MatrixStackRule())
_GEMM2 = RowFallback(_PerSampleGemm2(), Gemm2Rule(_gemm2_roles))
_GEMM2.source_dependent = True          # whether ``b`` is weights (see calls.remember)
register_rule("gemm2", _GEMM2)
