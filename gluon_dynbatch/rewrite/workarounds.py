"""Calls recorded in another form because MXNet 1.9.1 computes them wrongly in a CachedOp.

``F.LeakyReLU(x, gamma, act_type="prelu")`` (``nn.PReLU``), whatever slope or
bounds it is also given (a prelu ignores them), is recorded as
``where(x > 0, x, gamma * x)``, the same values and gradients: MXNet
1.9.1 loses part of ``gamma``'s gradient when a prelu runs inside a CachedOp
(two of them in one graph, or one beside another input), and programs and
compiled plans are CachedOps.

``F.Embedding(..., sparse_grad=True)`` of a weight whose gradient is stored
dense (a Parameter without ``grad_stype="row_sparse"``) is recorded with
``sparse_grad=False``: eager MXNet falls back to a dense gradient, a graph
refuses the call in its backward pass; the gradient's values are the same.
"""
from mxnet.ndarray import NDArray

from ..record import passes
from ..record.frames import one_call


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


def dense_embedding_gradient(rec, op, args, kwargs):
    """``F.Embedding(data, weight, ..., sparse_grad=True)`` where ``weight`` is no
    Parameter with a row-sparse gradient."""
    if not kwargs.get("sparse_grad") or len(args) < 2:
        return None
    node, _ = rec.value_of(args[1])
    param = getattr(node, "param", None)
    if param is not None and getattr(param, "_grad_stype", "default") == "row_sparse":
        return None
    return rec.call_op(op, args, dict(kwargs, sparse_grad=False))


passes.register("Embedding", dense_embedding_gradient,
                when=lambda args, kwargs: len(args) != 2 or bool(kwargs.get("sparse_grad")))
