"""What recording changes in Gluon and MXNet, installed when the first scope opens.

Importing gluon_dynbatch changes nothing outside its own classes.  The first
batching scope of the process installs, once:

* ``Block.__setattr__``: attributes a block's templates depend on are
  watched (``dispatch``); ``Block.__call__`` is replaced while any scope is
  open (``dispatch.attach_call``, counted by the scope);
* Gluon's recurrent cells' and fused RNN layers' ``begin_state`` and the
  layers' ``hybrid_forward`` (``dispatch``);
* MXNet's ``_imperative_invoke``: ``mx.nd`` operators called on pending
  values are recorded (``namespace``);
* ``NDArray._prepare_value_nd``: a LazyArray assigned to an array's items
  (``buf[i] = out``) is an array (``namespace``);
* ``NDArray.__getitem__`` and ``__setitem__``: a plain array indexed by a
  recorded value (``table[F.array([i])]``) is recorded as ``gather_nd``, or
  written with the index computed (``arithmetic``);
* ``NDArray._at``, ``_slice`` and ``reshape``: NDArray's views of rows of a
  plain array (``self.table[word]``) are noted, and read in the graph as those
  rows of the array (``aliases``);
* ``nn.HybridLambda.hybrid_forward``: an operator given by name
  (``HybridLambda("tanh")``) is looked up in the recording ``F`` (``namespace``);
* ``autograd.set_recording``/``set_training`` and the backward functions
  (``autograd.grad`` too), counted; inside a sample they keep the batched
  graph (``context``);
* ``autograd.Function.__call__``: a user's Function runs on concrete values
  (``alone``);
* ``Parameter._init_impl`` and ``Parameter.cast``: a parameter given new
  arrays (``initialize(force_reinit=True)``, ``cast``, ``reset_ctx``) runs the
  pending calls that read its old ones first (``weights``);
* the number and integer types ``NDArray`` checks its operands and indices
  against: a waiting sample's number (``PendingValue``) is taken as its value
  (``tasks``).

Outside scopes each replacement does what the original does.
"""
import threading

from . import alone, context, dispatch, namespace, tasks, weights

_LOCK = threading.Lock()
_INSTALLED = []


def install():
    """Install the replacements (once per process; safe from any thread)."""
    if _INSTALLED:
        return
    with _LOCK:
        if not _INSTALLED:
            dispatch.install()
            namespace.install()
            context.install()
            alone.install()
            tasks.install()
            weights.install()
            _INSTALLED.append(True)
