"""Rules of calls that batch row by row, and of views.

* ``RowRule``: the same operator on the inputs concatenated along axis 0,
  the outputs split by each node's rows; each array input ``ROW``, ``BROW``
  or ``SHARED`` (its roles function says which, or None: alone);
* ``ReshapeRule``: a reshape keeps each sample's data contiguous, so the batch
  is one reshape of the concatenation;
* ``SoftmaxRowRule``: a softmax along a row's axis, reading its input through
  a reshape (``plain_layout``);
* ``ConvolutionRule``: a convolution on rows, reading its input through a
  copy inside CachedOps (``default_layout``);
* ``ViewRule``: row slices, axis-0 concatenation, repeats and broadcasts of a
  row only move rows: no step, the reader's gather resolves them;
* ``RowFallback``: the first of two rules that takes the node.
"""
import ast

import mxnet as mx
import numpy as np

from ..ir.calls import uses_length
from ..ir.rules import (BROW, ROW, SHARED, Rule, Signature, _in_dtype, _in_shape, _shared_key,
                        _trail, call_as_recorded, register_rule)


class RowRule(Rule):
    """Batch by concatenating inputs along axis 0.

    Parameters
    ----------
    roles : callable
        ``roles(node) -> tuple of ROW/BROW/SHARED`` per array input, or None
        when this particular call cannot be batched.
    """

    program_form = "rows"

    def __init__(self, roles, broadcasts=False):
        self._roles = roles
        self.broadcasts = broadcasts

    def signature(self, node):
        if not node.inputs:
            return None
        roles = self._roles(node)
        if roles is None:
            return None
        keys = []
        for k, role in enumerate(roles):
            shape = _in_shape(node, k)
            if role == SHARED:
                keys.append(_shared_key(node, k))
            else:
                if not shape:
                    return None
                keys.append((role, _trail(shape), _in_dtype(node, k)))
        return Signature(tuple(keys), self, roles)


def elementwise_roles(node):
    """Inputs with the output's rank broadcast by rows; lower rank ones are shared."""
    ndim = len(node.out_shapes[0])
    out_rows = node.out_shapes[0][0]
    roles = []
    for k in range(len(node.inputs)):
        shape = _in_shape(node, k)
        if len(shape) < ndim:
            roles.append(SHARED)
        elif shape[0] == out_rows or shape[0] == 1:
            roles.append(BROW)
        else:
            return None
    return tuple(roles)


def where_roles(node):
    """``where(condition, x, y)``: a 1-d condition of a higher-rank output has a
    flag per row of the output (MXNet's reading, not a broadcast of trailing
    axes), so it is concatenated as rows; otherwise as elementwise operators."""
    condition = _in_shape(node, 0)
    if len(condition) != 1 or len(node.out_shapes[0]) == 1:
        return elementwise_roles(node)
    roles = elementwise_roles(node)
    if roles is None or condition[0] != node.out_shapes[0][0]:
        return None
    return (ROW,) + roles[1:]


def first_row_roles(node):
    """The first input is concatenated, the others (weights) are shared."""
    if len(_in_shape(node, 0)) < 2:
        return None
    return (ROW,) + (SHARED,) * (len(node.inputs) - 1)


def all_row_roles(node):
    """Every input is concatenated; all have the output's rows."""
    rows = node.out_shapes[0][0]
    if any(_in_shape(node, k)[0] != rows for k in range(len(node.inputs))):
        return None
    return (ROW,) * len(node.inputs)


def reshape_like_roles(node):
    """``reshape_like(x, like)``: both concatenated when the whole shape is taken
    (``x`` and ``like`` have the output's rows); not batched when ranges of axes
    (``lhs_begin`` ... ``rhs_end``) take part of ``like``'s shape, whose row count
    a concatenation would change."""
    if any(node.kwargs.get(name) is not None
           for name in ("lhs_begin", "lhs_end", "rhs_begin", "rhs_end")):
        return None
    return all_row_roles(node)


def stack_roles(node):
    """``stack`` along an axis other than the rows (``axis=-(ndim + 1)`` is axis 0):
    every input concatenated."""
    axis = int(node.kwargs.get("axis", 0))
    if axis < 0:
        axis += len(_in_shape(node, 0)) + 1
    return all_row_roles(node) if axis != 0 else None


def _axis(node, name, default):
    """Normalised non-negative axis attribute of input 0 (None if absent/None)."""
    axis = node.kwargs.get(name, default)
    if axis is None or isinstance(axis, (tuple, list)):
        return axis
    ndim = len(_in_shape(node, 0))
    return axis + ndim if axis < 0 else axis


def axis_roles(name, default, extra_shared=False):
    """Unary along an axis: batchable when the axis is not 0.

    With ``exclude=True`` (a reduction over every axis but those given, as
    Gluon's losses average per sample) it is batchable when axis 0 is given.
    """
    def roles(node):
        axis = _axis(node, name, default)
        if axis is None:
            return None
        axes = axis if isinstance(axis, (tuple, list)) else (axis,)
        ndim = len(_in_shape(node, 0))
        has_rows = any((a + ndim if a < 0 else a) == 0 for a in axes)
        if not axes or has_rows != bool(node.kwargs.get("exclude", False)):
            return None
        tail = SHARED if extra_shared else ROW
        return (ROW,) + (tail,) * (len(node.inputs) - 1)
    return roles


def concat_roles(node):
    if _axis(node, "dim", 1) == 0:
        return None
    return all_row_roles(node)


def broadcast_like_roles(node):
    """``broadcast_like(x, like)`` over the trailing axes: ``like`` has the
    output's rows, ``x`` those rows or one row (repeated, as broadcasting would)."""
    if node.kwargs.get("lhs_axes") is not None or node.kwargs.get("rhs_axes") is not None:
        return None
    rows = node.out_shapes[0][0]
    lhs, rhs = _in_shape(node, 0), _in_shape(node, 1)
    if len(lhs) != len(rhs) or rhs[0] != rows or lhs[0] not in (rows, 1):
        return None
    return (BROW, ROW)


def slice_roles(node):
    begin, end = node.kwargs.get("begin", ()), node.kwargs.get("end", ())
    step = node.kwargs.get("step", ()) or ()
    if (begin and begin[0] not in (None, 0)) or (end and end[0] is not None):
        return None
    if step and step[0] not in (None, 1):
        return None
    return (ROW,)


def tile_roles(node):
    """``tile``: rows when the row axis is repeated once (``reps`` no longer than
    the rank, its first entry 1 when as long)."""
    reps = tuple(node.kwargs.get("reps", ()))
    ndim = len(_in_shape(node, 0))
    if ndim < 1 or len(reps) > ndim or (len(reps) == ndim and reps[0] != 1):
        return None
    return (ROW,)


def batchnorm_roles(node):
    """BatchNorm batches on the running statistics only.  In training its batch
    statistics mix the rows of a batch; recorded for gradients in predict mode,
    MXNet 1.9.1's backward still reads the batch's statistics (the gradient of
    a call depends on the rows it ran with): either way, one call at a time.
    ``use_global_stats`` reads the running statistics both ways.  With
    ``output_mean_var`` its second and third outputs are per channel, not per
    row: one call at a time."""
    from mxnet import autograd
    if (autograd.is_training() or autograd.is_recording()) \
            and not _true(node.kwargs.get("use_global_stats", False)):
        return None
    if _axis(node, "axis", 1) == 0 or _true(node.kwargs.get("output_mean_var", False)):
        return None
    return first_row_roles(node)


def _true(flag):
    """An operator's boolean attribute as MXNet parses it (``"True"``, ``"1"``, ``1``)."""
    if isinstance(flag, str):
        return flag.strip().lower() in ("true", "1")
    return bool(flag)


def dropout_roles(node):
    """Dropout batches by rows unless its mask is shared along axis 0 (each
    sample's one mask would become one for every sample's rows)."""
    axes = _axes_tuple(node.kwargs.get("axes", ()))
    if axes is None:
        return None
    ndim = len(_in_shape(node, 0))
    return None if any(a % ndim == 0 for a in axes if ndim) else (ROW,)


def _axes_tuple(axes):
    """An ``axes`` attribute as MXNet parses it (an int, a tuple, or either
    written as a string: ``1``, ``"(0,)"``), as a tuple of ints; None if it
    cannot be read."""
    if isinstance(axes, str):
        try:
            axes = ast.literal_eval(axes.strip() or "()")
        except (ValueError, SyntaxError):
            return None
    if axes is None:
        return ()
    if isinstance(axes, (int, np.integer)):
        return (int(axes),)
    try:
        return tuple(int(a) for a in axes)
    except (TypeError, ValueError):
        return None


def lookup_roles(node):
    """Embedding and one_hot: one output row per index; a table is shared."""
    if len(_in_shape(node, 0)) < 1:
        return None
    return (ROW,) + (SHARED,) * (len(node.inputs) - 1)


class ReshapeRule(Rule):
    """Any reshape of a sample's rows: batched as one reshape to ``(-1,) + tail``."""

    program_form = "reshape"
    keyed_attrs = False     # the shape attribute differs with rows; the tail decides

    def signature(self, node):
        shape_in, shape_out = _in_shape(node, 0), node.out_shapes[0]
        if not shape_in or not shape_out:
            return None
        # Inputs are concatenated, so their rows must agree too (a reshape of a
        # (4H, E) weight and one of a (4H, H) weight both give (-1,)).
        return Signature((("reshape", _trail(shape_in), _trail(shape_out), _in_dtype(node, 0)),),
                         self, (ROW,))

    def batched_call(self, F, node, inputs):
        return [F.reshape(inputs[0], shape=(-1,) + tuple(_trail(node.out_shapes[0])))]


def plain_layout(F, x, ndim):
    """``x`` through a reshape to its own shape, for MKLDNN's softmax.

    MXNet 1.9.1's MKLDNN softmax crashes (segfault) on the output of a
    ``concat`` along axis 1 of 2-D pieces, some one column wide, once there are
    two or more rows: what batching per-sample attention scores gives.  A
    reshape operator lays the input out plainly; copies (``identity``,
    ``* 1``) do not, inside a CachedOp.
    """
    return F.reshape(x, shape=(0,) * ndim)


class SoftmaxRowRule(RowRule):
    """``softmax`` and ``log_softmax`` on rows, reading ``plain_layout`` input."""

    def batched_call(self, F, node, inputs):
        plain = plain_layout(F, inputs[0], len(node.out_shapes[0]))
        rest = list(inputs[1:])
        if rest and uses_length(node):
            # MXNet's kernel reads and writes outside a row whose length is
            # negative or past the axis: other samples' rows, when batched.
            # Valid lengths are left as they are.
            shape = node.out_shapes[0]      # a program's entry has no inputs
            size = shape[int(node.kwargs.get("axis", -1)) % len(shape)]
            rest[0] = F.clip(rest[0], 0, size)
        return call_as_recorded(F, node, [plain] + rest)


def default_layout(F, x):
    """``x`` through a copy of all its rows, for MKLDNN's convolution.

    Inside a CachedOp, MXNet 1.9.1's MKLDNN convolution fails in backward
    ("could not create a primitive descriptor for a reorder primitive") when
    its input is the transpose of an embedding lookup (a character CNN: rows
    of a table, reshaped, channels moved before the characters), reshaped or
    not.  ``slice_axis`` over every row gives the gradient back in the plain
    layout; a reshape, ``identity`` or ``* 1`` do not.
    """
    return F.slice_axis(x, axis=0, begin=0, end=None)


class ConvolutionRule(RowRule):
    """``Convolution`` on rows, its data read through ``default_layout`` in
    symbolic (CachedOp) form; imperative calls run as recorded."""

    def batched_call(self, F, node, inputs):
        if F is not mx.sym:
            return call_as_recorded(F, node, inputs)
        return call_as_recorded(F, node, [default_layout(F, inputs[0])] + list(inputs[1:]))


class PoolingRule(RowRule):
    """``Pooling`` on rows, its data read through ``default_layout``.

    MXNet 1.9.1's MKLDNN pooling fails in backward ("could not create a
    primitive descriptor for a reorder primitive") on the batched rows of a
    grid made back from a transpose (a non-local block's positions as rows),
    imperatively as well as in CachedOps, where per sample it does not.
    """

    def batched_call(self, F, node, inputs):
        return call_as_recorded(F, node, [default_layout(F, inputs[0])] + list(inputs[1:]))


def broadcast_rows_roles(node):
    """``broadcast_to``/``broadcast_axis`` that keeps the rows: it broadcasts
    trailing axes only (the rows of a (1, 1) value to (1, H))."""
    if node.out_shapes[0][0] != _in_shape(node, 0)[0]:
        return None
    if node.op.name == "broadcast_axis":
        axis = node.kwargs.get("axis", ())
        axes = axis if isinstance(axis, (tuple, list)) else (axis,)
        ndim = len(_in_shape(node, 0))
        if any((a + ndim if a < 0 else a) == 0 for a in axes):
            return None
    return (ROW,)


class BroadcastRowsRule(RowRule):
    """``broadcast_to`` over trailing axes, on rows: the target's first size
    becomes 0 (MXNet: keep the input's) so that it holds for any row count."""

    program_form = "own"    # right on one call's rows as on many

    def batched_call(self, F, node, inputs):
        if node.op.name != "broadcast_to":
            return call_as_recorded(F, node, inputs)
        shape = tuple(node.kwargs["shape"])
        return call_as_recorded(F, node, inputs, {"shape": (0,) + shape[1:]})


class RowFallback(Rule):
    """Try ``first`` (usually a segment rule), else ``second``."""

    def __init__(self, first, second):
        self.first, self.second = first, second
        self.batching = "choice"

    def signature(self, node):
        found = self.first.signature(node)
        return found if found is not None else self.second.signature(node)


class ViewRule(Rule):
    """Row movements: no step, the consumer gathers the rows directly."""

    batching = "view"

    def __init__(self, applies):
        self._applies = applies

    def signature(self, node):
        return Signature("view", self, None) if self._applies(node) else None


def _rows_view(node):
    return node.kwargs.get("axis") == 0 and len(node.inputs) == 1


def _concat_view(node):
    if _axis(node, "dim", 1) != 0:
        return False
    tail = _trail(node.out_shapes[0])
    return all(_trail(_in_shape(node, k)) == tail for k in range(len(node.inputs)))


def _repeat_view(node):
    repeats = node.kwargs.get("repeats")
    return node.kwargs.get("axis") == 0 and type(repeats) is int and repeats >= 1


def _bcast_view(node):
    shape_in, shape_out = _in_shape(node, 0), node.out_shapes[0]
    return (len(shape_in) == len(shape_out) and shape_in[0] == 1
            and _trail(shape_in) == _trail(shape_out))


_UNARY = """Activation relu sigmoid tanh softsign exp expm1 log log1p log2 log10 sqrt
rsqrt cbrt rcbrt square abs sign negative reciprocal floor ceil round rint trunc fix
sin cos tan arcsin arccos arctan sinh cosh arcsinh arccosh arctanh erf erfinv gamma
gammaln degrees radians clip Cast cast amp_cast identity _copy zeros_like ones_like BlockGrad
stop_gradient hard_sigmoid smooth_l1 logical_not LeakyReLU _plus_scalar _minus_scalar
_rminus_scalar _mul_scalar _div_scalar _rdiv_scalar _mod_scalar _rmod_scalar
_power_scalar _rpower_scalar _maximum_scalar _minimum_scalar _equal_scalar
_not_equal_scalar _greater_scalar _greater_equal_scalar _lesser_scalar
_lesser_equal_scalar _hypot_scalar _logical_and_scalar _logical_or_scalar
_logical_xor_scalar""".split()
_NARY = """broadcast_add broadcast_sub broadcast_mul broadcast_div broadcast_mod
broadcast_power broadcast_maximum broadcast_minimum broadcast_hypot broadcast_equal
broadcast_not_equal broadcast_greater broadcast_greater_equal broadcast_lesser
broadcast_lesser_equal broadcast_logical_and broadcast_logical_or broadcast_logical_xor
broadcast_plus broadcast_minus elemwise_add elemwise_sub elemwise_mul elemwise_div
_plus _minus _mul _div _grad_add _Plus _Minus _Mul _Div _power _Power _maximum _minimum
add_n ElementWiseSum""".split()
# Elementwise operators of arrays; the ``broadcast_*`` ones are ``rules.broadcasts``'.
ELEMENTWISE = [name for name in _UNARY + _NARY if not name.startswith("broadcast_")]
register_rule(ELEMENTWISE, RowRule(elementwise_roles))
register_rule("where", RowRule(where_roles))
register_rule("Convolution", ConvolutionRule(first_row_roles))
register_rule(["Deconvolution", "L2Normalization"], RowRule(first_row_roles))
# ``x / sqrt(x.shape[-1])`` (Transformer attention scores): rows of rank 2 or more.
register_rule("div_sqrt_dim", RowRule(first_row_roles))
register_rule("Pooling", PoolingRule(first_row_roles))
register_rule(["Embedding", "one_hot"], RowRule(lookup_roles))
register_rule("LayerNorm", RowRule(axis_roles("axis", -1, extra_shared=True)))
# Image operators computed per image (per row of axis 0), their weights shared.
register_rule(["InstanceNorm", "GroupNorm", "space_to_depth", "depth_to_space",
               "AdaptiveAvgPooling2D", "GridGenerator"], RowRule(first_row_roles))
register_rule(["BilinearSampler", "SpatialTransformer"], RowRule(all_row_roles))
register_rule("UpSampling", RowRule(
    lambda n: first_row_roles(n) if n.kwargs.get("sample_type") == "bilinear"
    else all_row_roles(n)))
register_rule("BilinearResize2D", RowRule(
    lambda n: first_row_roles(n) if len(n.inputs) == 1 else all_row_roles(n)))
register_rule("BatchNorm", RowRule(batchnorm_roles))
# Gluon's losses (L2, L1, Huber, sigmoid cross-entropy) reshape the label like the prediction.
register_rule("reshape_like", RowRule(reshape_like_roles))
register_rule("broadcast_like", RowRule(broadcast_like_roles, broadcasts=True))
register_rule("Dropout", RowRule(dropout_roles))
register_rule(["softmin", "argsort"], RowRule(axis_roles("axis", -1)))
# ``topk``, ``sort``: along axis 0 too (``segments.SegmentOrderRule``).
register_rule(["SliceChannel", "split"], RowRule(axis_roles("axis", 1)))
register_rule("pick", RowRule(axis_roles("axis", -1)))
register_rule(["flip", "reverse"], RowRule(axis_roles("axis", None)))
register_rule("repeat", RowFallback(ViewRule(_repeat_view), RowRule(axis_roles("axis", None))))
register_rule("tile", RowRule(tile_roles))
# Softmax over everything but the rows ("instance") or over axis 1 ("channel").
register_rule("SoftmaxActivation", RowRule(lambda n: (ROW,) if len(_in_shape(n, 0)) >= 2
                                           else None))
register_rule(["Concat", "concat"], RowFallback(ViewRule(_concat_view), RowRule(concat_roles)))
register_rule(["stack"], RowRule(stack_roles))
register_rule(["slice", "crop"], RowRule(slice_roles))
register_rule(["slice_axis"], RowFallback(ViewRule(_rows_view), RowRule(axis_roles("axis", 0))))
register_rule(["broadcast_to", "broadcast_axis"],
              RowFallback(ViewRule(_bcast_view), BroadcastRowsRule(broadcast_rows_roles)))
register_rule(["Reshape", "reshape", "Flatten", "flatten", "expand_dims", "squeeze"],
              ReshapeRule())
