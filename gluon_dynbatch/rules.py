"""Batching signatures and the registry of batching rules.

A rule looks at one recorded node and says whether, and with which other
nodes, it may run as one batched call along axis 0:

* ``RowRule``: run the same operator on the inputs concatenated along axis 0
  and split the outputs by each node's rows.  Each array input has a role:
  ``ROW`` (concatenated; rows match the output's), ``BROW`` (concatenated;
  a one-row input is repeated to the node's output rows, as broadcasting
  would) or ``SHARED`` (the same value for every node in the batch, passed once);
  a rule that reads an input's values when it plans says ``KNOWN`` (not passed).
* ``ReshapeRule``: reshapes keep each sample's data contiguous, so the batch
  is one reshape of the concatenation.
* ``SegmentRule``: sum or mean over axis 0 of each node's rows (ragged), by
  padding to the longest and reducing a new axis; ``SegmentSoftmaxRule`` the
  same for a softmax over axis 0 (attention over a node's rows).
* ``ViewRule``: row slices, axis-0 concatenation, repeats and broadcasting only
  move rows; they become index lists resolved by the consumer's gather, not steps.
* ``ALONE``: everything else runs one node at a time, exactly as recorded.

A rule's ``signature(node)`` is a pure function of the node (its operator,
constants, input shapes and dtypes): a :class:`Signature`, or None when the
node must run alone.  Its ``key`` is hashable: nodes with equal keys are
interchangeable for batching; ``intern`` turns keys into small ints (as
DyNet's ``SigMap`` does) so that planning hashes ints.  Its ``rule`` is the
rule that batches the node (a choice picks one of two) and its ``roles`` the
role of each input.  ``register_rule`` adds rules for more operators.
"""
import threading
from collections import namedtuple

import numpy as np

ROW, BROW, SHARED, KNOWN = "row", "brow", "shared", "known"

Signature = namedtuple("Signature", ["key", "rule", "roles"])
Signature.__doc__ = """How a node batches: ``key`` (equal keys batch together), the
``rule`` that batches it and the ``roles`` of its inputs (None where unused)."""

_INTERNED = {}
_INTERNED_LOCK = threading.Lock()


def intern(key):
    """A small int standing for signature key ``key`` in this process."""
    found = _INTERNED.get(key)
    if found is None:
        with _INTERNED_LOCK:
            found = _INTERNED.setdefault(key, len(_INTERNED))
    return found


class Rule:
    """Base class: ``signature(node)`` returns a :class:`Signature`, or None to run alone."""

    batching = "rows"          # how a step of its nodes runs (see lower.py)
    keyed_attrs = True      # constant arguments are part of the signature

    def signature(self, node):
        raise NotImplementedError

    def step_key(self, node):
        """What a compiled step of ``node``'s batch depends on beyond its operator,
        constant arguments and the trailing shapes of its inputs and outputs."""
        return ()

    def batched_call(self, F, node, inputs):
        """Run the batch of ``node``'s signature on gathered ``inputs``.

        ``F`` is ``mx.nd`` or ``mx.sym``; returns a list of outputs laid out
        as the nodes' outputs concatenated along axis 0.
        """
        return call_as_recorded(F, node, inputs)


def call_as_recorded(F, node, inputs, extra_kwargs=None):
    """Call ``node``'s operator through ``F`` with ``inputs`` in its array slots."""
    if node.op.path is None:            # a program (see programs.py)
        return node.op.run(F, inputs, node.info)
    fn = F
    for part in node.op.path:
        fn = getattr(fn, part)
    args = [inputs[a.k] if type(a).__name__ == "Slot" else a for a in node.args]
    kwargs = {k: (inputs[v.k] if type(v).__name__ == "Slot" else v)
              for k, v in node.kwargs.items()}
    if extra_kwargs:
        kwargs.update(extra_kwargs)
    out = fn(*args, **kwargs)
    if isinstance(out, (list, tuple)):
        return list(out)
    if hasattr(out, "list_outputs") and len(out.list_outputs()) > 1:
        return [out[i] for i in range(len(out.list_outputs()))]
    return [out]


class AloneRule(Rule):
    """Never batch: the node runs by itself, exactly as recorded."""

    batching = "alone"

    def signature(self, node):
        return None


ALONE = AloneRule()


def _trail(shape):
    return shape[1:]


def _in_shape(node, k):
    src, idx = node.inputs[k]
    return src.out_shapes[idx]


def _in_dtype(node, k):
    src, idx = node.inputs[k]
    return src.out_dtypes[idx]


def _shared_key(node, k):
    src, idx = node.inputs[k]
    return (SHARED, src.id, idx)


class RowRule(Rule):
    """Batch by concatenating inputs along axis 0.

    Parameters
    ----------
    roles : callable
        ``roles(node) -> tuple of ROW/BROW/SHARED`` per array input, or None
        when this particular call cannot be batched.
    """

    def __init__(self, roles):
        self._roles = roles

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


def transpose_roles(node):
    axes = node.kwargs.get("axes")
    if not axes or axes[0] != 0:
        return None
    return (ROW,)


def swapaxes_roles(node):
    d1, d2 = node.kwargs.get("dim1", 0), node.kwargs.get("dim2", 0)
    return None if 0 in (d1, d2) else (ROW,)


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
    from mxnet import autograd
    if autograd.is_training() and not node.kwargs.get("use_global_stats", False):
        return None   # training statistics mix the rows of a batch
    if _axis(node, "axis", 1) == 0:
        return None
    return first_row_roles(node)


def take_roles(node):
    if node.kwargs.get("axis", 0) != 0 or len(_in_shape(node, 1)) < 1:
        return None
    return (SHARED, ROW)


def dot_roles(node):
    if node.kwargs.get("transpose_a", False):
        return None
    return first_row_roles(node)


def dropout_roles(node):
    axes = node.kwargs.get("axes", ()) or ()
    return None if 0 in axes else (ROW,)


class ReshapeRule(Rule):
    """Any reshape of a sample's rows: batched as one reshape to ``(-1,) + tail``."""

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


class SegmentRule(Rule):
    """``sum``/``mean``/``max``/``min`` over axis 0 of each node's (ragged) rows."""

    batching = "segment"
    passes_single = True    # over one row per node, the result is that row

    @staticmethod
    def extra_count(op_name):
        """Index arrays a batch reads besides its rows (see ``arrays_for_counts``)."""
        return 2 if op_name == "mean" else 1

    def signature(self, node):
        axis = node.kwargs.get("axis")
        if isinstance(axis, (tuple, list)):
            axis = axis[0] if len(axis) == 1 else None
        if axis != 0 or node.kwargs.get("exclude", False) or len(node.inputs) != 1:
            return None
        if node.op.name in ("max", "min") \
                and np.dtype(_in_dtype(node, 0)) not in (np.float32, np.float64):
            return None         # padded with infinities
        shape = _in_shape(node, 0)
        return Signature((("segment", _trail(shape), _in_dtype(node, 0),
                           bool(node.kwargs.get("keepdims", False))),), self, (ROW,))

    @staticmethod
    def segment_arrays(nodes, dtype):
        """Extra inputs of a batch of ``nodes`` (see ``arrays_for_counts``)."""
        counts = [n.inputs[0][0].out_shapes[n.inputs[0][1]][0] for n in nodes]
        tail = len(nodes[0].inputs[0][0].out_shapes[nodes[0].inputs[0][1]]) - 1
        return nodes[0].rule.arrays_for_counts(counts, nodes[0].op.name, tail, dtype)

    @staticmethod
    def arrays_for_counts(counts, op_name, tail, dtype):
        """A padded index and, for ``mean``, the counts of ragged segments.

        The index is (segments, longest) into the segments' rows followed by
        one zero row, which the padding points at.  Padding by gathering
        zeros (rather than multiplying by a 0/1 matrix) keeps a NaN or inf of
        one sample out of the others (0 * nan is nan) and works for every
        dtype.
        """
        counts = np.asarray(counts, dtype=np.int64)
        total = int(counts.sum())
        starts = np.cumsum(counts) - counts
        cols = np.arange(max(int(counts.max()), 1))
        index = np.where(cols[None, :] < counts[:, None],
                         starts[:, None] + cols[None, :], total).astype(np.int32)
        out = [index]
        if op_name == "mean":
            out.append(counts.astype(dtype).reshape((len(counts),) + (1,) * tail))
        return out

    def batched_call(self, F, node, inputs):
        """``inputs`` = (rows of every node, padded index[, counts]).

        Floats are summed over the padded axis by a ``batch_dot`` with ones,
        7x faster than MXNet's ``sum`` over a middle axis on this machine
        (forward and backward); other dtypes (no ``batch_dot`` on CPU) by ``sum``.
        """
        data, index = inputs[0], inputs[1]
        pad = F.zeros_like(F.slice_axis(data, axis=0, begin=0, end=1))
        name = node.op.name
        if name in ("max", "min"):
            # Padding that never wins: -inf for max, +inf for min.
            pad = F.BlockGrad(F.log(pad))
            if name == "min":
                pad = F.negative(pad)
        rows = F.take(F.concat(data, pad, dim=0), index, axis=0)   # (nodes, longest, ...)
        if name in ("max", "min"):
            out = getattr(F, name)(rows, axis=1)
            return [F.reshape(out, shape=(-1,) + tuple(node.out_shapes[0][1:]))]
        mean = name == "mean"
        dtype = np.dtype(node.out_dtypes[0])
        if dtype in (np.float32, np.float64):
            ones = F.Cast(F.ones_like(F.expand_dims(index, axis=1)), dtype=dtype.name)
            out = F.batch_dot(ones, F.reshape(rows, shape=(0, 0, -1)))   # (nodes, 1, -1)
            if mean:
                out = F.broadcast_div(out, F.reshape(inputs[2], shape=(-1, 1, 1)))
        else:
            out = F.sum(rows, axis=1)
            if mean:
                out = F.broadcast_div(out, inputs[2])
        return [F.reshape(out, shape=(-1,) + tuple(node.out_shapes[0][1:]))]


class SegmentSoftmaxRule(SegmentRule):
    """``softmax``/``log_softmax`` over axis 0 of each node's (ragged) rows.

    Attention weights over a sentence's tokens or a node's children: the
    rows are padded to the longest with -inf (weight zero), normalised along
    the padded axis, and the padding dropped.
    """

    passes_single = False

    @staticmethod
    def extra_count(op_name):
        return 2

    def signature(self, node):
        if len(node.inputs) != 1 or set(node.kwargs) - {"axis"} or node.args[1:]:
            return None
        shape, dtype = _in_shape(node, 0), _in_dtype(node, 0)
        if not shape or _axis(node, "axis", -1) != 0 \
                or np.dtype(dtype) not in (np.float32, np.float64):
            return None
        return Signature((("segment-softmax", _trail(shape), dtype),), self, (ROW,))

    @staticmethod
    def arrays_for_counts(counts, op_name, tail, dtype):
        """The padded index of ``SegmentRule`` and, per row, its place among the padded rows."""
        counts = np.asarray(counts, dtype=np.int64)
        index = SegmentRule.arrays_for_counts(counts, "sum", tail, dtype)[0]
        within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        places = np.repeat(np.arange(len(counts)) * index.shape[1], counts) + within
        return [index, places.astype(np.int32)]

    def batched_call(self, F, node, inputs):
        data, index, places = inputs[:3]
        pad = F.BlockGrad(F.log(F.zeros_like(F.slice_axis(data, axis=0, begin=0, end=1))))
        rows = F.take(F.concat(data, pad, dim=0), index, axis=0)   # (nodes, longest, ...)
        out = getattr(F, node.op.name)(rows, axis=1)
        return [F.take(F.reshape(out, shape=(-3, -2)), places, axis=0)]


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
        return call_as_recorded(F, node, [plain] + list(inputs[1:]))


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


RULES = {}


def register_rule(op_names, rule):
    """Register ``rule`` for operators named ``op_names`` (a name or a list).

    Names are those of ``mx.nd`` (``"FullyConnected"``, ``"_internal._plus_scalar"``
    is registered as ``"_plus_scalar"``).
    """
    if isinstance(op_names, str):
        op_names = [op_names]
    for name in op_names:
        RULES[name] = rule


def rule_for(op_name):
    """The rule of an operator; ``ALONE`` when none is registered."""
    return RULES.get(op_name, ALONE)


_UNARY = """Activation relu sigmoid tanh softsign exp expm1 log log1p log2 log10 sqrt
rsqrt cbrt rcbrt square abs sign negative reciprocal floor ceil round rint trunc fix
sin cos tan arcsin arccos arctan sinh cosh arcsinh arccosh arctanh erf erfinv gamma
gammaln degrees radians clip Cast cast identity _copy zeros_like ones_like BlockGrad
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
add_n ElementWiseSum where""".split()

# Operators whose gradient is zero everywhere.  MXNet 1.9.1 crashes in backward
# when one is recorded over ``take(concat(...))``, the imperative executor's
# gather, so that executor runs them (and their gathers) unrecorded: their
# gradient is zero either way.
NO_GRADIENT = frozenset("""BlockGrad stop_gradient zeros_like ones_like floor ceil round
rint trunc fix sign argmax argmin argsort one_hot _equal_scalar _not_equal_scalar
_greater_scalar _greater_equal_scalar _lesser_scalar _lesser_equal_scalar
_logical_and_scalar _logical_or_scalar _logical_xor_scalar logical_not broadcast_equal
broadcast_not_equal broadcast_greater broadcast_greater_equal broadcast_lesser
broadcast_lesser_equal broadcast_logical_and broadcast_logical_or broadcast_logical_xor
_equal _not_equal _greater _greater_equal _lesser _lesser_equal""".split())

register_rule(_UNARY + _NARY, RowRule(elementwise_roles))
def lookup_roles(node):
    """Embedding and one_hot: one output row per index; a table is shared."""
    if len(_in_shape(node, 0)) < 1:
        return None
    return (ROW,) + (SHARED,) * (len(node.inputs) - 1)


register_rule(["FullyConnected", "Convolution", "Deconvolution", "Pooling",
               "L2Normalization"], RowRule(first_row_roles))
register_rule(["Embedding", "one_hot"], RowRule(lookup_roles))
register_rule("LayerNorm", RowRule(axis_roles("axis", -1, extra_shared=True)))
register_rule("BatchNorm", RowRule(batchnorm_roles))
register_rule("dot", RowRule(dot_roles))
register_rule("batch_dot", RowRule(all_row_roles))
# Gluon's losses (L2, L1, Huber, sigmoid cross-entropy) reshape the label like the prediction.
register_rule("reshape_like", RowRule(all_row_roles))
register_rule("broadcast_like", RowRule(broadcast_like_roles))
register_rule("take", RowRule(take_roles))
register_rule("Dropout", RowRule(dropout_roles))
register_rule(["softmax", "log_softmax"],
              RowFallback(SegmentSoftmaxRule(), SoftmaxRowRule(axis_roles("axis", -1))))
register_rule(["softmin", "topk", "sort", "argsort"], RowRule(axis_roles("axis", -1)))
register_rule(["prod", "nansum", "nanprod", "norm", "argmax", "argmin"],
              RowRule(axis_roles("axis", None)))
register_rule(["max", "min"], RowFallback(SegmentRule(), RowRule(axis_roles("axis", None))))
register_rule(["sum", "mean"], RowFallback(SegmentRule(), RowRule(axis_roles("axis", None))))
register_rule(["SliceChannel", "split"], RowRule(axis_roles("axis", 1)))
register_rule("pick", RowRule(axis_roles("axis", -1)))
register_rule(["flip", "reverse"], RowRule(axis_roles("axis", None)))
register_rule("repeat", RowFallback(ViewRule(_repeat_view), RowRule(axis_roles("axis", None))))
register_rule("tile", RowRule(tile_roles))
# Softmax over everything but the rows ("instance") or over axis 1 ("channel").
register_rule("SoftmaxActivation", RowRule(lambda n: (ROW,) if len(_in_shape(n, 0)) >= 2
                                           else None))
register_rule(["Concat", "concat"], RowFallback(ViewRule(_concat_view), RowRule(concat_roles)))
register_rule(["stack"], RowRule(lambda n: all_row_roles(n) if n.kwargs.get("axis", 0) != 0
                                 else None))
register_rule(["transpose"], RowRule(transpose_roles))
register_rule(["SwapAxis", "swapaxes"], RowRule(swapaxes_roles))
register_rule(["slice", "crop"], RowRule(slice_roles))
register_rule(["slice_axis"], RowFallback(ViewRule(_rows_view), RowRule(axis_roles("axis", 0))))
register_rule(["broadcast_to", "broadcast_axis"],
              RowFallback(ViewRule(_bcast_view), RowRule(
                  lambda n: (ROW,) if n.out_shapes[0][0] == _in_shape(n, 0)[0] else None)))
register_rule(["Reshape", "reshape", "Flatten", "flatten", "expand_dims", "squeeze"],
              ReshapeRule())
