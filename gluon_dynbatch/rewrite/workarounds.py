"""Calls recorded in another form because MXNet 1.9.1 computes them wrongly in a CachedOp.

``F.LeakyReLU(x, gamma, act_type="prelu")`` (``nn.PReLU``), whatever slope or
bounds it is also given (a prelu ignores them), is recorded as
``where(x > 0, x, gamma * x)``, the same values and gradients: MXNet
1.9.1 loses part of ``gamma``'s gradient when a prelu runs inside a CachedOp
(two of them in one graph, or one beside another input), and programs and
compiled plans are CachedOps.

A lookup's ``sparse_grad`` is recorded as its weight's gradient is stored:
``F.Embedding(..., sparse_grad=True)`` (and ``F.contrib.SparseEmbedding``) of a
weight whose gradient is dense (a Parameter without ``grad_stype="row_sparse"``,
a computed table) with ``sparse_grad=False``, and ``F.Embedding`` without it of a
weight whose gradient is row-sparse (such a Parameter, an array given
``attach_grad(stype="row_sparse")``) with ``sparse_grad=True``.  Eager MXNet
falls back to the stored kind (adding the dense gradients of several calls);
a graph refuses the call in its backward pass.  The values are the same.
"""
from mxnet.ndarray import NDArray

from ..ir.ops import opdef
from ..record import passes
from ..record.frames import one_call
from ..record.lazy import LazyArray


# LeakyReLU's arguments in order; a prelu ignores the slope and bounds.
_LEAKY_RELU_ARGS = ("data", "gamma", "act_type", "slope", "lower_bound", "upper_bound",
                    "name")


def prelu(rec, op, args, kwargs):
    """``F.LeakyReLU(..., act_type="prelu")`` of a data array and a 1-d slope."""
    if len(args) > len(_LEAKY_RELU_ARGS) or not set(kwargs) <= set(_LEAKY_RELU_ARGS):
        return None
    named = dict(zip(_LEAKY_RELU_ARGS, args), **kwargs)
    data, gamma = named.get("data"), named.get("gamma")
    if named.get("act_type") != "prelu" or \
            not (isinstance(data, NDArray) and isinstance(gamma, NDArray)) \
            or len(data.shape) < 1 or len(gamma.shape) != 1:
        return None
    return one_call(rec, _prelu, rec.F, data, gamma)


def _prelu(ns, data, gamma):
    # gamma runs along axis 1 (channels), as MXNet's prelu broadcasts it, or
    # along a vector's only axis.  Choices, not ``relu(x) + gamma * (x - relu(x))``:
    # inf - inf would be NaN, and gamma's gradient reads x only where x <= 0
    # (0 * inf would be NaN).
    ndim = len(data.shape)
    gamma = ns.reshape(gamma, shape=(-1,) if ndim == 1 else (1, -1) + (1,) * (ndim - 2))
    positive = data > 0
    negative = ns.where(positive, ns.zeros_like(data), data)
    return ns.where(positive, data, ns.broadcast_mul(gamma, negative))


passes.register("LeakyReLU", prelu,
                when=lambda args, kwargs: len(args) > 2 or kwargs.get("act_type") == "prelu")


def embedding_gradient(rec, op, args, kwargs):
    """``F.Embedding(data, weight, ...)`` whose ``sparse_grad`` is not how
    ``weight``'s gradient is stored, with the one that is."""
    if len(args) < 2:
        return None
    sparse = _row_sparse_gradient(rec, args[1])
    if bool(kwargs.get("sparse_grad")) == sparse:
        return None
    return rec.call_op(op, args, dict(kwargs, sparse_grad=sparse))


def dense_sparse_embedding(rec, op, args, kwargs):
    """``F.contrib.SparseEmbedding(data, weight, ...)`` (a lookup whose gradient is
    always row-sparse) of a weight whose gradient is dense: ``F.Embedding``."""
    if len(args) != 2 or not set(kwargs) <= {"input_dim", "output_dim", "dtype",
                                             "deterministic", "name"} \
            or _row_sparse_gradient(rec, args[1]):
        return None
    # (``deterministic`` orders the sparse gradient's rows: a dense one has no order)
    kept = {k: v for k, v in kwargs.items() if k not in ("deterministic", "name")}
    return rec.call_op(_EMBEDDING, args, dict(kept, sparse_grad=False))


_EMBEDDING = opdef("Embedding")


def _row_sparse_gradient(rec, weight):
    """Whether ``weight``'s gradient is stored row-sparse."""
    return _stored_row_sparse(rec.value_of(weight)[0])


def _stored_row_sparse(node):
    """Whether the gradient of graph node ``node`` is stored row-sparse: a
    Parameter declared so (and trained), or a leaf of an array given
    ``attach_grad(stype="row_sparse")``."""
    param = getattr(node, "param", None)
    if param is not None:
        return getattr(param, "_grad_stype", "default") == "row_sparse" \
            and param.grad_req != "null"
    return node in getattr(getattr(node, "graph", None), "sparse_grad_leaves", ())


def _may_change_gradient(args, kwargs):
    """Whether ``embedding_gradient`` may rewrite an ``F.Embedding`` call: one whose
    attributes are given by position, asks a sparse gradient, or reads a table
    that is not a recorded value or whose gradient is row-sparse."""
    if len(args) != 2 or kwargs.get("sparse_grad"):
        return True
    return type(args[1]) is not LazyArray or _stored_row_sparse(args[1]._node)


passes.register("Embedding", embedding_gradient, when=_may_change_gradient)
passes.register(["SparseEmbedding", "_contrib_SparseEmbedding"], dense_sparse_embedding)
