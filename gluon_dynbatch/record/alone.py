"""Calls whose output shapes depend on their data: run by themselves, now.

A recorded call must know its output shapes before anything runs; MXNet's
inference gives them from the input shapes, except for operators whose
output depends on the values (``F.contrib.boolean_mask``) and for calls on
empty arrays (a sentence of no words).  Such a call (``calls.ShapeFromData``)
runs as eager MXNet runs it: the values it reads are computed first (what is
pending runs, as a read of a value does), the operator runs on them, and its
outputs enter the graph as inputs, with their autograd history.  Where eager
MXNet raises, the error names the sample and the call.

A user's ``mx.autograd.Function`` runs the same way: its ``forward`` is
Python that MXNet's autograd links to the Function's own ``backward``
through the arrays it is given and returns, which must be those of that
call alone; its outputs enter the graph as inputs, with that history.
"""
import mxnet as mx
from mxnet.ndarray import NDArray

from . import lazy as lazy_mod
from .lazy import LazyArray
from . import context
from ..errors import BatchingError, describe_call, refused_call
from ..ir.graph import LEAF
from ..ir.calls import note_sparse_output
from ..ir.ops import first_line, hashable
from ..ir.rules import NO_INPUT_GRADIENT


def run_alone(rec, op, args, kwargs):
    """``op(*args, **kwargs)`` run now on concrete values; its outputs as leaves."""
    args = _computed(args)
    kwargs = dict(zip(kwargs, _computed(kwargs.values())))
    for k in NO_INPUT_GRADIENT.get(op.name, ()):
        if k < len(args) and isinstance(args[k], NDArray):
            args[k] = args[k].detach()
    arrays = [a for a in args + list(kwargs.values()) if isinstance(a, NDArray)]
    try:
        out = op.nd_fn(*args, **kwargs)
    except Exception as err:  # MXNetError, and MXNet's own argument checks
        raise refused_call(err, "%s: invalid call with input shapes %s: %s" % (
            describe_call(rec.sample, rec.path, op.name), [a.shape for a in arrays],
            first_line(err))) from None
    storage = tuple(a.stype for a in arrays)
    if any(stype != "default" for stype in storage):
        # (``calls.sparse_output`` sent it here to find out its outputs' storage)
        note_sparse_output(op.name, storage, tuple(sorted(
            (k, hashable(v)) for k, v in kwargs.items() if not isinstance(v, NDArray))),
            out if isinstance(out, (list, tuple)) else [out])
    return rec.wrap_inputs(out)


def _computed(values):
    """The arrays ``values`` stand for (``_concrete``), each computed first:
    what is pending runs, as a read of a value does."""
    values = [_concrete(v) for v in values]
    for value in values:
        if isinstance(value, NDArray):
            value.wait_to_read()
    return values


def _concrete(value):
    """The array an input of the graph stands for (an array given to the model, a
    parameter's data), else ``value`` itself."""
    if type(value) is LazyArray and value._h is None:
        node = value._node
        if node is not None and node.kind == LEAF:
            return node.value if node.value is not None else node.param.data(node.graph.ctx)
    return value


_FUNCTION_CALL = mx.autograd.Function.__call__


def _function_call(self, *inputs):
    """``mx.autograd.Function.__call__``: inside a scope, on concrete values.

    What the sample recorded runs first (a read): the Function's code may hold
    any of its values, anywhere (its attributes, other objects, closures).
    Its ``forward``, and its ``backward`` when a pass runs it, then run with
    the recorder set aside, as eager MXNet runs them, on computed values.
    """
    rec = context.TLS.recorder
    if rec is None or rec.eager:
        return _FUNCTION_CALL(self, *inputs)
    frame = rec.frame
    if frame is not None:
        # No template may replay this call's block without running the Function.
        frame.cut("an autograd.Function")
    if rec.graph.nodes:
        rec.read()
    # Plain arrays, with the values' autograd history.
    inputs = [_plain(a) for a in inputs]
    self.backward = _set_aside(self.backward)
    return rec.wrap_inputs(_set_aside(_FUNCTION_CALL)(self, *inputs))


def _set_aside(fn):
    """``fn`` run with no recorder (a value still pending that it reads raises
    a ``BatchingError``: ``lazy.set_aside``)."""
    def run(*args):
        recorder, context.TLS.recorder = context.TLS.recorder, None
        try:
            with lazy_mod.set_aside():
                return fn(*args)
        finally:
            context.TLS.recorder = recorder
    run.__wrapped__ = fn
    return run


def _plain(value):
    """A plain array of ``value``'s data and history, ``value`` computed first."""
    value, = _computed([value])
    return mx.nd.identity(value) if type(value) is LazyArray else value


def install():
    """Run ``mx.autograd.Function`` calls inside scopes on concrete values."""
    mx.autograd.Function.__call__ = _function_call
