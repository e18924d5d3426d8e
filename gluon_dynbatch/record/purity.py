"""Which child blocks' calls may be replayed without running their code.

A child HybridBlock's call is learned by tracing its ``hybrid_forward`` once
per path and replayed from then on (``frames.Frame._learn_block``): its
Python code does not run again.  That is right for code whose calls depend
only on its arguments' shapes and on what the block's token watches (its
parameters and plain attributes: ``trie.settings``).  Code that reads other
state (a dict, list or namespace attribute, changed in place; a function
stored on the block; a global list or object; Python's or numpy's random
draws) or does something besides computing (stores an attribute such as the
last attention weights, sets a global, prints) must run at every call, as
eager code does: such a block is traced at every call instead, as code
written operator by operator is recorded.  A global number or string the
code reads (which the parent may set per sample) is guarded instead: its
value is part of the block's key.

The check reads the bytecode of the class's ``hybrid_forward`` (each class of
its MRO that defines one), of the methods it calls on ``self``, of the
module-level functions it calls and of the functions nested in them, once per
class; the values of the attributes the code reads are checked at each
learning, as they belong to the instance.  Gluon's, gluonnlp's and this
package's blocks are trusted.
"""
import dis
import types

from mxnet import gluon
from mxnet.ndarray import NDArray

from .trie import is_setting

_TRUSTED = ("mxnet.", "gluonnlp.", "gluon_dynbatch.")
_STORES = frozenset(["STORE_ATTR", "DELETE_ATTR", "STORE_GLOBAL", "DELETE_GLOBAL"])
_SAFE_GLOBALS = (types.ModuleType, type, types.BuiltinFunctionType)
_MAX_DEPTH = 6
_ACTING_BUILTINS = frozenset(["print", "open", "input", "exec", "eval", "setattr", "delattr",
                              "globals", "vars", "next", "iter"])
# Modules whose functions draw, tell the time or act on the process: code
# calling them must run at every call (``np.random`` too).
_ACTING_MODULES = frozenset(["random", "numpy.random", "time", "datetime", "os", "sys",
                             "logging", "warnings", "builtins"])

_CLASSES = {}       # class -> None (code that must run), or (attributes, globals) it reads
_CODES = {}         # (code, class or None) -> None, or (attributes read on self, globals read)


def replay_guards(block):
    """None if calls of child ``block`` must run its code (or its children's);
    else the plain globals its code reads, as ``(namespace, name)`` pairs: a
    replay holds for the values they had when the call was learned, so their
    values are part of the block's key (``Recorder.block_token``)."""
    guards, stack, seen = set(), [block], set()
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        facts = _CLASSES.get(type(current), False)
        if facts is False:
            facts = _CLASSES[type(current)] = _class_reads(type(current))
        if facts is None:
            return None
        names, reads = facts
        for name in names:
            attribute, _, method = name.partition(".")
            value = getattr(current, attribute, None)
            if not _watched(value):
                return None
            if method and isinstance(value, gluon.Block):
                found = _method_reads(value, method)
                if found is None:
                    return None
                reads = reads + found
            if isinstance(value, gluon.Block):
                stack.append(value)
        guards.update(reads)
        stack.extend(current._children.values())  # pylint: disable=protected-access
    return tuple(sorted(guards, key=lambda read: (hash(read[0]), read[1])))


def _method_reads(block, method):
    """What code of ``block`` called as ``self.block.method(...)`` reads: None if
    it must run at every call, else the plain globals it reads (the attributes
    it reads on ``block`` must be what a replay holds)."""
    function = _function_of(getattr(type(block), method, None))
    if not isinstance(function, types.FunctionType):
        return ()
    facts = _facts(function, type(block), 1)
    if facts is None:
        return None
    for name in facts[0]:
        attribute = name.partition(".")[0]
        if not _watched(getattr(block, attribute, None)):
            return None
    return tuple(facts[1])


def _class_reads(cls):
    """None if code of ``cls`` must run at every call; else the names of the
    attributes it reads on ``self`` and the plain globals it reads."""
    if cls.__module__.startswith(_TRUSTED):
        return (), ()
    names, reads = set(), set()
    for klass in cls.__mro__:
        function = vars(klass).get("hybrid_forward")
        if function is None or klass.__module__.startswith(_TRUSTED):
            continue
        facts = _facts(function, cls, 0)
        if facts is None:
            return None
        names |= facts[0]
        reads |= facts[1]
    return tuple(sorted(names)), tuple(reads)


def _facts(function, cls, depth, method=True):
    """``_code_facts`` of a function's code (a method of ``cls``, or a function
    without ``self``), memoised; a trusted module's function reads and changes
    nothing of the user's."""
    code = getattr(function, "__code__", None)
    if code is None or (getattr(function, "__module__", None) or "").startswith(_TRUSTED):
        return _NOTHING
    key = (code, cls if method else None)
    found = _CODES.get(key, False)
    if found is False:
        _CODES[key] = _NOTHING                      # (a recursive function)
        found = _CODES[key] = _code_facts(code, function.__globals__, cls, depth,
                                          None if method else "")
    return found


_NOTHING = (frozenset(), frozenset())


def _code_facts(code, globals_, cls, depth, self_name=None):
    """None if ``code`` (or code it calls) must run at every call; else the
    names of the attributes it reads on ``self`` (its first argument, or the
    enclosing function's for a nested one; ``""``: none), ``"child.method"``
    for a method it calls on an attribute, and the plain globals it reads."""
    if depth > _MAX_DEPTH:
        return None
    if self_name is None and code.co_argcount:
        self_name = code.co_varnames[0]
    names, reads = set(), set()
    instructions = list(dis.get_instructions(code))
    for k, ins in enumerate(instructions):
        if ins.opname in _STORES:
            return None
        previous = instructions[k - 1] if k else None
        if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and ins.argval == "random" \
                and previous is not None and previous.opname == "LOAD_GLOBAL" \
                and getattr(globals_.get(previous.argval), "__name__", "") == "numpy":
            return None                 # ``np.random``: draws at every call
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            found = _global_facts(ins.argval, globals_, cls, depth)
        elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and _loads_self(previous, self_name):
            found = _self_attribute(ins.argval, cls, depth)
        elif ins.opname == "LOAD_METHOD" and previous.opname == "LOAD_ATTR" \
                and _loads_self(instructions[k - 2], self_name):
            found = (frozenset([previous.argval + "." + ins.argval]), frozenset())
        else:
            continue
        if found is None:
            return None
        names |= found[0]
        reads |= found[1]
    for const in code.co_consts:        # nested functions and lambdas
        if isinstance(const, types.CodeType):
            found = _code_facts(const, globals_, cls, depth + 1, self_name)
            if found is None:
                return None
            names |= found[0]
            reads |= found[1]
    return frozenset(names), frozenset(reads)


def _loads_self(ins, self_name):
    return bool(self_name) and ins is not None and ins.argval == self_name \
        and ins.opname in ("LOAD_FAST", "LOAD_DEREF")


def _self_attribute(name, cls, depth):
    """What reading ``self.name`` takes: a method's own facts, or the name."""
    method = getattr(cls, name, None)
    if isinstance(method, (types.FunctionType, staticmethod, classmethod, property)):
        return _facts(_function_of(method), cls, depth + 1)
    return frozenset([name]), frozenset()


def _function_of(member):
    if isinstance(member, (staticmethod, classmethod)):
        return member.__func__
    if isinstance(member, property):
        return member.fget
    return member


def _global_facts(name, globals_, cls, depth):
    """What reading global ``name`` takes: None if code must run at every call
    for it (a list, a dict, an object: changed in place unseen; an acting
    builtin such as ``print``; a function whose code must run); else the
    ``_code_facts`` it adds (a plain value: the read itself, guarded)."""
    value = globals_.get(name, _MISSING)
    if value is _MISSING:           # a builtin
        builtins = globals_.get("__builtins__")
        value = getattr(builtins, name, None) if isinstance(builtins, types.ModuleType) \
            else (builtins or {}).get(name)
        return None if value is None or name in _ACTING_BUILTINS else _NOTHING
    if isinstance(value, types.ModuleType) and value.__name__ in _ACTING_MODULES:
        return None
    if isinstance(value, _SAFE_GLOBALS):
        return _NOTHING
    if isinstance(value, types.FunctionType):
        return _facts(value, cls, depth + 1, method=False)
    if is_setting("", value):
        return frozenset(), frozenset([(_Namespace(globals_), name)])
    return None


class _Namespace:
    """A module's globals, hashed by identity (a dict is not hashable)."""

    __slots__ = ("space",)

    def __init__(self, space):
        self.space = space

    def __hash__(self):
        return id(self.space)

    def __eq__(self, other):
        return type(other) is _Namespace and other.space is self.space

    def get(self, name):
        return self.space.get(name)


_MISSING = object()


def _watched(value):
    """Whether an attribute value is one the block's token or arguments watch:
    a block, parameters, an array, a plain setting, a bound method."""
    if value is None or isinstance(value, _WATCHED):
        return True
    if type(value) in (list, tuple):        # blocks kept in a list (not registered)
        return all(isinstance(item, gluon.Block) for item in value) or is_setting("", value)
    if type(value) is dict:
        return all(isinstance(item, gluon.Block) for item in value.values())
    return is_setting("", value)


_WATCHED = (gluon.Block, gluon.Parameter, gluon.ParameterDict, NDArray, types.MethodType)
