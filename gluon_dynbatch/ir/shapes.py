"""Output shapes of common operators, without MXNet's symbolic inference.

A call of a shape never seen is analysed once (``calls.analyse``); MXNet's
inference of a one-operator symbol costs ~0.1-0.3 ms, more than all the rest of
learning the call, and a model whose samples differ in length (sets, sentences
under attention) meets new shapes batch after batch.  The operators below are
the bulk of such calls; their shapes follow from the input shapes and a few
attributes.

:func:`infer` answers only where it is sure: every input shape known, one
floating dtype, attributes of the plain types MXNet documents, the shapes
compatible.  Anything else (a shape MXNet would refuse included) returns None,
and MXNet's own inference decides, with its own error.
Operators of the package's own (``rewrite.matrix_ops``) give their shapes by
an ``out_shape`` method.  ``tests/test_shapes.py`` checks every answer against
MXNet's.
"""
import math

import numpy as np

from .graph import Slot

_FLOATS = frozenset((np.float16, np.float32, np.float64))

_UNARY = frozenset((
    "Activation", "relu", "sigmoid", "tanh", "exp", "log", "negative", "abs", "sqrt",
    "square", "rsqrt", "reciprocal", "sign", "softsign", "log1p", "expm1", "erf", "sin",
    "cos", "identity", "_copy", "BlockGrad", "stop_gradient", "zeros_like", "ones_like",
    "_mul_scalar", "_div_scalar", "_plus_scalar", "_minus_scalar", "_rminus_scalar",
    "_rdiv_scalar", "_power_scalar", "_rpower_scalar", "_maximum_scalar",
    "_minimum_scalar", "LeakyReLU", "clip", "softmax", "log_softmax"))
# Attributes each unary operator may carry without changing its output's shape.
_UNARY_ATTRS = {"Activation": {"act_type"}, "clip": {"a_min", "a_max"},
                "LeakyReLU": {"act_type", "slope"}, "softmax": {"axis", "temperature"},
                "log_softmax": {"axis", "temperature"}}
_SCALAR_ATTRS = frozenset(("scalar", "is_int"))
# (LeakyReLU's prelu and rrelu take another input or give two outputs.)
_ACT_TYPES = {"Activation": ("relu", "sigmoid", "tanh", "softrelu", "softsign"),
              "LeakyReLU": ("leaky", "elu", "selu", "gelu")}
_SAME_SHAPE = frozenset(("elemwise_add", "elemwise_sub", "elemwise_mul", "elemwise_div",
                         "_plus", "_minus", "_mul", "_div", "_add", "_sub"))
_BROADCAST = frozenset(("broadcast_add", "broadcast_sub", "broadcast_mul", "broadcast_div",
                        "broadcast_plus", "broadcast_minus", "broadcast_maximum",
                        "broadcast_minimum", "broadcast_power"))
_REDUCE = frozenset(("sum", "mean", "max", "min", "prod", "nansum", "nanprod"))


def infer(op, node, in_shapes, in_dtypes):
    """``(out_shapes, out_dtypes, inferred input shapes)`` of ``node``'s call of
    ``op`` (an ``ops.OpDef``, or an operator of the package's own with an
    ``out_shape`` method: ``rewrite.matrix_ops``) on inputs of ``in_shapes``
    and ``in_dtypes``; None where MXNet should decide."""
    name = op.name
    args, kwargs = node.args, node.kwargs
    if len(args) == 2 and not kwargs and name.endswith("_scalar") \
            and type(args[1]) in (int, float):
        args, kwargs = args[:1], {"scalar": args[1]}        # ``x / 8.0``
    if not in_shapes or len(args) != len(in_shapes) or not all(type(a) is Slot for a in args):
        return None
    if any(not s or 0 in s for s in in_shapes):
        return None
    dtype = in_dtypes[0]
    if dtype not in _FLOATS or any(d is not dtype for d in in_dtypes):
        return None
    own = getattr(op, "out_shape", None)
    if own is not None:
        out = own([tuple(s) for s in in_shapes])
        return None if out is None else ((out,), (dtype,), tuple(in_shapes))
    fn = _RULES.get(name)
    if fn is None:
        fn = _unary if name in _UNARY else _same_shape if name in _SAME_SHAPE else \
            _broadcast if name in _BROADCAST else _reduce if name in _REDUCE else None
        if fn is None:
            return None
    out = fn(name, kwargs, [tuple(s) for s in in_shapes])
    if out is None:
        return None
    out_shape, inputs = out
    return (out_shape,), (dtype,), tuple(inputs)


def _is_int(value):
    return type(value) is int


def _axis(value, ndim):
    """``value`` as an axis of ``ndim`` axes counted from 0; None if not one."""
    if not _is_int(value) or not -ndim <= value < ndim:
        return None
    return value % ndim


def _unary(name, kwargs, shapes):
    if len(shapes) != 1:
        return None
    allowed = _UNARY_ATTRS.get(name, _SCALAR_ATTRS if name.endswith("_scalar") else ())
    if not set(kwargs) <= set(allowed):
        return None
    for key, value in kwargs.items():
        if key == "axis":
            if _axis(value, len(shapes[0])) is None:
                return None
        elif key == "act_type":
            if value not in _ACT_TYPES.get(name, ()):
                return None
        elif key == "is_int":
            if type(value) is not bool:
                return None
        elif key == "temperature":
            if value is not None and type(value) is not float:
                return None
        elif type(value) not in (int, float):
            return None
    if name == "clip" and set(kwargs) != {"a_min", "a_max"} \
            or name == "Activation" and "act_type" not in kwargs:
        return None
    return shapes[0], shapes


def _same_shape(name, kwargs, shapes):
    if kwargs or len(shapes) != 2 or shapes[0] != shapes[1]:
        return None
    return shapes[0], shapes


def _broadcast(name, kwargs, shapes):
    if kwargs or len(shapes) != 2:
        return None
    out = broadcast_shape(*shapes)
    return None if out is None else (out, shapes)


def broadcast_shape(lhs, rhs):
    """The shape MXNet's ``broadcast_*`` operators give ``lhs`` and ``rhs``
    (the shorter padded with ones in front); None if they do not broadcast."""
    ndim = max(len(lhs), len(rhs))
    lhs, rhs = (1,) * (ndim - len(lhs)) + tuple(lhs), (1,) * (ndim - len(rhs)) + tuple(rhs)
    out = []
    for a, b in zip(lhs, rhs):
        if a != b and a != 1 and b != 1:
            return None
        out.append(max(a, b))
    return tuple(out)


def _reduce(name, kwargs, shapes):
    if len(shapes) != 1 or not set(kwargs) <= {"axis", "keepdims"}:
        return None
    shape = shapes[0]
    keepdims = kwargs.get("keepdims", False)
    if type(keepdims) is not bool:
        return None
    axis = kwargs.get("axis")
    if axis is None or axis == ():
        return None         # every axis: MXNet's legacy forms differ by case
    axes = axis if type(axis) is tuple else (axis,)
    found = [_axis(a, len(shape)) for a in axes]
    if any(a is None for a in found) or len(set(found)) != len(found):
        return None
    if keepdims:
        out = tuple(1 if k in found else d for k, d in enumerate(shape))
    else:
        out = tuple(d for k, d in enumerate(shape) if k not in found)
    if not out:
        return None         # a scalar: MXNet's shape is (1,)
    return out, shapes


def _fully_connected(name, kwargs, shapes):
    if not set(kwargs) <= {"num_hidden", "no_bias", "flatten"}:
        return None
    hidden, no_bias = kwargs.get("num_hidden"), kwargs.get("no_bias", False)
    flatten = kwargs.get("flatten", True)
    if not _is_int(hidden) or hidden <= 0 or type(no_bias) is not bool \
            or type(flatten) is not bool or len(shapes) != (2 if no_bias else 3):
        return None
    data = shapes[0]
    if len(data) < 2:
        return None
    if flatten:
        width = math.prod(data[1:])
        out = (data[0], hidden)
    else:
        width, out = data[-1], data[:-1] + (hidden,)
    if shapes[1] != (hidden, width) or not no_bias and shapes[2] != (hidden,):
        return None
    return out, shapes


def _dot(name, kwargs, shapes):
    """``dot`` of two matrices, ``batch_dot`` of two stacks of them (other ranks:
    MXNet's rules), either transposed."""
    if not set(kwargs) <= {"transpose_a", "transpose_b"} or len(shapes) != 2:
        return None
    ta, tb = kwargs.get("transpose_a", False), kwargs.get("transpose_b", False)
    if type(ta) is not bool or type(tb) is not bool:
        return None
    lhs, rhs = shapes
    ndim = 2 if name == "dot" else 3
    if len(lhs) != ndim or len(rhs) != ndim or lhs[:-2] != rhs[:-2]:
        return None
    rows, inner = (lhs[-1], lhs[-2]) if ta else lhs[-2:]
    inner2, cols = (rhs[-1], rhs[-2]) if tb else rhs[-2:]
    if inner != inner2:
        return None
    return lhs[:-2] + (rows, cols), shapes


def _reshape(name, kwargs, shapes):
    if set(kwargs) != {"shape"} or len(shapes) != 1:
        return None
    target = kwargs["shape"]
    if type(target) is not tuple or not target \
            or not all(_is_int(d) and (d > 0 or d == -1) for d in target) \
            or list(target).count(-1) > 1:
        return None         # MXNet's special codes (0, -2, -3, -4) and reverse: its rules
    size = math.prod(shapes[0])
    known = math.prod([d for d in target if d != -1])
    if -1 in target:
        if size % known:
            return None
        target = tuple(size // known if d == -1 else d for d in target)
    elif known != size:
        return None
    return target, shapes


def _transpose(name, kwargs, shapes):
    if not set(kwargs) <= {"axes"} or len(shapes) != 1:
        return None
    shape = shapes[0]
    axes = kwargs.get("axes", ())
    if type(axes) is not tuple:
        return None
    if not axes:
        return shape[::-1], shapes
    if sorted(axes) != list(range(len(shape))) or not all(_is_int(a) for a in axes):
        return None         # (MXNet refuses axes counted from the end)
    return tuple(shape[a] for a in axes), shapes


def _expand_dims(name, kwargs, shapes):
    if set(kwargs) != {"axis"} or len(shapes) != 1:
        return None
    shape = shapes[0]
    axis = _axis(kwargs["axis"], len(shape) + 1)
    if axis is None:
        return None
    return shape[:axis] + (1,) + shape[axis:], shapes


_RULES = {"FullyConnected": _fully_connected, "dot": _dot, "batch_dot": _dot,
          "reshape": _reshape, "Reshape": _reshape, "transpose": _transpose,
          "expand_dims": _expand_dims}
