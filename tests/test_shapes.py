"""The shapes ``ir/shapes.py`` infers without MXNet equal MXNet's own inference.

Every call of a few thousand drawn at random (operators, attributes, input
shapes, compatible or not) is inferred both ways: where ``shapes.infer``
answers, MXNet's symbolic inference must give the same output shapes, dtypes
and input shapes; where MXNet refuses the call, ``shapes.infer`` must not
answer (MXNet's error then reaches the user as before).
"""
import random
import types

import numpy as np
import pytest
from mxnet.base import MXNetError

from gluon_dynbatch.ir import ops, shapes
from gluon_dynbatch.ir.graph import slots_of
from gluon_dynbatch.rewrite import matrix_ops

UNARY = sorted(shapes._UNARY)                       # pylint: disable=protected-access
SAME = sorted(shapes._SAME_SHAPE)                   # pylint: disable=protected-access
BROADCAST = sorted(shapes._BROADCAST)               # pylint: disable=protected-access
REDUCE = sorted(shapes._REDUCE)                     # pylint: disable=protected-access
OTHERS = sorted(shapes._RULES)                      # pylint: disable=protected-access


def _shape(r, ndim=None):
    ndim = r.randint(1, 4) if ndim is None else ndim
    return tuple(r.choice((1, 2, 3, 4, 6)) for _ in range(ndim))


def _axis(r, ndim):
    return r.randint(-ndim - 1, ndim)       # out of range now and then


def _unary_call(r):
    name = r.choice(UNARY)
    shape = _shape(r)
    kwargs = {}
    if name.endswith("_scalar"):
        kwargs["scalar"] = r.choice((2, 0.5, -1.5))
    elif name == "Activation":
        kwargs["act_type"] = r.choice(("relu", "sigmoid", "tanh", "softrelu", "softsign",
                                       "gelu"))
    elif name == "LeakyReLU":
        kwargs = r.choice(({}, {"act_type": "leaky", "slope": 0.2}, {"act_type": "elu"},
                           {"act_type": "selu"}, {"act_type": "gelu"}))
    elif name == "clip":
        kwargs = {"a_min": -0.5, "a_max": 0.5}
    elif name in ("softmax", "log_softmax"):
        kwargs = r.choice(({}, {"axis": _axis(r, len(shape))},
                           {"axis": -1, "temperature": 2.0}))
    return name, kwargs, [shape]


def _binary_call(r):
    name = r.choice(SAME + BROADCAST)
    lhs = _shape(r)
    if r.random() < 0.5:
        rhs = lhs
    else:
        rhs = tuple(r.choice((d, 1, d + 1)) for d in lhs[r.randint(0, len(lhs) - 1):])
    if r.random() < 0.5:
        lhs, rhs = rhs, lhs
    return name, {}, [lhs, rhs]


def _reduce_call(r):
    name = r.choice(REDUCE)
    shape = _shape(r)
    kwargs = {}
    if r.random() < 0.9:
        axes = tuple(_axis(r, len(shape)) for _ in range(r.randint(1, 2)))
        kwargs["axis"] = axes[0] if len(axes) == 1 and r.random() < 0.5 else axes
    if r.random() < 0.5:
        kwargs["keepdims"] = r.random() < 0.5
    return name, kwargs, [shape]


def _other_call(r):
    name = r.choice(OTHERS)
    if name == "FullyConnected":
        data = _shape(r, r.randint(2, 3))
        flatten = r.random() < 0.5
        hidden = r.choice((1, 3, 5))
        width = int(np.prod(data[1:])) if flatten else data[-1]
        width = width if r.random() < 0.9 else width + 1
        no_bias = r.random() < 0.3
        kwargs = {"num_hidden": hidden, "no_bias": no_bias, "flatten": flatten}
        ins = [data, (hidden, width)] + ([] if no_bias else [(hidden,)])
        return name, kwargs, ins
    if name in ("dot", "batch_dot"):
        ndim = 2 if name == "dot" else 3
        lhs = _shape(r, ndim)
        inner = lhs[-2] if r.random() < 0.5 else lhs[-1]
        rhs = lhs[:-2] + (inner, r.choice((1, 2, 5)))
        if r.random() < 0.5:
            rhs = rhs[:-2] + (rhs[-1], rhs[-2])
        kwargs = {k: r.random() < 0.5 for k in ("transpose_a", "transpose_b")
                  if r.random() < 0.7}
        return name, kwargs, [lhs, rhs]
    shape = _shape(r)
    if name in ("reshape", "Reshape"):
        size = int(np.prod(shape))
        target = r.choice(((size,), (-1,), (1, -1), (size, 1), (-1, 2), (2, -1, 1),
                           (size + 1,), (-1, -1)))
        return name, {"shape": target}, [shape]
    if name == "transpose":
        axes = list(range(len(shape)))
        r.shuffle(axes)
        kwargs = r.choice(({}, {"axes": tuple(axes)}, {"axes": tuple(axes[1:])},
                           {"axes": tuple(a - len(shape) for a in axes)}))
        return name, kwargs, [shape]
    return name, {"axis": _axis(r, len(shape) + 1)}, [shape]      # expand_dims


def _calls(seed, count):
    r = random.Random(seed)
    makers = (_unary_call, _binary_call, _reduce_call, _other_call)
    return [r.choice(makers)(r) for _ in range(count)]


def _opdef(name):
    try:
        return ops.opdef(name)
    except AttributeError:
        return ops.opdef("_internal", name)


def _mxnet(name, node, in_shapes, in_dtypes):
    try:
        return ops._infer_symbolic(_opdef(name), node,        # pylint: disable=protected-access
                                   in_shapes, in_dtypes)
    except (MXNetError, ValueError, TypeError):
        return None


@pytest.mark.parametrize("seed", range(4))
def test_shapes_inferred_without_mxnet_equal_mxnets(seed):
    answered = 0
    for name, kwargs, in_shapes in _calls(seed, 700):
        node = types.SimpleNamespace(args=slots_of(len(in_shapes)), kwargs=kwargs)
        dtypes = (np.float32,) * len(in_shapes)
        ours = shapes.infer(_opdef(name), node, tuple(in_shapes), dtypes)
        if ours is None:
            continue
        answered += 1
        theirs = _mxnet(name, node, tuple(in_shapes), dtypes)
        assert theirs is not None, ("MXNet refuses", name, kwargs, in_shapes, ours)
        assert ours == theirs, (name, kwargs, in_shapes)
    assert answered > 300           # the rules answer for most of these calls


def test_shapes_leave_integer_and_mixed_dtypes_to_mxnet():
    node = types.SimpleNamespace(args=slots_of(2), kwargs={})
    add = ops.opdef("broadcast_add")
    assert shapes.infer(add, node, ((2, 3), (2, 3)), (np.int32, np.int32)) is None
    assert shapes.infer(add, node, ((2, 3), (2, 3)), (np.float32, np.float16)) is None
    found = shapes.infer(add, node, ((2, 3), (1, 3)), (np.float16, np.float16))
    assert found == (((2, 3),), (np.float16,), ((2, 3), (1, 3)))


def _matrix_call(r):
    """An operator of ``rewrite.matrix_ops`` on a sample's (m, n) matrix as its
    column of entries, of shapes that fit it or not."""
    m, n, width = r.randint(1, 4), r.randint(1, 4), r.choice((1, 3))
    column = (m * n, 1) if r.random() < 0.85 else (m * n + 1, 1)
    which = r.randrange(3)
    if which == 0:
        kind, axis = r.choice(matrix_ops.KINDS), r.choice((0, 1))
        shape = column if r.random() < 0.7 else (m * n, width)
        return matrix_ops.GroupOp(kind, n, axis), [shape]
    if which == 1:
        kind = r.choice(matrix_ops.PRODUCTS)
        if kind == "scores":
            return matrix_ops.PairOp(kind, n), [(m, width), (n, r.choice((width, width + 1)))]
        rows = n if kind == "weighted" else m
        return matrix_ops.PairOp(kind, n), [column, (r.choice((rows, rows + 1)), width)]
    kind = r.choice(("outer", "outer_r", "known", "known_r"))
    operator = r.choice(("broadcast_add", "broadcast_mul", "broadcast_sub"))
    if kind.startswith("outer"):
        shapes_ = [(m, 1), (n, 1)]
    else:
        shapes_ = [column, (m, r.choice((n, n + 1)))]
    if kind.endswith("_r"):
        shapes_.reverse()
    return matrix_ops.PairwiseOp(kind, operator, n), shapes_


def test_shapes_of_the_packages_matrix_operators_equal_mxnets():
    r = random.Random(11)
    answered = 0
    for _ in range(600):
        op, in_shapes = _matrix_call(r)
        node = types.SimpleNamespace(args=slots_of(len(in_shapes)), kwargs={"group": op.group})
        dtypes = (np.float32,) * len(in_shapes)
        ours = shapes.infer(op, node, tuple(in_shapes), dtypes)
        if ours is None:
            continue
        answered += 1
        theirs = _infer_own(op, node, tuple(in_shapes), dtypes)
        assert theirs is not None, ("MXNet refuses", op, in_shapes, ours)
        assert ours == theirs, (op, in_shapes)
    assert answered > 300


def _infer_own(op, node, in_shapes, in_dtypes):
    infer = ops._infer_symbolic          # pylint: disable=protected-access
    try:
        return infer(op, node, in_shapes, in_dtypes)
    except (MXNetError, ValueError, TypeError):
        return None
