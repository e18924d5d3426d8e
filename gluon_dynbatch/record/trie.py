"""The template trie: what frames learned, shared by every frame of a block.

A path from a root is a sequence of calls: each edge of a :class:`State` is
keyed by an operator call's key (see ``Frame.op``) and holds its
:class:`LearnedCall`, learned once; a child-block call is a :class:`Macro` edge that
skips over the block's calls.  A state remembers, per exported positions,
the recipe of the segment ending there (``templates.py``).

Tries live per thread and per block (``roots``): a block's trie holds its
parameters, so it is dropped with the block.  Blocks without parameters made
alike (``likeness``) share one trie, kept for the thread.
"""
import itertools
import logging
import threading
import weakref

import numpy as np

from mxnet.ndarray import NDArray

from ..ir.graph import LEAF, slot
from ..ir.known import exact_scalar
from ..ir.ops import Stand
from ._core import MAX_STATES, Macro, State  # noqa: F401  (compiled: nodes, macro edges)
from .lazy import LazyArray
from .usage import Usage

log = logging.getLogger(__name__)



class LearnedCall:
    """One operator call of a template (the edge of the trie it was learned on).

    Attributes
    ----------
    op : OpDef
    args, kwargs : tuple, dict
        The call with ``Slot(k)`` for the k-th array input (as ``Node``).
    refs : tuple
        Per array input: an int (a position of the frame), or ``("p",
        parameter)`` / ``("c", array)`` for a parameter or a constant.
    info : calls.CallInfo
        Output shapes and dtypes, batching rule and signature.
    outs : tuple of int
        Positions of the outputs.
    path : tuple
        Block names below the frame's block (for messages).
    site : tuple or None
        The call's place in the user's code (``sites.capture``).
    call : int or None
        The first position of the frame's call (an operator, or the child
        block that made it) this step belongs to.
    """

    __slots__ = ("op", "args", "kwargs", "refs", "info", "outs", "path", "site", "call")

    def __init__(self, op, args, kwargs, refs, info, outs, path):
        self.op, self.args, self.kwargs = op, args, kwargs
        self.refs, self.info, self.outs, self.path = refs, info, outs, path
        self.site = None            # where the user's code made the call (sites.py)
        self.call = None


_SIMPLE = (int, float, str, bool, type(None))


def flatten_args(args):
    """(arrays, structure) of a call's nested lists and tuples of arguments;
    (None, None) when a leaf is neither an array nor a simple value."""
    arrays = []
    structure = _walk_args(tuple(args), arrays)
    return (arrays, structure) if structure is not None else (None, None)


def _walk_args(obj, arrays):
    if isinstance(obj, NDArray):
        arrays.append(obj)
        return ("A", len(arrays) - 1)
    if isinstance(obj, (list, tuple)):
        inner = tuple(_walk_args(o, arrays) for o in obj)
        return None if None in inner else (type(obj).__name__, inner)
    # The type too: 1, 1.0 and True are equal keys, and code may tell them apart;
    # -0.0 and 0.0 too (``math.copysign``), as recorded scalars are.
    if isinstance(obj, float):
        return ("C", type(obj), exact_scalar(obj))
    return ("C", type(obj), obj) if isinstance(obj, _SIMPLE) else None


def holds_array(args):
    """Whether ``args`` (nested in lists and tuples) hold an NDArray."""
    for a in args:
        if isinstance(a, NDArray) or isinstance(a, (list, tuple)) and holds_array(a):
            return True
    return False


def is_constant(item):
    """Whether a key item of a positional argument is a constant ``(type, value)``."""
    return type(item) is tuple and type(item[0]) is type



_STORES = threading.local()


class Store:
    """What a thread's recorders keep across scopes.

    Cached constants (``F.zeros`` ...) become inputs of autograd's graph when
    a batch runs; one NDArray recorded by two threads' autograd at once
    corrupts MXNet's bookkeeping, so every thread has its own constants, and
    its own tries (which refer to constants by array).
    """

    def __init__(self):
        self.constants = {}       # (path, args, kwargs, ctx) -> array(s)
        self.constant_ids = {}    # id -> array of those constants (kept alive above)
        self.roots = {}           # (block, parameters, modes, replay) -> root State
        self.tokens = {}          # (id(block), parameters) -> small int (``token``)
        self.usages = {}          # (id(block), helper) -> Usage, shared by its roots
        self.alike = {}           # keys of blocks made alike (``likeness``), kept
        self.settings = {}        # id(block) -> the settings it was seen with (``settings``)
        self.versions = {}        # block identity -> its parameter sets kept, latest last
        self.counter = itertools.count()


def store():
    """This thread's :class:`Store`."""
    found = getattr(_STORES, "store", None)
    if found is None:
        found = _STORES.store = Store()
    return found


def parameters(block):
    """``block``'s parameters and its children's, as ``collect_params()`` lists
    them, without Gluon's scan of every list and dict attribute for unregistered
    blocks (a model that logs into a list attribute would pay for the whole log
    at every scope)."""
    found, stack = {}, [block]
    while stack:
        current = stack.pop()
        for name, param in current.params.items():
            found.setdefault(name, param)
        # children in reverse, so the first child's parameters come first
        stack.extend(reversed(list(current._children.values())))  # pylint: disable=protected-access
    return list(found.values())


# Attributes every Gluon block has (naming, caching, hybridization): what a
# block computes is in its class and its other attributes.
_GLUON_ATTRS = frozenset("""_empty_prefix _prefix _params _name _scope _children _reg_params
_forward_hooks _forward_pre_hooks _cached_graph _cached_op _cached_op_args _out_format
_in_format _active _flags _callback _monitor_all _backend _backend_opts""".split())
_PLAIN = (type(None), bool, int, float, str, bytes, np.bool_, np.int8, np.int16, np.int32,
          np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.float16, np.float32,
          np.float64, np.str_)       # numpy's numbers too: a setting annealed by numpy
_MAX_DEPTH = 8
MAX_ALIKE = 256     # kinds of blocks made alike whose tries a thread keeps


class _Unlike(Exception):
    """A block whose calls no other block may stand in for."""


def likeness(block):
    """A key every block made the same way shares, or None.

    A block without parameters (its children's included) or hooks, whose
    attributes are numbers, strings, tuples of them or such blocks: two made
    with the same class and arguments compute the same, so templates learned
    on one hold for the other (gluonnlp's ``BeamSearchSampler`` makes its step
    block anew for every search).  Any other block is only itself, and so is
    every block once a thread knows ``MAX_ALIKE`` such keys.
    """
    try:
        form = _block_form(block, 0)
    except _Unlike:
        return None
    alike = store().alike
    if form not in alike:
        if len(alike) >= MAX_ALIKE:     # blocks made with ever new numbers
            return None
        alike[form] = True
    return form


def _block_form(block, depth):
    attrs = vars(block)
    if depth > _MAX_DEPTH or "_params" not in attrs or list(attrs["_params"].keys()):
        raise _Unlike
    if attrs.get("_reg_params") or attrs.get("_forward_hooks") \
            or attrs.get("_forward_pre_hooks"):
        raise _Unlike
    own = tuple(sorted((name, _value_form(value, depth)) for name, value in attrs.items()
                       if name not in _GLUON_ATTRS))
    children = tuple(_block_form(child, depth + 1) for child in block._children.values())  # pylint: disable=protected-access
    return (type(block), own, children)


def exact(value):
    """``value`` as part of a key, told apart as recorded scalars are
    (``ir.known.exact_scalar``: ``-0.0`` is not ``0.0``, a NaN equals itself),
    a tuple item by item; anything else as it is."""
    if isinstance(value, (float, np.floating)):
        return (type(value), exact_scalar(value))
    if type(value) is tuple:
        return tuple(exact(item) for item in value)
    return value


def _value_form(value, depth):
    kind = type(value)
    if kind in _PLAIN:
        return (kind, exact(value))
    if kind in (tuple, list):
        return (kind, tuple(_value_form(item, depth) for item in value))
    if hasattr(value, "_children") and hasattr(value, "_params"):     # a Gluon block
        return _block_form(value, depth + 1)
    raise _Unlike


#: Attributes that change between calls without changing what a block computes:
#: rnn cells' counters, and a DynBatchBlock's own running state (``block.py``: the
#: recent execution time a flush writes, whether its samples read values).
_RUNNING_ATTRS = frozenset(["_counter", "_init_counter", "skip_states", "recent_execute_s",
                            "reads_inside"])
#: What Gluon and this package write while a block runs, never the user's
#: setting: written by the scope's own code (a plain rnn cell called between
#: samples' calls), it makes no waiting sample finish first (``dispatch``).
_BOOKKEEPING = _RUNNING_ATTRS | frozenset(["_cached_graph", "_cached_op", "_cached_op_args",
                                           "_out_format", "_in_format"])


def is_bookkeeping(name):
    """Whether attribute ``name`` of a block is bookkeeping (``_BOOKKEEPING``)."""
    return name in _BOOKKEEPING


#: Settings of one block a thread tells apart (``settings``).
MAX_SETTINGS = 16


def settings_form(block):
    """``(name, value)`` of every plain attribute of ``block`` and its children."""
    found, stack = [], [block]
    while stack:
        current = stack.pop()
        for name, value in vars(current).items():
            if is_setting(name, value):
                found.append((name, exact(value)))
        stack.extend(current._children.values())  # pylint: disable=protected-access
    return tuple(found)


def settings(block):
    """The plain attributes (numbers, strings, tuples of them) of ``block`` and
    its children: what a replayed template assumes unchanged.

    A child block's template replays its calls without running its code, so
    one made with ``self.tau = 1.0`` must not be replayed once ``tau`` is 0.5:
    the settings are part of the block's token (``Recorder.block_token``), and
    a block whose settings changed learns its calls anew (a setting changed
    inside a scope makes the scope's tokens anew: ``dispatch.install``).  A block seen with
    more than ``MAX_SETTINGS`` settings (an attribute set per call, or counting
    the calls) gets None: its calls run its code every time, as calls of a block
    the replay cannot hold for do (``Recorder.block_token``), with a warning.
    """
    form = settings_form(block)
    seen = store().settings.setdefault(id(block), set())
    if form not in seen:
        if len(seen) >= MAX_SETTINGS:
            if len(seen) == MAX_SETTINGS:
                seen.add(None)
                log.warning("%s: its attributes took more than %d values (%s); its "
                            "calls now run its code every time instead of replaying what "
                            "was recorded, which is slower", type(block).__name__,
                            MAX_SETTINGS, ", ".join(_changed(form, seen)))
            return None
        seen.add(form)
        if len(seen) == 1:
            _drop_with(block, None, "settings", id(block))
    return form


def is_setting(name, value):
    """Whether attribute ``name = value`` of a block is part of its ``settings``."""
    if name in _GLUON_ATTRS or name in _RUNNING_ATTRS:
        return False
    kind = type(value)
    return kind in _PLAIN or kind is tuple and all(type(v) in _PLAIN for v in value)


def _changed(form, seen):
    """Names of the attributes whose values in ``form`` differ from another
    settings form in ``seen``."""
    other = dict(next(f for f in seen if f is not None and f != form))
    return sorted({name for name, value in form if other.get(name, value) != value}) or ["-"]


def version(block):
    """Identity, shapes and dtypes of ``block``'s parameters."""
    return tuple((id(p), p.shape, p.dtype) for p in parameters(block))


MAX_VERSIONS = 4    # parameter sets of one block whose tries are kept (``_keep_version``)


def root(key, block):
    """This thread's root State of ``key`` (block, parameters, modes...)."""
    roots = store().roots
    found = roots.get(key)
    if found is None or found.counter[0] >= MAX_STATES:
        _keep_version(store(), key, block)
        found = roots[key] = State()
        # A block's first scope often records before its parameters have
        # shapes, so its roots differ by version: how its programs batched
        # counts for the block, whichever root recorded them.
        usages = store().usages
        found.usage = usages.get((key[0], key[-1]))
        if found.usage is None:
            found.usage = usages[(key[0], key[-1])] = Usage()
            found.usage.name = type(block).__name__
            _drop_with(block, key, "usages", (key[0], key[-1]))
        found.usage.counters.append(found.counter)     # states learned, per block
        # The trie holds the block's parameters: drop it with the block.
        _drop_with(block, key, "roots", key)
    return found


def _keep_version(kept, key, block):
    """Note that ``block``, named ``key[0]``, records with parameters ``key[1]``
    (``version``); past ``MAX_VERSIONS`` sets, drop the tries and tokens of its
    least recent one.  A child replaced by a new one before each scope (a
    fresh head per task) would otherwise keep every old one's parameters, and
    their arrays, alive in its parent's tries."""
    identity, params = key[0], key[1]
    versions = kept.versions.get(identity)
    if versions is None:
        versions = kept.versions[identity] = []
        _drop_with(block, key, "versions", identity)
    if params in versions:
        if versions[-1] != params:
            versions.remove(params)
            versions.append(params)
        return
    versions.append(params)
    if len(versions) <= MAX_VERSIONS:
        return
    old = versions.pop(0)
    for table in (kept.roots, kept.tokens):
        for stale in [k for k in table if k[0] == identity and k[1] == old]:
            dropped = table.pop(stale)
            if table is kept.roots and dropped.usage is not None:
                dropped.usage.counters[:] = [c for c in dropped.usage.counters
                                             if c is not dropped.counter]


_DROPS = {}     # id(block) -> [(store, table, entry)] to drop when the block dies
_DROPS_LOCK = threading.Lock()


def _drop_with(block, key, table, entry):
    """Drop ``entry`` of this thread's store's ``table`` when ``block`` dies,
    unless ``key`` names blocks made alike (``likeness``): those outlive any
    one of them.  Stores are held weakly: a thread's store, tries and
    constants go when the thread ends, though the block lives on."""
    if key is not None and type(key[0]) is tuple:
        return
    with _DROPS_LOCK:
        drops = _DROPS.get(id(block))
        if drops is None:
            drops = _DROPS[id(block)] = []
            weakref.finalize(block, _drop_all, id(block))
        # (not those of threads that ended, nor entries dropped already)
        drops[:] = [d for d, kept in ((d, d[0]()) for d in drops)
                    if kept is not None and d[2] in getattr(kept, d[1])]
        drops.append((weakref.ref(store()), table, entry))


def _drop_all(block_id):
    with _DROPS_LOCK:
        drops = _DROPS.pop(block_id, ())
    for store_ref, table, entry in drops:
        found = store_ref()
        if found is not None:
            getattr(found, table).pop(entry, None)


def token(key, block):
    """A small int naming ``key`` (a block and its parameters) in this thread."""
    tokens = store().tokens
    found = tokens.get(key)
    if found is None:
        _keep_version(store(), key, block)
        found = tokens[key] = next(store().counter)
        _drop_with(block, key, "tokens", key)
    return found


def learn_call(rec, frame, op, args, kwargs, refs, kw):
    """The :class:`trie.LearnedCall` of a call a frame meets for the first time.

    ``refs`` and ``kw`` are the call's key items (see ``Frame.op``).
    Inputs that are values of the frame stand in as :class:`ops.Stand`
    objects with their shapes; the analysis is the one of ``add_node``.
    """
    inputs, targs, step_refs = [], [], []
    for a, ref in zip(args, refs):
        if is_constant(ref):
            targs.append(a)
            continue
        if type(ref) is tuple and ref[0] == "x":      # read for the first time
            ref = frame.ext[id(a)]
        targs.append(slot(len(inputs)))
        inputs.append(_source(rec, frame, a, ref))
        step_refs.append(_step_ref(rec, ref))
    tkw = {}
    for name, ref in kw or ():
        value = kwargs[name]
        if isinstance(value, NDArray):
            if type(ref) is tuple and ref[0] == "x":
                ref = frame.ext[id(value)]
            tkw[name] = slot(len(inputs))
            inputs.append(_source(rec, frame, value, ref))
            step_refs.append(_step_ref(rec, ref))
        else:
            tkw[name] = value
    info = rec.analyse_stub(op, tuple(targs), tkw, inputs)
    start = len(frame.out_shapes)
    outs = tuple(range(start, start + len(info.out_shapes)))
    return LearnedCall(op, tuple(targs), tkw, tuple(step_refs), info, outs,
                rec.path[len(frame.path):])


def _source(rec, frame, array, ref):
    """``(node, idx)`` standing for an input of a frame's call during analysis.

    A value the frame read from outside before a flush of this scope is, by
    now, either a leaf of the value the flush gave it or rows of a batched
    output, from sample to sample: its key item, given when it was read,
    says neither.  It stands in by its shape alone, so that no rule reads
    its values when it plans (``ir.known.values_known``) for one sample and
    finds rows of a computed output in the next.
    """
    if type(ref) is int:
        outside = frame.vals.get(ref)
        if outside is not None:
            found = rec.value_of(outside)
            node = found[0]
            if node.kind != LEAF or type(node.value) is not LazyArray:
                return found
        return (Stand(frame.out_shapes[ref], frame.out_dtypes[ref], ref), 0)
    return rec.value_of(array)

def _step_ref(rec, ref):
    """A key item as a step keeps it: positions, parameters, constant arrays."""
    if type(ref) is int:
        return ref
    if ref[0] == "c":
        return ("c", rec.constant_ids[ref[1]])
    if ref[0] == "p":
        return ref
    raise AssertionError("unexpected key item %r" % (ref,))
