"""Rules of matrix products.

* ``RowRule`` of ``FullyConnected``, ``dot`` and ``F.linalg.gemm2`` against
  shared weights: the rows of the first operand are independent;
* ``VectorProductRule``: ``FullyConnected(x, W, flatten=False)`` or ``dot(x, M)``
  of a 1-d vector and shared weights (DyNet's ``W * x``, recorded so by
  ``rewrite.dots``): the vectors of a batch are the rows of one matrix, one
  product;
* ``SharedBatchDotRule``: ``batch_dot`` of a value of each call and 3-d shared
  weights, the weights passed once;
* ``EachDotRule``: ``dot(a, b)`` where ``b`` is a value of each sample's own
  (attention: ``F.dot(q, keys, transpose_b=True)``, then ``F.dot(weights,
  keys)``): calls of the same shapes run as one ``batch_dot``;
* ``KnownMatrixDotRule``: ``dot(A, H)`` of a known ``A`` (``F.array`` of a graph's
  normalised adjacency, or such an array given to the model: ``ir.known``) and
  a value of each sample: one ``batch_dot`` for matrices of every size,
  padded with zeros.
"""
import numpy as np

from .rows import RowFallback, RowRule, all_row_roles, first_row_roles
from .segments import _padding, _with_zero_row
from ..ir.graph import LEAF, weight_node
from ..ir.known import values_known, values_of
from ..ir.rules import (KNOWN, ROW, SHARED, Rule, Signature, _in_dtype, _in_shape, _shared_key,
                        call_as_recorded, register_rule)


def dot_roles(node):
    if node.kwargs.get("transpose_a", False):
        return None
    return first_row_roles(node)


def _computed_per_sample(src):
    """Whether a source is a value computed in a sample's call: not a leaf (a
    parameter, a constant, an input) and not a value made from weights alone."""
    return src.kind != LEAF and not weight_node(src)


class EachDotRule(Rule):
    """``dot(a, b)`` of 2-d values with ``b`` computed per sample: nodes of the same
    shapes run as one ``batch_dot``, each node's ``a`` against its own ``b``."""

    batching = "calls"

    def signature(self, node):
        if len(node.inputs) != 2 or node.kwargs.get("transpose_a", False):
            return None
        a, b = _in_shape(node, 0), _in_shape(node, 1)
        if len(a) != 2 or len(b) != 2 or not _computed_per_sample(node.inputs[1][0]):
            return None
        key = ("dot_each", a, b, bool(node.kwargs.get("transpose_b", False)), _in_dtype(node, 0),
               _in_dtype(node, 1))
        return Signature((key,), self, (ROW, ROW))

    def step_key(self, node):
        return (_in_shape(node, 0), _in_shape(node, 1))     # the batched call reshapes to them

    def batched_call(self, F, node, inputs):
        a, b = _in_shape(node, 0), _in_shape(node, 1)
        out = F.batch_dot(F.reshape(inputs[0], shape=(-1,) + a),
                          F.reshape(inputs[1], shape=(-1,) + b),
                          transpose_b=bool(node.kwargs.get("transpose_b", False)))
        return [F.reshape(out, shape=(-1, node.out_shapes[0][1]))]


class VectorProductRule(Rule):
    """``FullyConnected(x, W, flatten=False)`` or ``dot(x, M)`` of a 1-d vector
    ``x`` and weights that every call shares: the batch's vectors, laid end to
    end, are the rows of one (N, D) matrix; one product, and its rows laid end
    to end again.  An instance per width D (``for_width``), which the batched
    call reshapes to."""

    batching = "calls"
    program_form = "own"    # its batched call is right on one call's rows too
    _BY_WIDTH = {}

    def __init__(self, width=None):
        self.width = width

    @classmethod
    def for_width(cls, width):
        found = cls._BY_WIDTH.get(width)
        if found is None:
            found = cls._BY_WIDTH.setdefault(width, cls(width))
        return found

    def signature(self, node):
        kwargs = node.kwargs
        if node.op.name == "FullyConnected" and kwargs.get("flatten", True) \
                or node.op.name == "dot" and kwargs.get("transpose_a", False):
            return None
        x = _in_shape(node, 0)
        if len(x) != 1 or len(node.inputs) < 2 or len(_in_shape(node, 1)) != 2 \
                or any(_computed_per_sample(src) for src, _ in node.inputs[1:]):
            return None
        key = (("vector_product", x, _in_dtype(node, 0)),) \
            + tuple(_shared_key(node, k) for k in range(1, len(node.inputs)))
        return Signature(key, self.for_width(x[0]), (ROW,) + (SHARED,) * (len(key) - 1))

    def batched_call(self, F, node, inputs):
        rows = F.reshape(inputs[0], shape=(-1, self.width))
        out = call_as_recorded(F, node, [rows] + list(inputs[1:]))[0]
        return [F.reshape(out, shape=(-1,))]


class KnownMatrixDotRule(Rule):
    """``dot(A, H)`` of an (n, m) known ``A`` and an (m, C) value ``H`` (or of
    ``A.T``, ``transpose_a=True``): the batch pads every ``A`` (as multiplied) to
    (N, n', m') with zeros, gathers each ``H`` into (N, m', C) (zero rows after
    its own), runs one ``batch_dot`` and keeps each call's n rows.  ``A`` is
    read when the batch is planned, not passed: a known value takes no gradient."""

    batching = "segment"

    def signature(self, node):
        if len(node.inputs) != 2 or node.kwargs.get("transpose_b", False):
            return None
        a, h = _in_shape(node, 0), _in_shape(node, 1)
        if len(a) != 2 or len(h) != 2 or not values_known(node.inputs[0][0]) \
                or a[0 if node.kwargs.get("transpose_a", False) else 1] != h[0]:
            return None
        key = ("known_dot", h[1], bool(node.kwargs.get("transpose_a", False)),
               _in_dtype(node, 0), _in_dtype(node, 1))
        return Signature((key,), self, (KNOWN, ROW))

    @staticmethod
    def segment_arrays(nodes, dtype):
        """(the matrices padded, (N, n', m'); where each H's rows sit in its
        padded (m', C) block, the zero row after the batch's rows standing for
        padding; where each output row sits in the padded output)."""
        flip = bool(nodes[0].kwargs.get("transpose_a", False))
        shapes = np.array([_in_shape(n, 0)[::-1] if flip else _in_shape(n, 0) for n in nodes],
                          dtype=np.int64)
        rows, cols = int(shapes[:, 0].max()), int(shapes[:, 1].max())
        matrices = np.zeros((len(nodes), rows, cols), dtype=dtype)
        for k, node in enumerate(nodes):
            n, m = shapes[k]
            values = values_of(node.inputs[0][0])
            matrices[k, :n, :m] = values.T if flip else values
        return [matrices, _padding(shapes[:, 1])[0], _padding(shapes[:, 0])[1]]

    def batched_call(self, F, node, inputs):
        rows, matrices, gather, kept = inputs
        width = node.out_shapes[0][1]
        out = F.batch_dot(matrices, F.take(_with_zero_row(F, rows), gather))    # (N, n', C)
        return [F.take(F.reshape(out, shape=(-1, width)), kept)]


def _gemm2_roles(node):
    """``F.linalg.gemm2(a, B)`` of matrices (``alpha * a . B``, B transposed or
    not): the rows of ``a`` are independent, as for ``F.dot``."""
    if node.kwargs.get("transpose_a", False) or node.kwargs.get("axis", -2) not in (-2, 0) \
            or len(_in_shape(node, 0)) != 2 or len(_in_shape(node, 1)) != 2:
        return None
    return (ROW, SHARED)


class Gemm2Rule(RowRule):
    """``gemm2`` of rows against a shared matrix, which reaches it through a copy:
    MXNet 1.9.1's ``gemm2`` backward writes garbage into a gradient it adds to
    (a parameter's with ``grad_req="add"``) when it is the only call writing it,
    as one batched call is (eager's calls' gradients are summed first)."""

    def batched_call(self, F, node, inputs):
        return call_as_recorded(F, node, [inputs[0], F.identity(inputs[1])] + list(inputs[2:]))


class SharedBatchDotRule(Rule):
    """``batch_dot(x, W)`` (or ``batch_dot(W, x)``) of a value of each call and 3-d
    weights every call shares (an RNTN's bilinear tensor, a parameter): the
    calls' matrices go side by side within each of ``W``'s entries, one
    ``batch_dot`` with ``W`` passed once, where a concatenation of every input
    copies ``W`` once per call, forward and backward."""

    batching = "calls"

    @staticmethod
    def _side(node):
        """Which input is the shared weights (1 or 0), or None."""
        if len(node.inputs) != 2 or node.kwargs.get("transpose_a", False):
            return None
        if len(_in_shape(node, 0)) != 3 or len(_in_shape(node, 1)) != 3:
            return None
        (a, _), (b, _) = node.inputs
        if weight_node(b) and not weight_node(a):
            return 1
        if weight_node(a) and not weight_node(b) \
                and not node.kwargs.get("transpose_b", False):
            return 0
        return None

    def signature(self, node):
        side = self._side(node)
        if side is None:
            return None
        key = ("batch_dot_shared", side, _in_shape(node, 1 - side),
               bool(node.kwargs.get("transpose_b", False)), _in_dtype(node, 0),
               _in_dtype(node, 1), _shared_key(node, side))
        return Signature((key,), self, (ROW, SHARED) if side == 1 else (SHARED, ROW))

    def step_key(self, node):
        return (_in_shape(node, 0), _in_shape(node, 1))     # the batched call reshapes to them

    def batched_call(self, F, node, inputs):
        out_m, out_n = node.out_shapes[0][1:]
        if self._side(node) == 1:       # (N b, m, k) . W (b, k, n): (b, N m, k) . W
            entries, rows, width = _in_shape(node, 0)
            x = F.reshape(inputs[0], shape=(-1, entries, rows, width))
            x = F.reshape(F.transpose(x, axes=(1, 0, 2, 3)), shape=(entries, -1, width))
            out = F.batch_dot(x, inputs[1],
                              transpose_b=bool(node.kwargs.get("transpose_b", False)))
            out = F.reshape(out, shape=(entries, -1, out_m, out_n))
            return [F.reshape(F.transpose(out, axes=(1, 0, 2, 3)), shape=(-1, out_m, out_n))]
        entries, rows, width = _in_shape(node, 1)   # W (b, m, k) . (N b, k, n)
        x = F.reshape(inputs[1], shape=(-1, entries, rows, width))
        x = F.reshape(F.transpose(x, axes=(1, 2, 0, 3)), shape=(entries, rows, -1))
        out = F.reshape(F.batch_dot(inputs[0], x), shape=(entries, out_m, -1, out_n))
        return [F.reshape(F.transpose(out, axes=(2, 0, 1, 3)), shape=(-1, out_m, out_n))]


register_rule("gemm2", Gemm2Rule(_gemm2_roles))
_BATCH_DOT = RowFallback(SharedBatchDotRule(), RowRule(all_row_roles))
_BATCH_DOT.source_dependent = True      # whether an input is weights (see calls.remember)
register_rule("batch_dot", _BATCH_DOT)
register_rule("FullyConnected", RowFallback(RowRule(first_row_roles), VectorProductRule()))
_DOT = RowFallback(VectorProductRule(), RowFallback(
    KnownMatrixDotRule(), RowFallback(EachDotRule(), RowRule(dot_roles))))
_DOT.source_dependent = True        # whether b is computed per sample (see calls.remember)
register_rule("dot", _DOT)
