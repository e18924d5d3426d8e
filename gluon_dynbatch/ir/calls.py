"""Calls: what a recorded operator call is, learned once per call shape.

A call shape is an operator, its constant arguments, and its inputs' shapes
and dtypes.  Its :class:`CallInfo` holds the output shapes and dtypes (from
``ops.INFER``), the batching rule that applies, the roles of the inputs and
the interned batching signature (``rules.py``).  Every later call of the
same shape reuses it: ``INFOS`` memoises them for the recorder.
"""
import threading
from math import prod

import mxnet as mx
import numpy as np
from mxnet.ndarray import NDArray

from ..errors import BatchingError, InvalidCallError, describe_call, refused_call
from .graph import OP, VIEW, Slot, slot, weight_node
from .known import values_known
from .ops import INFER, UnknownShape, first_line, hashable
from .rules import ALONE, intern, rule_for

# Operators whose batching rule depends on autograd's training mode.
MODAL = frozenset(["BatchNorm"])
# Operators that update state in training mode: kept in recording order.
STATEFUL = frozenset(["BatchNorm"])
def _global_stats(attrs):
    """Whether a call's ``attrs`` (``(args, sorted keyword items)``) ask BatchNorm
    for ``use_global_stats``: it reads its running statistics, never updates them."""
    for name, value in attrs[1] if attrs else ():
        if name == "use_global_stats":
            return value.strip().lower() in ("true", "1") if isinstance(value, str) \
                else bool(value)
    return False


STATEFUL_WARNING = (
    "%s in training mode runs one sample at a time (its statistics are per sample), so "
    "outputs and gradients are exact; but MXNet updates its running mean and variance "
    "during backward, in the order backward visits the calls, which batching can change: "
    "the running statistics differ from one-sample-at-a-time execution's (the moving "
    "average takes the samples in another order; not by rounding alone where samples' "
    "shapes differ). "
    "strategy='reference' keeps eager's order, unless samples wait (at a read, or at "
    "a change of autograd's modes such as train_mode() inside the call): samples that "
    "wait take turns, in another order than eager's.")
# Additions: chains of them become segment sums (``sums.py``).
ADDS = frozenset(["broadcast_add", "elemwise_add", "_plus", "_Plus", "broadcast_plus",
                  "_grad_add"])
NARY = frozenset(["add_n", "ElementWiseSum"])

INFOS = {}          # call shape -> CallInfo (of cacheable calls)
MAX_INFOS = 100000  # kept at most: ever new shapes start it over, not grow it without bound
_INFOS_LOCK = threading.Lock()


class CallInfo:
    """What the recorder learns once per call shape (see the module docstring).

    Attributes
    ----------
    out_shapes, out_dtypes : tuple
    attrs : hashable
        The constant arguments.
    rule : rules.Rule
    meta : tuple or None
        The role of each input (``ROW``, ``BROW``, ``SHARED``).
    kind : str
        ``"op"`` or ``"view"`` (rows of other values: no step of its own).
    sig : int or None
        The interned signature, without the ids of shared inputs (added per
        node from ``shared_pos``); None means the node runs alone.
    cacheable : bool
        False when the analysis changed something (a parameter's deferred
        shape) or depends on autograd's mode.
    stateful : bool
        The operator updates state in training mode.
    link : bool
        The call adds one-row values of its shape (``sums.is_link``).
    low : tuple of int
        Shared inputs of lower rank than the output of a broadcast (``(T, H) +
        (H,)``): where a call computed them per sample, programs gather them
        (and a node of one output row batches them by ``layer_rules.LowRankRule``).
    """

    __slots__ = ("out_shapes", "out_dtypes", "attrs", "rule", "meta", "kind", "sig",
                 "shared_pos", "cacheable", "stateful", "link", "low")

    def __init__(self, op, out_shapes, out_dtypes, attrs, signature, cacheable):
        self.stateful = op.name in STATEFUL and not _global_stats(attrs)
        self.link = False
        self.low = ()
        self.out_shapes, self.out_dtypes = out_shapes, out_dtypes
        self.attrs, self.cacheable = attrs, cacheable
        self.shared_pos = ()
        self.sig = None
        if signature is None:
            self.rule, self.meta, self.kind = ALONE, None, OP
            return
        key, self.rule, self.meta = signature
        self.kind = VIEW if self.rule.batching == "view" else OP
        if self.kind == VIEW:
            return
        self.shared_pos = tuple(k for k, part in enumerate(key)
                                if isinstance(part, tuple) and part and part[0] == "shared")
        key = tuple(("shared",) if k in self.shared_pos else part for k, part in enumerate(key))
        keyed = attrs if self.rule.keyed_attrs else None
        self.sig = intern((op.name, keyed, len(out_shapes), key))

    def with_attrs(self, attrs):
        """A copy of this analysis whose constant arguments are ``attrs``."""
        other = CallInfo.__new__(CallInfo)
        other.out_shapes, other.out_dtypes, other.attrs = self.out_shapes, self.out_dtypes, attrs
        other.rule, other.meta, other.kind, other.sig = self.rule, self.meta, self.kind, self.sig
        other.shared_pos, other.cacheable = self.shared_pos, self.cacheable
        other.stateful, other.link, other.low = self.stateful, self.link, self.low
        return other


_NOT_SYMBOLIC = "Not enough argument to call operator"
"""MXNet's error composing a symbol of an operator its symbols cannot build."""


def analyse(node, in_shapes, in_dtypes):
    """The :class:`CallInfo` of ``node``'s call (a node of the graph or a stand-in).

    Sets the node's output shapes, dtypes and constants; gives parameters
    whose shape was deferred the shape inference found.  Raises
    BatchingError naming the sample and the call when MXNet refuses it.
    """
    op = node.op
    attrs = (tuple((i, hashable(a)) for i, a in enumerate(node.args) if not isinstance(a, Slot)),
             tuple(sorted((k, hashable(v)) for k, v in node.kwargs.items()
                          if not isinstance(v, Slot))))
    where = describe_call(node.sample, node.path, op.name)
    if sparse_output(op.name, input_storage(node), attrs[1]):
        raise ShapeFromData("%s: an output of sparse storage" % where)
    try:
        out_shapes, out_dtypes, inferred = INFER.infer(op, node, in_shapes, in_dtypes, attrs)
    except UnknownShape:
        empty = any(0 in shape and getattr(src, "param", None) is None
                    for (src, _), shape in zip(node.inputs, in_shapes))
        raise ShapeFromData("%s: %s (input shapes %s)" % (
            where, "an input is empty" if empty else "the output shape depends on the data",
            list(in_shapes))) from None
    except RecursionError:
        raise
    except Exception as err:  # MXNetError, TypeError, ValueError from MXNet
        if _NOT_SYMBOLIC in str(err):
            # An operator MXNet's symbols cannot build (``fill_element_0index``):
            # it runs by itself, as eager runs it.
            raise ShapeFromData("%s: MXNet's symbols cannot build it" % where) from None
        raise refused_call(err, "%s: invalid call with input shapes %s: %s" % (
            where, list(in_shapes), _not_arrays(node) or first_line(err))) from None
    if op.name in ("reshape", "Reshape") and in_shapes \
            and prod(in_shapes[0]) != prod(out_shapes[0]):
        # MXNet's reshape takes a prefix, or reads past the end, of an array
        # whose size the target does not match: refused as numpy does.
        raise InvalidCallError("%s: reshape of %s to %s changes the number of elements" % (
            describe_call(node.sample, node.path, op.name), in_shapes[0], out_shapes[0]))
    _check_kernel_dtypes(node, in_dtypes, where)
    deferred = _finish_deferred(node.inputs, inferred)
    node.out_shapes, node.out_dtypes, node.attrs = out_shapes, out_dtypes, attrs
    signature = rule_for(op.name).signature(node)
    if signature is not None and _booleans(in_dtypes, out_dtypes) \
            and signature[1].batching != "view":
        signature = None    # runs alone: MXNet's gathers have no boolean kernels
    info = CallInfo(op, out_shapes, out_dtypes, attrs, signature,
                    cacheable=not deferred and op.name not in MODAL)
    info.link = info.kind == OP and is_link(op.name, node, in_shapes, in_dtypes,
                                            out_shapes, out_dtypes)
    if info.shared_pos and op.name.startswith("broadcast_") and len(out_shapes[0]) >= 2:
        info.low = tuple(k for k in info.shared_pos if len(in_shapes[k]) < len(out_shapes[0]))
    return info


def _booleans(in_dtypes, out_dtypes):
    """Whether a call reads or makes booleans.  MXNet 1.9.1 has no boolean
    kernel for what batching a call needs (``concat``, ``slice_axis``, ``split``,
    ``pad``: "Unknown type enum 7", raised when the engine runs it): such a call
    runs alone, as recorded, as eager runs it."""
    return any(np.dtype(dtype) == np.bool_ for dtype in in_dtypes) \
        or any(np.dtype(dtype) == np.bool_ for dtype in out_dtypes)


_NO_CPU_FLOAT16 = frozenset(("dot", "batch_dot", "FullyConnected", "Convolution",
                             "Deconvolution", "sort", "argsort", "khatri_rao",
                             "_pair_scores", "_pair_weighted", "_pair_weighted_t"))
"""Operators whose CPU kernels refuse float16 values (and ``linalg``'s): MXNet's
inference takes the call, its kernel raises when it runs.  (``_pair_*``: the
products of a sample's own matrices, ``rewrite.matrix_ops``, are ``dot``s.)"""


def _check_kernel_dtypes(node, in_dtypes, where):
    """Raise ``InvalidCallError`` for a call whose CPU kernel refuses its dtypes.

    Eager MXNet raises when such a value is read; batched, the kernel would
    fail inside a batched step, and its error would reach the values of
    every sample that step ran, named after no call.
    """
    op = node.op
    if op.name in _LENGTHS:
        _check_lengths(node, in_dtypes, where)
        return
    if op.name not in _NO_CPU_FLOAT16 and (op.path or ("",))[0] != "linalg":
        return
    if not any(np.dtype(dtype) == np.float16 for dtype in in_dtypes):
        return
    ctx = getattr(getattr(node, "graph", None), "ctx", None) or mx.current_context()
    if ctx.device_type == "cpu":
        raise InvalidCallError(
            "%s: MXNet's CPU kernel of %s takes float32 and float64 values, not float16 "
            "(eager MXNet raises when the value is read); cast the inputs with "
            ".astype('float32')" % (where, "dot" if op.name.startswith("_pair_") else op.name))


_LENGTHS = frozenset(("softmax", "log_softmax"))
"""Operators whose ``length`` input (``use_length=True``) their kernel takes
as integers only."""


def uses_length(node, flag="use_length"):
    """Whether call ``node`` reads its lengths input: ``flag`` true, given as a
    bool or as MXNet's string (``use_length`` of ``softmax``,
    ``use_sequence_length`` of the sequence operators)."""
    return str((node.kwargs or {}).get(flag, False)).lower() in ("true", "1")


def _check_lengths(node, in_dtypes, where):
    """Raise ``InvalidCallError`` for ``softmax(x, length, use_length=True)``
    of lengths that are not integers: MXNet's kernel refuses them when it runs."""
    if len(in_dtypes) < 2 or not uses_length(node):
        return
    dtype = np.dtype(in_dtypes[1])
    if dtype.kind not in "iu":
        raise InvalidCallError(
            "%s: the lengths of %s(..., use_length=True) are %s; MXNet's kernel takes "
            "integers (eager MXNet raises when the value is read): give them as "
            "nd.array(..., dtype='int32')" % (where, node.op.name, dtype.name))


def written_shapes(op, args, kwargs, sample=None, path=()):
    """The output shapes MXNet infers for ``op(*args, **kwargs)``, a call as
    written on arrays of known shapes (``INFER``, cached per call shape); None
    when they depend on the data.  Raises BatchingError, as ``analyse`` does,
    when MXNet refuses the call."""
    slots, shapes, dtypes = [], [], []

    def slotted(value):
        if isinstance(value, NDArray):
            slots.append(value)
            shapes.append(tuple(value.shape))
            dtypes.append(value.dtype)
            return slot(len(slots) - 1)
        return value

    stub = _Written(op, tuple(slotted(a) for a in args),
                    {k: slotted(v) for k, v in kwargs.items() if k != "name"})
    attrs = (tuple((i, hashable(a)) for i, a in enumerate(stub.args) if not isinstance(a, Slot)),
             tuple(sorted((k, hashable(v)) for k, v in stub.kwargs.items()
                          if not isinstance(v, Slot))))
    try:
        return INFER.infer(op, stub, tuple(shapes), tuple(dtypes), attrs)[0]
    except UnknownShape:
        return None
    except RecursionError:
        raise
    except Exception as err:  # MXNetError, TypeError, ValueError from MXNet
        raise refused_call(err, "%s: invalid call with input shapes %s: %s" % (
            describe_call(sample, path, op.name), shapes,
            _not_arrays(stub) or first_line(err))) from None


class _Written:
    """A call as written, for ``written_shapes``: what ``INFER`` reads of a node."""

    __slots__ = ("op", "args", "kwargs")

    def __init__(self, op, args, kwargs):
        self.op, self.args, self.kwargs = op, args, kwargs


SPARSE_OUTPUTS = {}
"""(operator, its inputs' storage types, attributes) -> whether an output is sparse,
as the call run by itself found it (``note_sparse_output``)."""


def input_storage(node):
    """The storage types of ``node``'s inputs: a leaf's array's own (CSR,
    row-sparse), "default" for every computed value."""
    return tuple(getattr(src.value, "stype", "default")
                 if getattr(src, "kind", None) == "leaf" and getattr(src, "value", None) is not None
                 else "default" for src, _ in node.inputs)


def sparse_output(name, storage, attributes):
    """Whether a call may give an output of sparse storage: a cast to it, or a
    call on a sparse input not yet known to give dense outputs.

    Such a call runs by itself (``ShapeFromData``): MXNet's kernels and
    CachedOp's backward do not take sparse step outputs gathered or
    concatenated (an empty CSR row crashes the process).
    """
    if name == "cast_storage":
        return dict(attributes).get("stype", "default") != "default"
    if all(stype == "default" for stype in storage):
        return False
    return SPARSE_OUTPUTS.get((name, storage, attributes), True)


def note_sparse_output(name, storage, attributes, outputs):
    """Keep whether the call ``sparse_output`` sent to run by itself gave a sparse
    output, so that later such calls are batched when it did not."""
    SPARSE_OUTPUTS[(name, storage, attributes)] = any(
        getattr(out, "stype", "default") != "default" for out in outputs)


class ShapeFromData(BatchingError):
    """A call whose output shapes MXNet cannot infer before it runs: they depend
    on its data (``F.contrib.boolean_mask``), or an input is empty.  Such a
    call runs by itself, on concrete values (``record.alone``)."""


def _not_arrays(node):
    """What MXNet says of a list or other non-array given where the operator
    takes an array (as eager MXNet says it), or None."""
    op = node.op
    if op.arrays is None:               # variadic: every positional argument
        wanted = [(None, a) for a in node.args]
    else:
        names = op.params[:op.arrays]
        wanted = list(zip(names, node.args[:op.arrays]))
        wanted += [(k, v) for k, v in node.kwargs.items() if k in names]
    for name, value in wanted:
        if isinstance(value, (list, tuple, np.ndarray)) \
                or value is not None and not isinstance(value, (Slot, int, float, str)):
            what = "Positional arguments" if name is None else "Argument %s" % name
            return "%s must have NDArray type, but got %r" % (what, value)
    return None


def is_link(op_name, node, in_shapes, in_dtypes, out_shapes, out_dtypes):
    """Whether a call adds values of its own one-row shape (a link of a chain).

    ``x + 0`` (the start of Python's ``sum``) is one; ``x + 1`` is not.
    """
    if op_name == "_plus_scalar":
        if scalar_argument(node) != 0:
            return False
    elif op_name not in ADDS and op_name not in NARY:
        return False
    if len(out_shapes) != 1:
        return False
    shape, dtype = out_shapes[0], out_dtypes[0]
    if not shape or shape[0] != 1:
        return False
    return all(s == shape for s in in_shapes) and all(d == dtype for d in in_dtypes)


def scalar_argument(call):
    """The number of a scalar operator's call (``x + 2``: 2.0), given by position or
    as ``scalar=``; None when it has none."""
    found = call.kwargs.get("scalar")
    if found is None:
        found = next((a for a in call.args[1:] if isinstance(a, (int, float, str))), None)
    try:
        return float(found)
    except (TypeError, ValueError):
        return None


def remember(key, info, facts=None):
    """Memoise ``info`` for call shape ``key`` (when cacheable).

    A rule that looks at where the inputs come from, not only at their
    shapes (``source_dependent``: ``dot``, per-sample or shared), decides
    by the ``facts`` of its sources (``source_facts``): its answer is kept
    for the call shape and those.
    """
    if key is None or not info.cacheable:
        return
    if source_dependent(key[0]):
        if facts is None:
            return
        key = (key, facts)
    with _INFOS_LOCK:
        if len(INFOS) >= MAX_INFOS:     # (cleared in place: the compiled core holds it)
            INFOS.clear()
        INFOS[key] = info


def source_dependent(op):
    """Whether the rule of ``op`` reads where its inputs come from (``remember``)."""
    return getattr(rule_for(op.name), "source_dependent", False)


def source_facts(inputs):
    """What a source-dependent rule reads of the sources of ``inputs`` ((node,
    index) pairs): each one's kind, whether it holds weights or a value
    computed from weights alone, whether its values are known."""
    facts = []
    for src, _ in inputs:
        kind = getattr(src, "kind", None)
        facts.append((kind, weight_node(src), values_known(src)) if kind is not None else None)
    return tuple(facts)


def _finish_deferred(inputs, inferred):
    """Give deferred-initialised parameters the shapes inference found.

    Returns True if any parameter was still waiting for its shape.
    """
    found = False
    for (src, _), shape in zip(inputs, inferred):
        if src.param is not None and 0 in src.out_shapes[0]:
            param = src.param
            param.shape = shape
            param._finish_deferred_init()  # pylint: disable=protected-access
            src.out_shapes = (tuple(shape),)
            found = True
    return found
