"""Calls recorded in another form because MXNet 1.9.1 computes them wrongly in a CachedOp.

``F.LeakyReLU(x, gamma, act_type="prelu")`` (``nn.PReLU``) is recorded as
``relu(x) + gamma * (x - relu(x))``, the same values and gradients: MXNet
1.9.1 loses part of ``gamma``'s gradient when a prelu runs inside a CachedOp
(two of them in one graph, or one beside another input), and programs and
compiled plans are CachedOps.
"""
from mxnet.ndarray import NDArray

from ..record import passes
from ..record.frames import one_call


def prelu(rec, op, args, kwargs):
    """``F.LeakyReLU(..., act_type="prelu")`` of a data array and a 1-d slope."""
    if kwargs.get("act_type") != "prelu" or len(args) > 2 \
            or not set(kwargs) <= {"data", "gamma", "act_type", "name"}:
        return None
    named = dict(zip(("data", "gamma"), args), **kwargs)
    data, gamma = named.get("data"), named.get("gamma")
    if not (isinstance(data, NDArray) and isinstance(gamma, NDArray)) \
            or len(data.shape) < 2 or len(gamma.shape) != 1:
        return None
    return one_call(rec, _prelu, rec.F, data, gamma)


def _prelu(ns, data, gamma):
    # gamma runs along axis 1 (channels), as MXNet's prelu broadcasts it.
    # Choices, not ``relu(x) + gamma * (x - relu(x))``: inf - inf would be NaN,
    # and gamma's gradient reads x only where x <= 0 (0 * inf would be NaN).
    gamma = ns.reshape(gamma, shape=(1, -1) + (1,) * (len(data.shape) - 2))
    positive = data > 0
    negative = ns.where(positive, ns.zeros_like(data), data)
    return ns.where(positive, data, ns.broadcast_mul(gamma, negative))


passes.register("LeakyReLU", prelu)
