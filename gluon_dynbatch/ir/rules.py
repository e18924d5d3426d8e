"""The rule protocol: batching signatures, input roles and the registry of rules.

A rule looks at one recorded node and says whether, and with which other
nodes, it may run as one batched call.  ``signature(node)`` is a pure
function of the node (its operator, constants, input shapes and dtypes): a
:class:`Signature`, or None when the node must run alone.  Its ``key`` is
hashable: nodes with equal keys are interchangeable for batching; ``intern``
turns keys into small ints (as DyNet's ``SigMap`` does) so that planning
hashes ints.  Its ``rule`` is the rule that batches the node (a choice picks
one of two) and its ``roles`` the role of each input:

* ``ROW``: concatenated along axis 0; its rows match the output's;
* ``BROW``: concatenated; a one-row input is repeated to the node's output
  rows, as broadcasting would;
* ``SHARED``: the same value for every node of a batch, passed once;
* ``KNOWN``: read when the batch is planned (its values are known before
  the graph runs, ``known.py``), not passed;
* ``LOW``: a lower-rank value of each node's own, viewed as the node's row.

A rule's ``batching`` says how a step of its nodes runs (``rows``: the
operator on the inputs concatenated; ``segment``: with index arrays computed
when the batch is planned; ``calls``: a batched call of its own; ``view``:
no step; ``alone``: one node per step), and ``program_form`` how a program
(``templates.programs``) may hold its calls, if at all.  The rule families
live in ``gluon_dynbatch.rules`` and register themselves; ``register_rule``
adds rules for more operators.
"""
import threading
from collections import namedtuple

import numpy as np
from mxnet.symbol import Symbol

from .ops import by_name

ROW, BROW, SHARED, KNOWN = "row", "brow", "shared", "known"
LOW = "low"     # role: a lower-rank input computed per sample (``rules.broadcasts``)

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
    """Base class: ``signature(node)`` returns a :class:`Signature`, or None to run alone.

    Attributes
    ----------
    batching : str
        How a step of the rule's nodes runs: ``"rows"``, ``"segment"``,
        ``"calls"``, ``"view"``, ``"alone"`` (see the module docstring).
    keyed_attrs : bool
        Whether the call's constant arguments are part of its signature.
    program_form : str or None
        How a program holds the rule's calls: ``"rows"`` (the operator on the
        calls' rows), ``"segment"`` (a ragged reduction over axis 0),
        ``"reshape"``, ``"own"`` (the rule's batched call, as right for one
        call's rows as for many); None keeps its calls out of programs.
    broadcasts : bool
        Whether the batched call broadcasts a one-row ``BROW`` input over the
        rows of the others by itself (``broadcast_*`` operators), so that one
        row every node of a batch shares may be passed once instead of
        repeated to every node's rows.
    """

    batching = "rows"
    keyed_attrs = True
    program_form = None
    broadcasts = False

    def signature(self, node):
        raise NotImplementedError

    def step_key(self, node):
        """What a compiled step of ``node``'s batch depends on beyond its operator,
        constant arguments and the trailing shapes of its inputs and outputs."""
        return ()

    def refine(self, node, info):
        """Adjust ``node``'s rule, roles and signature where they depend on where
        its inputs come from (``info.low``: a lower-rank input); whether it did."""
        return False

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
    if node.op.name in SAME_SHAPE_ADDS:
        fn = F.broadcast_add            # see SAME_SHAPE_ADDS
    else:
        for part in node.op.path:
            fn = getattr(fn, part)
    blocked = NO_INPUT_GRADIENT.get(node.op.name)
    if blocked:
        inputs = _without_gradient(F, inputs, blocked)
    args = [inputs[a.k] if type(a).__name__ == "Slot" else a for a in node.args]
    kwargs = {k: (inputs[v.k] if type(v).__name__ == "Slot" else v)
              for k, v in node.kwargs.items()}
    if extra_kwargs:
        kwargs.update(extra_kwargs)
    args, kwargs = by_name(node.op, args, kwargs)
    if node.op.name == "slice_axis" and args and getattr(args[0], "dtype", None) == np.bool_ \
            and kwargs.get("axis") in (0, -len(args[0].shape)):
        # Rows of booleans (``flags[-1:]``): ``slice_axis`` has no boolean kernel.
        fn, kwargs = F.slice, {"begin": (kwargs["begin"],), "end": (kwargs["end"],)}
    out = fn(*args, **kwargs)
    if isinstance(out, (list, tuple)):
        return list(out)
    if hasattr(out, "list_outputs") and len(out.list_outputs()) > 1:
        return [out[i] for i in range(len(out.list_outputs()))]
    return [out]


# Additions of equal shapes, run as ``broadcast_add`` (the same values and
# gradients).  MXNet 1.9.1's backward, imperative or a CachedOp's, fails with
# "control dep not found in graph" on some batched graphs where ``elemwise_add``
# adds a value and a function of it (``log_softmax(v) + v`` beside other uses
# of ``v``); the same graph with ``broadcast_add`` runs.  Recorded shapes were
# checked by the operator as written, so broadcasting never applies.
SAME_SHAPE_ADDS = frozenset(["elemwise_add", "_plus", "_Plus", "_grad_add"])


# Index inputs, whose gradient is zero or refused: passed without autograd
# history.  Eager code often passes constants there; batched, they may carry
# history (gathered by an earlier flush, or by the step itself), and then
# ``Embedding``'s backward in a CachedOp asks for their gradient, which it
# refuses, and MXNet 1.9.1's imperative backward crashes (segfault) when the
# zero gradient of an index (``scatter_nd``'s, ``take``'s) is all that reaches
# a gather of it (see ``NO_GRADIENT``).
# ``boolean_mask``'s mask runs alone (``record.alone``): MXNet's backward never
# writes its gradient, whose memory eager code finds zero only by chance.
NO_INPUT_GRADIENT = {"Embedding": (0,), "take": (1,), "batch_take": (1,), "pick": (1,),
                     "gather_nd": (1,), "scatter_nd": (1,), "where": (0,),
                     # its label: MXNet refuses its gradient ("Cannot take gradient wrt
                     # label"), or aborts, where a computed label carries history
                     "softmax_cross_entropy": (1,),
                     "SequenceMask": (1,), "SequenceLast": (1,), "SequenceReverse": (1,),
                     "_contrib_boolean_mask": (1,), "boolean_mask": (1,),
                     # running mean and variance: states MXNet writes, never differentiated
                     "BatchNorm": (3, 4)}


def _without_gradient(F, inputs, slots):
    """``inputs`` with those at ``slots`` cut from autograd (``BlockGrad`` in a symbol)."""
    inputs = list(inputs)
    for k in slots:
        if k < len(inputs):
            x = inputs[k]
            inputs[k] = F.BlockGrad(x) if isinstance(x, Symbol) else x.detach()
    return inputs


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


RULES = {}


def register_rule(op_names, rule):
    """Register ``rule`` for operators named ``op_names`` (a name or a list).

    Names are the last part of the operator's ``mx.nd`` path
    (``"FullyConnected"``; ``"_internal._plus_scalar"`` is registered as
    ``"_plus_scalar"``, ``F.contrib.div_sqrt_dim`` as ``"div_sqrt_dim"``, not
    MXNet's ``"_contrib_div_sqrt_dim"``; ``F.image.crop`` as ``"image.crop"``).
    Register rules before a scope first records the operator: calls analysed
    and templates learned in this process keep the rule they were made with.

    Raises
    ------
    TypeError
        When ``rule`` is no :class:`Rule` (an instance of one, or an object
        with its ``signature`` and ``batched_call``) or a name is no string.
    """
    if isinstance(op_names, str):
        op_names = [op_names]
    if not all(callable(getattr(rule, name, None)) for name in ("signature", "batched_call")):
        raise TypeError("register_rule: %r is no batching rule (a Rule, such as "
                        "RowRule(roles), with signature() and batched_call())" % (rule,))
    for name in op_names:
        if not isinstance(name, str):
            raise TypeError("register_rule: operator names are strings, got %r" % (name,))
        RULES[name] = rule


def rule_for(op_name):
    """The rule of an operator; ``ALONE`` when none is registered."""
    return RULES.get(op_name, ALONE)


# Inputs whose gradient is zero: those of which an operator reads only the
# shape (``reshape_like(x, like)``) and indices (``take(table, idx)``).  Their
# gathers run unrecorded, as the operators of ``NO_GRADIENT`` below: MXNet
# 1.9.1's backward crashes where the only gradient reaching a gather of
# indices with history (a counter ``i = i + 1``) is the zero of such an input.
ZERO_GRADIENT_INPUTS = {"reshape_like": (1,), "broadcast_like": (1,), "slice_like": (1,),
                        "take": (1,), "pick": (1,), "gather_nd": (1,), "batch_take": (1,),
                        "Embedding": (0,), "one_hot": (0,), "SequenceMask": (1,),
                        "softmax_cross_entropy": (1,),
                        "SequenceLast": (1,), "SequenceReverse": (1,)}

# Operators MXNet registers no gradient for: eager code gives them inputs
# without history (``x.detach()``), which batched values recorded as
# ``BlockGrad`` are not; run unrecorded as ``NO_GRADIENT``'s are, their
# backward is never asked for (eager's raises where an input has history).
NON_DIFFERENTIABLE = frozenset(["_shuffle", "khatri_rao", "batch_take", "argmax_channel"])

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
_equal _not_equal _greater _greater_equal _lesser _lesser_equal ravel_multi_index
_ravel_multi_index unravel_index _unravel_index index_array _contrib_index_array
arange_like _contrib_arange_like shape_array size_array""".split()) | NON_DIFFERENTIABLE


def keeps_outputs(op_name, kwargs):
    """Whether a graph (a CachedOp) must hold every output of the call, used or
    not: MXNet 1.9.1 computes wrong values for the variance of ``moments`` when
    its mean is left out of the graph, and none at all (the memory as it was)
    for the mean and deviation of ``LayerNorm`` and ``GroupNorm``
    (``output_mean_var``) when their normalised output is."""
    return op_name == "moments" or op_name in ("LayerNorm", "GroupNorm") \
        and bool(kwargs.get("output_mean_var"))


def zero_gradient(op_name, args, kwargs):
    """Whether a call's outputs have zero gradient everywhere: an operator of
    ``NO_GRADIENT``, or ``topk`` returning indices or a mask (its default is
    indices; ``ret_typ`` may come fourth among the positional arguments)."""
    if op_name in NO_GRADIENT:
        return True
    if op_name != "topk":
        return False
    returns = kwargs.get("ret_typ", args[3] if len(args) > 3 else "indices")
    return returns in ("indices", "mask")
