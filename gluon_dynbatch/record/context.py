"""The thread's recording state, and autograd's modes as recording reads them.

Every stage reaches the recorder of the active scope (one per thread)
through :func:`current`.  A batch runs later than it is recorded, so it must
run under the autograd modes (recording, training) its calls were recorded
under: reading them costs a ctypes call each, so every change through
``mxnet.autograd`` bumps ``MODE_CHANGES`` and a recorder re-reads the modes
only when it moved.  Backward passes that free their graph are counted too
(``lazy.backward_ran``, per thread): a value computed before one is a constant after it.
"""
import contextlib
import threading
import types

from mxnet import autograd, gluon, nd
from mxnet.base import MXNetError
from mxnet.ndarray import NDArray

from ..errors import BatchingError, describe_call
from ..logs import warn_once
from . import _core
from . import lazy as lazy_mod


class _Local(threading.local):
    recorder = None     # the recorder of this thread's active scope
    second_order = False    # a gradient with create_graph=True of a scope's values taken
    # A flush ran under autograd since the last pass that freed a graph: a
    # loss computed from its values holds batched steps, lazy or not.
    batched_history = False
    retained = False    # and a pass since kept the graph
    initialising = False    # Gluon gives a parameter its gradient arrays (``_init_grad``)

    def __init__(self):
        super().__init__()
        self.batched_params = {}    # id -> Parameter fed to such flushes
        self.batched_variables = {}     # id -> array with a gradient fed to them
        # Ids of the data arrays of ``batched_params`` while a pass kept the
        # graph (``note_written``), made when first asked.
        self.param_data = None


TLS = _Local()


def current():
    """The recorder of this thread's active batching scope, or None."""
    return TLS.recorder


def set_current(recorder):
    """Make ``recorder`` (or None) this thread's active recorder."""
    TLS.recorder = recorder


MODE_CHANGES = [0]          # changes of autograd's modes through mxnet.autograd


def _copy_function(fn):
    """A new function object running ``fn``'s code (``fn`` itself is redirected)."""
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__,
                              fn.__closure__)
    copy.__kwdefaults__, copy.__doc__ = fn.__kwdefaults__, fn.__doc__
    return copy


# MXNet's own functions, as they were: install() redirects the originals.
_SET_RECORDING = _copy_function(autograd.set_recording)
_SET_TRAINING = _copy_function(autograd.set_training)
_BACKWARD = _copy_function(autograd.backward)
_GRAD = _copy_function(autograd.grad)
_MARK_VARIABLES = _copy_function(autograd.mark_variables)


def _counting_set_recording(is_recording):
    MODE_CHANGES[0] += 1
    return _SET_RECORDING(is_recording)


def _counting_set_training(train_mode):
    MODE_CHANGES[0] += 1
    return _SET_TRAINING(train_mode)


@contextlib.contextmanager
def modes_within(mode):
    """Run under autograd's (recording, training) ``mode`` (None: as they are), then
    back as before, without counting a change (``MODE_CHANGES``): what recording
    knows of the modes is as true after the block as before it.  For a flush,
    which runs what is pending under its calls' modes and records nothing."""
    if mode is None:
        yield
        return
    was_recording = _SET_RECORDING(mode[0])
    was_training = _SET_TRAINING(mode[1])
    try:
        yield
    finally:
        _SET_RECORDING(was_recording)
        _SET_TRAINING(was_training)


# MXNet's errors of a backward pass through a graph an earlier pass freed.
_FREED = ("Cannot differentiate node because it is not in a computational graph",
          "There are no inputs in computation graph that require gradients",
          # (a node's record cleared: weights recorded once and shared by the samples)
          "The any container is empty requested=N5mxnet10Imperative6AGInfoE")
_SHARED_GRAPH = (
    "gluon_dynbatch: if these values were computed in a batching scope, they share its "
    "batched graph, which a backward pass through some of them frees for all: "
    "differentiate them in one pass (the sum of their losses, or "
    "autograd.backward(losses)), or pass retain_graph=True to every backward pass but "
    "the last (each pass then also writes zeros into the gradients of the other "
    "samples' inputs it reaches through the shared steps, unless their grad_req is 'add')")


# MXNet's errors of a gradient of a gradient through operators it cannot differentiate twice.
_SECOND_ORDER = ("is non-differentiable", "does not support higher order gradients")


def _second_order_message(in_a_sample):
    """What a gradient of a gradient of values a scope computed tells the user."""
    rec = TLS.recorder
    where = "inside a sample" if in_a_sample else "of values a batching scope computed"
    text = ("a gradient with create_graph=True %s (autograd.grad(..., "
            "create_graph=True), for a gradient of a gradient): the values were computed "
            "in batched steps that gather them from the samples' arrays (and in "
            "CachedOps), whose backward MXNet cannot record; where the gradient is used "
            "as a value only, pass create_graph=False; else run such a model with "
            "gluon_dynbatch.batching(strategy='reference'), which runs each call on its "
            "own" % where)
    if in_a_sample and rec is not None and rec.sample is not None:
        text = "%s: %s" % (describe_call(rec.sample, rec.path), text)
    return text


class _MaybeBatchedSecondOrder(BatchingError, MXNetError):
    """MXNet's error of a gradient of a gradient that may or may not reach values
    a batching scope computed (while autograd recorded, their graph not yet
    freed): either kind of handler catches it."""


def _first_line(text):
    """The line of MXNet error ``text`` that says what went wrong (not its
    traceback's header and frames)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    said = [line for line in lines if line.startswith("MXNetError")] or \
        [line for line in lines if not line.startswith(("Traceback", "File ", "[bt]"))]
    return said[0] if said else text.strip()


def _any_lazy(heads):
    """Whether ``heads`` (an array or a list) holds values a scope computed."""
    return any(isinstance(head, lazy_mod.LazyArray)
               for head in (heads if isinstance(heads, (list, tuple)) else [heads]))


def _in_a_sample():
    """Whether a sample's code runs now (a task of a scope's recorder)."""
    rec = TLS.recorder
    return rec is not None and rec.tasks is not None and rec.tasks.current is not None


def _retaining(args, kwargs, position):
    """``args, kwargs`` of a backward function with ``retain_graph=True``
    (``position``: its place among the positional arguments)."""
    if len(args) > position:
        args = args[:position] + (True,) + args[position + 1:]
    else:
        kwargs = dict(kwargs, retain_graph=True)
    return args, kwargs


MAX_VARIABLES = 4096
"""Parameters and arrays with gradients noted (``note_batched``) until a pass frees
the graph: a loop recording under autograd that never runs a pass keeps the
newest only (of each)."""


_HANDED = {}        # thread id -> notes of flushes other threads ran for its scopes
_HANDED_LOCK = threading.Lock()


def note_batched(graph, thread=None):
    """Note that ``graph`` ran under autograd: its parameters and arrays with
    gradients are reached by batched steps a later pass runs through.  A
    flush run by another thread than the scope's (``thread``: a read in a
    pool) hands the note to the scope's thread, whose passes ask."""
    if thread is not None and thread != threading.get_ident():
        with _HANDED_LOCK:
            _HANDED.setdefault(thread, []).append((dict(graph.parameters),
                                                   dict(graph.variables)))
        return
    _note(graph.parameters, graph.variables)


def _take_handed():
    """Note what flushes run by other threads for this thread's scopes noted."""
    if _HANDED:
        with _HANDED_LOCK:
            handed = _HANDED.pop(threading.get_ident(), ())
        for parameters, variables in handed:
            _note(parameters, variables)


def _note(parameters, variables):
    TLS.batched_history = True
    TLS.param_data = None
    for noted, new in ((TLS.batched_params, parameters),
                       (TLS.batched_variables, variables)):
        noted.update(new)
        excess = len(noted) - MAX_VARIABLES
        if excess > 0:                  # the oldest first (insertion order)
            for key in list(noted)[:excess]:
                del noted[key]


def _arrays_in(values):
    """The arrays among ``values``, each an array, a list of arrays, or None."""
    for value in values:
        yield from value if isinstance(value, (list, tuple)) else [value]


def _compute(arrays):
    """Compute the pending arrays among ``arrays`` (``_arrays_in``'s values)."""
    for array in _arrays_in(arrays):
        if isinstance(array, lazy_mod.LazyArray):
            array.wait_to_read()


def _others_gradients(arrays):
    """The gradients of arrays other samples attached gradients to, with copies of
    their values once ``arrays`` (the pass's heads, head gradients and
    variables) are computed (the sample may wait for them: not during the pass): a
    sample's backward pass runs through batched steps that reach them too
    (their arrays alive or not), and writes zeros into them, where eager
    leaves them.  Then those of arrays given gradients before the scope, fed to
    batched steps (``_saved``: kept where the pass leaves them all zeros, as
    no sample is known as theirs)."""
    _compute(arrays)
    tasks = TLS.recorder.tasks
    # (Arrays samples gave gradients themselves are kept as the first list.)
    return ([(grad, grad.copy()) for task, grad in tasks.variables if task is not tasks.current],
            _unrecorded(lambda: _saved(_variables(tasks.variable_ids))))


def _counting_backward(backward, position=2, to_variables=False):
    """Wrap one of MXNet's backward functions to count graph-freeing passes.

    Inside a sample (a gradient of its own, such as marginals as the gradient
    of a log-partition), the pass keeps the graph it runs through, whose
    values were computed in batched steps that other samples' values share,
    and, a pass into every array it reaches (not ``to_variables``, which
    ``autograd.grad`` is: gradients of the variables it names only), leaves
    other samples' arrays' gradients as they were.
    """
    def wrapper(*args, **kwargs):
        _take_handed()
        heads = args[0] if args else kwargs.get("heads")
        create = to_variables and bool(kwargs.get("create_graph",
                                                  args[4] if len(args) > 4 else False))
        if create and _any_lazy(heads):
            TLS.second_order = True
        elif create and TLS.batched_history and not TLS.second_order:
            # Values of a scope may or may not be in the heads' history.
            TLS.second_order = "maybe"
        kept = again = None
        if to_variables:
            args, kwargs = _given_variables(args, kwargs)
        if _in_a_sample():
            args, kwargs = _retaining(args, kwargs, position)
            if not to_variables:
                TLS.recorder.before_own_pass()
                kept, again = _others_gradients(list(args) + list(kwargs.values()))
        elif TLS.retained and not to_variables:
            again = _unrecorded(_written_gradients)
        try:
            result = backward(*args, **kwargs)
        except MXNetError as err:
            reworded = _reworded(err, kept is not None, heads)
            if reworded is err:
                raise
            raise reworded from err
        if again:
            _unrecorded(_keep_unreached, again)
        if kept:
            # The gradients as they were: no write of the user's (the recorder
            # would run pending calls reading them before they are restored).
            _unrecorded(_copy_back, kept)
        retain = kwargs.get("retain_graph", args[position] if len(args) > position else None)
        if not (create if retain is None else retain):
            lazy_mod.backward_ran()
            # The graph is freed: a later error is not about its batched steps.
            TLS.second_order = TLS.batched_history = TLS.retained = False
            TLS.batched_params, TLS.batched_variables = {}, {}
        elif kept is None and TLS.batched_history and not to_variables:
            TLS.retained = True
        TLS.param_data = None
        return result
    wrapper.__doc__ = backward.__doc__
    wrapper.__name__ = backward.__name__
    return wrapper


def _given_variables(args, kwargs):
    """``args, kwargs`` of ``autograd.grad`` with each sample's input that stands
    for an array the user attached a gradient to replaced by that array."""
    if len(args) > 1:
        return args[:1] + (_as_variables(args[1]),) + args[2:], kwargs
    if "variables" in kwargs:
        kwargs = dict(kwargs, variables=_as_variables(kwargs["variables"]))
    return args, kwargs


def _as_variables(variables):
    if isinstance(variables, (list, tuple)):
        return [lazy_mod.given_array(v) for v in variables]
    return lazy_mod.given_array(variables)


def _unrecorded(fn, *args):
    """``fn(*args)`` on gradients, its MXNet calls run as they are, not recorded
    by a scope the pass runs in."""
    recorder, TLS.recorder = TLS.recorder, None
    try:
        return fn(*args)
    finally:
        TLS.recorder = recorder


def _copy_back(kept):
    for grad, value in kept:
        # Through a handle of the same memory with no autograd entry: a
        # gradient array a batched step read (``mark_variables``' buffers
        # are arrays of the user's) is an input in autograd's graph.
        value.copyto(grad.detach())


def _written_gradients():
    """Copies of the gradients a pass may overwrite with zeros: of parameters
    (``grad_req="write"``) and arrays with gradients fed to batched steps,
    written by an earlier pass that kept the graph
    (``l1.backward(retain_graph=True); l2.backward()``, or one pass per
    sample's loss).

    A batched step computes several samples' calls, or a call's several
    outputs, in one operator; a pass from a loss reaching only some of its
    outputs writes zeros into the gradients of what only the others read,
    where eager's pass leaves them as the earlier pass wrote them.
    """
    params = [(param.name, param.list_grad()) for param in TLS.batched_params.values()
              if param.grad_req == "write" and getattr(param, "_grad", None)]
    return _saved(params + _variables())


def _variables(skipped=()):
    """``(name, [gradient])`` of the arrays with gradients (``x.attach_grad()``)
    fed to batched steps since the last pass that freed the graph, but for the
    ids ``skipped``."""
    found = [(array, array.grad) for key, array in TLS.batched_variables.items()
             if key not in skipped]
    return [("an array of shape %s" % (array.shape,), [grad])
            for array, grad in found if grad is not None]


def _saved(gradients):
    """``gradients`` (``(name, [gradient arrays])``) with copies of their values."""
    return [(name, grads, [g.copy() for g in grads]) for name, grads in gradients]


def _keep_unreached(saved):
    """Give back their earlier values to the gradients ``saved`` (``_saved``) that
    the pass left all zeros (it did not reach their arrays, as far as can be
    told), and say so once."""
    if not saved:
        return
    # Every gradient's norm, before and after, read in one copy from MXNet.
    norms = nd.concat(*[g.norm().reshape((1,)) for _, grads, before in saved
                        for g in grads + before], dim=0).asnumpy()
    restored, at = [], 0
    for name, grads, before in saved:
        now, then = norms[at:at + len(grads)], norms[at + len(grads):at + 2 * len(grads)]
        at += 2 * len(grads)
        if now.any() or not then.any():
            continue
        for grad, value in zip(grads, before):
            value.copyto(grad)
        restored.append(name)
    if restored:
        warn_once("unreached gradients", "a backward pass through batched steps that an "
                  "earlier pass kept (retain_graph=True) left the gradients of %s all "
                  "zeros; batched steps reach arrays a loss does not, so they are kept as "
                  "the earlier pass "
                  "wrote them, as eager MXNet keeps what a pass does not reach. One pass "
                  "over all losses (autograd.backward([l1, l2])) or grad_req='add' says "
                  "it without guessing" % ", ".join(restored[:5]) + (
                      " (and %d more)" % (len(restored) - 5) if len(restored) > 5 else ""))


def _reworded(err, in_a_sample, heads):
    """The error to raise for MXNet's ``err`` of a backward pass: one saying what
    to do where it comes from batching, else ``err`` itself."""
    text = str(err)
    if any(part in text for part in _SECOND_ORDER) and (
            in_a_sample or TLS.second_order or _any_lazy(heads)):
        maybe = TLS.second_order == "maybe" and not (in_a_sample or _any_lazy(heads))
        TLS.second_order = False
        if maybe:
            return _MaybeBatchedSecondOrder(
                "%s\nIf the gradient reaches no value a batching scope computed, the error "
                "is MXNet's own: %s" % (_second_order_message(False), _first_line(text)))
        return BatchingError(_second_order_message(in_a_sample))
    if any(part in text for part in _FREED):
        return MXNetError("%s\n%s" % (err, _SHARED_GRAPH))
    return err


_ATTACH_GRAD = NDArray.attach_grad


def _attach_grad(self, grad_req="write", stype=None):
    """``NDArray.attach_grad``: inside a scope the array is a leaf of its own from
    now on (not one found before), pending calls reading it running first;
    inside a sample, its gradient array is kept so that other samples'
    backward passes leave it as they found it."""
    _attach(self, grad_req, stype, warn=True)


def _attach(array, grad_req, stype, warn):
    """``_attach_grad``, saying that pending calls run first only if ``warn``."""
    rec = TLS.recorder
    if rec is not None and not rec.flushing and type(array) is NDArray:
        rec.before_new_gradient(array, warn)
    _ATTACH_GRAD(array, grad_req, stype)
    if rec is not None:
        rec.graph.leaf_by_id.pop(id(array), None)
        if rec.tasks is not None and rec.tasks.current is not None:
            rec.tasks.variables.append((rec.tasks.current, array.grad))
            rec.tasks.variable_ids.add(id(array))


def attach_to_given(lazy, grad_req, stype):
    """``lazy.attach_grad()`` where ``lazy`` is a sample's input standing for an
    array the caller gave (a leaf of the graph): eager's call made the caller's
    array a variable of autograd, whose gradient the caller reads after its
    pass; so here the caller's array gets the gradient, and ``lazy`` stands for
    it as a new leaf (calls recorded before run first, without it, as eager's
    did).  False for any other value (it becomes an array of its own)."""
    rec = TLS.recorder
    node = lazy._node
    given = getattr(lazy, "_given", None)
    if rec is None or rec.closed or node is None or node.kind != "leaf" \
            or type(given) is not NDArray \
            or node.value is not given \
            and rec.snapshots.get(id(node.value), (None, None))[1] is not given:
        return False
    _attach(given, grad_req, stype, warn=False)     # (calls reading it run first)
    fresh = rec.leaf(given)                 # its leaf found before is forgotten
    # The sample's calls read the variable as it is now: a handle of its own
    # (``lazy.shallow_copy``: the same memory and autograd entry).  Another
    # sample given the same array that attaches a gradient again makes it a new
    # variable, as eagerly, and the earlier calls keep theirs.
    fresh._node.value = snapshot = lazy_mod.shallow_copy(given)
    rec.snapshots[id(snapshot)] = (snapshot, given)     # (for the scope's life)
    copy = getattr(lazy, "_h", None)
    lazy._h, lazy._rows = None, None        # the leaf's pending value, not a copy held
    if copy is not None:
        NDArray(copy)                       # (freed with this wrapper)
    lazy._node, lazy._idx = fresh._node, fresh._idx
    fresh._node = None
    # (Not found by the array: another sample given it reads its own leaf.)
    rec.graph.leaf_by_id.pop(id(given), None)
    return True


def _mark_variables(variables, gradients, grad_reqs="write"):
    """``autograd.mark_variables``: as ``attach_grad``, each value a scope computed
    is an array of its own from then on, and inside a sample the gradient
    arrays are kept from other samples' passes."""
    listed = isinstance(variables, (list, tuple))
    arrays, grads = (variables, gradients) if listed else ([variables], [gradients])
    for array in arrays:
        if isinstance(array, lazy_mod.LazyArray):
            array.own_array()
    _MARK_VARIABLES(variables, gradients, grad_reqs)
    rec = TLS.recorder
    if rec is None:
        return
    for array in arrays:
        rec.graph.leaf_by_id.pop(id(array), None)
    if rec.tasks is not None and rec.tasks.current is not None and not TLS.initialising:
        rec.tasks.variables.extend((rec.tasks.current, grad) for grad in grads)
        rec.tasks.variable_ids.update(id(array) for array in arrays)


_INIT_GRAD = gluon.Parameter._init_grad     # pylint: disable=protected-access


def _init_grad(self):
    """``Parameter._init_grad``: the gradient arrays Gluon marks for a parameter
    (its deferred initialisation finishing inside a sample) are the
    parameter's, not arrays the sample made variables of its own, whose
    gradients other samples' passes leave as they found them (``_mark_variables``)."""
    before, TLS.initialising = TLS.initialising, True
    try:
        return _INIT_GRAD(self)
    finally:
        TLS.initialising = before


GRAD_OF = NDArray.grad.fget
"""``NDArray.grad`` as MXNet reads it (``install`` notes what samples read)."""


def _noted(grad):
    """``grad``, noted as a gradient array when a sample's code reads it
    (``Tasks.gradients_read``)."""
    rec = TLS.recorder
    if grad is not None and rec is not None and rec.tasks is not None \
            and rec.tasks.current is not None:
        rec.tasks.gradients_read.append(grad)
    return grad


def _noted_grad(self):
    """``NDArray.grad``, noted (``_noted``)."""
    return _noted(GRAD_OF(self))


_PARAMETER_GRAD = gluon.Parameter.grad


def _noted_parameter_grad(self, ctx=None):
    """``Parameter.grad``, noted (``_noted``)."""
    return _noted(_PARAMETER_GRAD(self, ctx))


# Bodies that MXNet's functions run once redirected (``_redirect``): each calls
# what ``install`` put in ``mxnet.autograd``'s namespace under its name.
# pylint: disable=undefined-variable
def _to_set_recording(is_recording):
    return _gluon_dynbatch_set_recording(is_recording)


def _to_set_training(train_mode):
    return _gluon_dynbatch_set_training(train_mode)


def _to_backward(heads, head_grads=None, retain_graph=False, train_mode=True):
    return _gluon_dynbatch_backward(heads, head_grads, retain_graph, train_mode)


def _to_grad(heads, variables, head_grads=None, retain_graph=None, create_graph=False,
             train_mode=True):
    return _gluon_dynbatch_grad(heads, variables, head_grads, retain_graph, create_graph,
                                train_mode)


def _to_mark_variables(variables, gradients, grad_reqs="write"):
    return _gluon_dynbatch_mark_variables(variables, gradients, grad_reqs)
# pylint: enable=undefined-variable


def _redirect(fn, body, target):
    """Make MXNet's function ``fn`` call ``target``, wherever it is referenced.

    User code may hold ``fn`` itself (``from mxnet.autograd import
    set_recording`` before the first scope): replacing the module's attribute
    would miss such calls, so ``fn`` runs ``body``'s code, which calls
    ``target`` through ``fn``'s module namespace.
    """
    fn.__globals__["_gluon_dynbatch_" + fn.__name__] = target
    fn.__code__ = body.__code__


def install():
    """Count changes of autograd's modes and graph-freeing backward passes
    (``autograd.grad`` too); keep the gradients of arrays samples attach them to
    (``attach_grad``, ``autograd.mark_variables``)."""
    lazy_mod.ATTACH_TO_GIVEN = attach_to_given
    NDArray.attach_grad = _attach_grad
    NDArray.grad = property(_noted_grad, doc=NDArray.grad.__doc__)
    gluon.Parameter.grad = _noted_parameter_grad
    NDArray.backward = _counting_backward(NDArray.backward)
    _redirect(autograd.backward, _to_backward, _counting_backward(_BACKWARD))
    _redirect(autograd.grad, _to_grad,
              _counting_backward(_GRAD, position=3, to_variables=True))
    _redirect(autograd.mark_variables, _to_mark_variables, _mark_variables)
    gluon.Parameter._init_grad = _init_grad     # pylint: disable=protected-access
    gluon.Trainer._update = _updating          # pylint: disable=protected-access
    _redirect(autograd.set_recording, _to_set_recording, _counting_set_recording)
    _redirect(autograd.set_training, _to_set_training, _counting_set_training)


_TRAINER_UPDATE = gluon.Trainer._update   # pylint: disable=protected-access


def _updating(self, *args, **kwargs):
    """``Trainer._update`` (``step``, ``update``): the gradients earlier passes
    wrote are used, so a later pass keeps none of them where it leaves zeros
    (``_written_gradients``): it belongs to the next training step (each
    step's loss passed with ``retain_graph=True``; a term weighted 0 or a gate
    closed for the whole batch gives zeros, as eagerly).  A Trainer of other
    parameters (another model's) ends nothing."""
    _take_handed()
    if TLS.retained:
        noted = TLS.batched_params
        if any(id(param) in noted for param in getattr(self, "_params", ())):
            TLS.retained = False
    return _TRAINER_UPDATE(self, *args, **kwargs)


def note_written(arrays):
    """``arrays`` are written in place (``out=``, ``x[...] = v``, ``x -= v``): a
    write into a parameter's data after a pass that kept the graph is an update
    by hand (``w[:] = w - lr * w.grad``, ``set_data``), which ends it as a
    Trainer's update does (``_updating``)."""
    if not TLS.retained:
        return
    found = TLS.param_data
    if found is None:
        found = TLS.param_data = {id(data) for param in TLS.batched_params.values()
                                  for data in (getattr(param, "_data", None) or ())}
    if any(id(array) in found for array in arrays):
        TLS.retained = False


def autograd_mode():
    """(is_recording, is_training) of this thread, read from MXNet."""
    return (autograd.is_recording(), autograd.is_training())


_core.bind(lazy_mod.LazyArray, NDArray, MODE_CHANGES)
