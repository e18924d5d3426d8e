"""Which child blocks' calls may be replayed without running their code.

A child HybridBlock's call is learned by tracing its ``hybrid_forward`` once
per path and replayed from then on (``frames.Frame._learn_block``): its
Python code does not run again.  That is right for code whose calls depend
only on its arguments' shapes and on what the block's token holds (its
parameters and the plain attributes of its instance: ``trie.settings``).

Code that reads other state is *guarded*: the values it read are part of the
block's key (``Recorder.block_token``), read again at every call, so a
change is a new call to learn.  Such state is a plain value (numbers,
strings, enumeration members, small numpy arrays, and lists, tuples, named
tuples, sets and dicts of them, of at most ``_MAX_ITEMS`` items) held by a
module's globals, an attribute of a module or class, a class attribute read
through ``self``, a list or dict attribute of the instance, or a cell of a
closure.

Code that reads state no key can hold (an object's attributes, a function
stored on the block or bound to another object, values of arrays, Python's or
numpy's random draws, the clock) or acts besides computing (stores or
deletes an attribute, writes into a container it did not make, appends to
one, prints, sets a global) must run at every call, as eager code does: such
a block is traced at every call instead, as code written operator by operator
is recorded.

The check reads the bytecode of the class's ``hybrid_forward`` (each class of
its MRO that defines one), of the methods it calls on ``self`` or on its
child blocks, of the functions it calls and of the functions nested in them,
once per class; the values of the attributes the code reads are checked per
block, as they belong to the instance.  Gluon's, gluonnlp's, numpy's and
this package's code is trusted.
"""
import collections
import dis
import enum
import inspect
import logging
import sys
import types

import numpy as np
from mxnet import gluon
from mxnet.ndarray import NDArray

from .trie import exact, is_setting, settings_form

log = logging.getLogger("gluon_dynbatch.record")

_TRUSTED = ("mxnet.", "gluonnlp.", "gluon_dynbatch.", "numpy.")
_STORES = frozenset(["STORE_ATTR", "DELETE_ATTR", "STORE_GLOBAL", "DELETE_GLOBAL",
                     "DELETE_DEREF"])
_SUBSCRIPT_STORES = frozenset(["STORE_SUBSCR", "DELETE_SUBSCR"])
_MAX_DEPTH = 10
_ACTING_BUILTINS = frozenset(["print", "open", "input", "exec", "eval", "setattr", "delattr",
                              "globals", "vars", "next", "iter", "__import__", "breakpoint"])
# Modules whose functions draw, tell the time or act on the process: code
# calling them must run at every call (``np.random`` too).
_ACTING_MODULES = frozenset(["random", "numpy.random", "time", "datetime", "os", "sys",
                             "logging", "warnings", "builtins", "secrets", "uuid"])
# Attributes whose use acts on an object or reads an array's values.
_ACTING_ATTRIBUTES = frozenset(["__setattr__", "__delattr__", "__dict__", "asscalar",
                                "asnumpy", "tolist", "item", "wait_to_read"])
# Functions of the standard library that write into their arguments or print.
_WRITING_FUNCTIONS = frozenset(["setitem", "delitem", "iadd", "isub", "imul", "iconcat",
                                "pprint", "print_stack", "print_exc", "copyfileobj"])
# Methods that change a list, dict or set in place.
_MUTATORS = frozenset(["append", "extend", "insert", "pop", "update", "setdefault", "add",
                       "clear", "remove", "discard", "popitem", "sort", "reverse",
                       "appendleft", "__setitem__", "__delitem__", "__iadd__", "fill", "put",
                       "itemset", "resize", "setflags", "partition", "move_to_end",
                       "intersection_update", "difference_update",
                       "symmetric_difference_update"])

_CLASSES = {}       # class -> None (code that must run), or the facts of its code
_CODES = {}         # (code, or a closure's function; class or None) -> None, or facts
_NOTHING = (frozenset(), frozenset())   # facts: (names read on self, guards)


def replay_guards(block):
    """None if calls of child ``block`` must run its code (or its children's);
    else what a replay holds for, as ``(space, name)`` pairs whose
    ``space.get(name)`` is the value read now: their values are part of the
    block's key (``Recorder.block_token``).  Code the analysis cannot read
    runs at every call."""
    try:
        return _replay_guards(block)
    except Exception as err:  # pylint: disable=broad-except
        log.debug("%s: its code runs at every call (not analysed: %r)",
                  type(block).__name__, err)
        return None


def _replay_guards(block):
    guards, stack, seen = set(), [block], set()
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if current is not block and (current._forward_hooks  # pylint: disable=W0212
                                     or current._forward_pre_hooks):  # pylint: disable=W0212
            return None         # a hook of a block inside runs as its calls run (eager's)
        key = (type(current), _class_code(type(current)))
        facts = _CLASSES.get(key, False)
        if facts is False:
            facts = _CLASSES[key] = _class_facts(type(current))
        found = None if facts is None else _instance_guards(current, facts, stack)
        if found is not None and isinstance(current, _LAMBDAS):
            found = _lambda_guards(current, found)
        if found is None:
            return None
        guards.update(found)
        stack.extend(current._children.values())  # pylint: disable=protected-access
    return tuple(sorted(guards, key=lambda guard: (hash(guard[0]), guard[1])))


def code_version(block):
    """The code calls of ``block`` and its children run: each class's methods
    and methods set on the block itself, by identity.  Part of the block's key
    (``Recorder.block_token``), so a method replaced after its calls were
    learned (``Cell.hybrid_forward = f``, ``cell.hybrid_forward = ...``) has
    them learned anew."""
    found, stack, seen = [], [block], set()
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        found.append((_class_code(type(current)), _instance_code(current)))
        stack.extend(current._children.values())  # pylint: disable=protected-access
    return tuple(found)


def _class_code(cls):
    """The methods the user-defined classes of ``cls`` define (compared by
    identity; held, so that no later function takes a freed one's id)."""
    return tuple(member for klass in cls.__mro__
                 if klass is not object and not _trusted(klass.__module__)
                 for member in vars(klass).values() if _is_function(member))


def _instance_code(block):
    """The code set on ``block`` itself under the name of a method
    (``cell.hybrid_forward = types.MethodType(f, cell)``): what its calls run."""
    cls = type(block)
    return tuple((name, getattr(value, "__func__", value))
                 for name, value in vars(block).items()
                 if callable(value) and not isinstance(value, gluon.Block)
                 and (name == "hybrid_forward" or _is_function(getattr(cls, name, None))))


# Gluon's blocks that call a function the user gave them (``_func``).
_LAMBDAS = (gluon.nn.HybridLambda, gluon.nn.Lambda)


def _lambda_guards(block, guards):
    """``guards`` with those of the user's function a ``HybridLambda`` calls
    (None: it must run).  Attributes of a block it closes over (the parent's
    ``self.temp``) are no key's: such a function runs at every call."""
    function = getattr(block, "_func", None)
    if not isinstance(function, types.FunctionType):
        return None                         # a callable object: its code unknown
    for cell in function.__closure__ or ():
        try:
            if isinstance(cell.cell_contents, gluon.Block):
                return None
        except ValueError:                  # (not bound yet)
            continue
    facts = _facts(function, type(block), 0, method=False)
    return None if facts is None else set(guards) | set(facts[1])


def _instance_guards(block, facts, stack):
    """The guards of ``block``'s code given its facts (None: it must run);
    blocks it reaches go on ``stack``."""
    names, guards = facts
    guards = set(guards)
    for name in names:
        attribute, _, method = name.partition(".")
        value = getattr(block, attribute, _MISSING)
        if method:
            found = _method_guards(value, method, stack)
        else:
            found = _attribute_guards(block, attribute, value, stack)
        if found is None:
            return None
        guards.update(found)
    return guards


def _attribute_guards(block, name, value, stack):
    """What reading ``block.name`` (``value``) takes: None if the code must run."""
    if value is None or isinstance(value, (gluon.Parameter, gluon.ParameterDict)):
        return ()
    if isinstance(value, NDArray):          # read by operators, or its shape in Python
        return ((_ArrayShape(block), name),)
    if value is _MISSING:                   # (set later, or on another path)
        return ((_Space(block), name),)
    if isinstance(value, gluon.Block):
        stack.append(value)
        return ()
    if isinstance(value, types.MethodType):
        return _method_guards(value.__self__, value.__func__.__name__, stack)
    if type(value) in (list, tuple, dict):
        items = list(value.values()) if type(value) is dict else list(value)
        if items and all(isinstance(item, gluon.Block) for item in items):
            stack.extend(items)             # blocks kept in a list (not registered):
            return tuple((_Settings(item), "") for item in items)   # their settings too
    if _frozen(value) is UNFROZEN:
        return None
    if name in vars(block) and is_setting(name, value):
        return ()                           # in the block's token (``trie.settings``)
    return ((_Space(block), name),)


def _method_guards(owner, method, stack):
    """What calling ``owner.method(...)`` takes: a child block's method is read
    as its code; a plain container's method must not change it (``"*"``: an
    alias of it, whose methods are not known, is a plain value only)."""
    if method == "*":
        if isinstance(owner, gluon.Block):
            stack.append(owner)
            return ()
        return () if isinstance(owner, _PLAIN) or owner is None else None
    if isinstance(owner, gluon.Block):
        member = inspect.getattr_static(type(owner), method, None)
        if not _is_function(member):
            return ()
        facts = _member_function_facts(member, type(owner), 1)
        return None if facts is None else _instance_guards(owner, facts, stack)
    if method in _MUTATORS or type(owner) not in _SEQUENCES + (np.ndarray,) \
            and not isinstance(owner, tuple) or _frozen(owner) is UNFROZEN:
        return None
    return ()               # (the container itself is guarded by its attribute's read)


def _trusted(module):
    """Whether code of module ``module`` (a name, or None) is trusted."""
    return (str(module) + ".").startswith(_TRUSTED)


def _class_facts(cls):
    """None if code of ``cls`` must run at every call; else the facts of its
    methods: ``hybrid_forward`` and every other method its user-defined classes
    define (a method a parent calls on it, directly or through a local name,
    runs as part of the parent's replayed call)."""
    if _trusted(cls.__module__):
        return _NOTHING
    names, guards = set(), set()
    for klass in cls.__mro__:
        if klass is object or _trusted(klass.__module__):
            continue
        for name, member in vars(klass).items():
            if name in _NOT_CALLED:
                continue
            if name in ("__getattr__", "__getattribute__", "__call__"):
                return None
            if _is_function(member) or name == "hybrid_forward":
                facts = _member_function_facts(member, cls, 0)
                if facts is None:
                    return None
                names |= facts[0]
                guards |= facts[1]
    return frozenset(names), frozenset(guards)


# Methods a block's calls do not run (the constructor, Gluon's bookkeeping).
_NOT_CALLED = frozenset(["__init__", "__new__", "__repr__", "__str__", "__init_subclass__",
                         "__del__", "__getstate__", "__setstate__", "__reduce__",
                         "__setattr__", "forward", "initialize", "cast", "hybridize",
                         "__module__", "__doc__", "__qualname__", "__dict__", "__weakref__"])


def _is_function(member):
    """Whether a class member is code: a function, a static or class method, a
    property, or a decorated function (``__wrapped__``)."""
    return isinstance(member, (types.FunctionType, staticmethod, classmethod, property)) \
        or hasattr(member, "__wrapped__")


def _member_function_facts(member, cls, depth):
    """The facts of a method, a static or class method, a property or a
    decorated method (through ``__wrapped__``); None for a member the analysis
    cannot read (a callable object)."""
    if isinstance(member, staticmethod):
        return _facts(member.__func__, cls, depth, method=False)
    if isinstance(member, classmethod):         # its ``cls`` reads as ``self`` does
        return _facts(member.__func__, cls, depth)
    if isinstance(member, property):
        return _facts(member.fget, cls, depth) if member.fget is not None else _NOTHING
    while hasattr(member, "__wrapped__"):      # ``functools.wraps`` decorators
        if not isinstance(member, types.FunctionType):
            return None                         # a decorator object: its code unknown
        facts = _facts(member, cls, depth, method=False)
        if facts is None:
            return None
        member = member.__wrapped__
    if not isinstance(member, types.FunctionType):
        return None
    return _facts(member, cls, depth)


def _facts(function, cls, depth, method=True):
    """The facts of a function's code (a method of ``cls``, or a function
    without ``self``), with its closure and defaults, memoised; None if it
    must run at every call.  A trusted module's function reads and changes
    nothing of the user's."""
    code = getattr(function, "__code__", None)
    if code is None or _trusted(getattr(function, "__module__", None)):
        return _NOTHING
    key = (code if function.__closure__ is None else function, cls if method else None)
    found = _CODES.get(key, False)
    if found is False:
        _CODES[key] = _NOTHING                      # (a recursive function)
        found = _code_facts(code, function.__globals__, cls, depth, None if method else "")
        if found is not None:
            found = _closure_facts(function, found, cls, depth)
        _CODES[key] = found
    return found


def _closure_facts(function, facts, cls, depth):
    """``facts`` with what the function's closure cells and defaults hold."""
    names, guards = set(facts[0]), set(facts[1])
    for default in (function.__defaults__ or ()) + tuple((function.__kwdefaults__ or {}).values()):
        if type(default) in (list, dict, set) or _frozen(default) is UNFROZEN \
                and not isinstance(default, (gluon.Block, NDArray, types.ModuleType, type)):
            return None                     # a mutable default: state kept between calls
    for cell in function.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:                  # (not bound yet)
            continue
        if isinstance(value, types.FunctionType):
            found = _facts(value, cls, depth + 1, method=False)
        elif isinstance(value, (types.ModuleType, type, gluon.Block)):
            found = _NOTHING
        elif _frozen(value) is not UNFROZEN:
            found = (frozenset(), frozenset([(_Cell(cell), "")]))
        else:
            return None
        if found is None:
            return None
        names |= found[0]
        guards |= found[1]
    return frozenset(names), frozenset(guards)


def _code_facts(code, globals_, cls, depth, self_name=None):
    """None if ``code`` (or code it calls) must run at every call; else the
    names of the attributes it reads on ``self`` (its first argument, or the
    enclosing function's for a nested one; ``""``: none), ``"child.method"``
    for a method it calls on an attribute, and the guards of what else it
    reads."""
    if depth > _MAX_DEPTH:
        return None
    if self_name is None and code.co_argcount:
        self_name = code.co_varnames[0]
    names, guards = set(), set()
    instructions = list(dis.get_instructions(code))
    if _updates_an_argument(code, instructions):
        return None
    for k, ins in enumerate(instructions):
        found = _instruction_facts(instructions, k, globals_, cls, depth, self_name)
        if found is None:
            return None
        names |= found[0]
        guards |= found[1]
    for const in code.co_consts:        # nested functions and lambdas
        if isinstance(const, types.CodeType):
            found = _code_facts(const, globals_, cls, depth + 1, self_name)
            if found is None:
                return None
            names |= found[0]
            guards |= found[1]
    return frozenset(names), frozenset(guards)


def _updates_an_argument(code, instructions):
    """Whether ``code`` updates one of its arguments in place (``x *= 2``) before
    binding that name to anything else: it writes into its caller's array."""
    arguments = set(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount])
    for ins, following in zip(instructions, instructions[1:]):
        if ins.opname == "STORE_FAST":
            arguments.discard(ins.argval)
        elif ins.opname == "BINARY_OP" and ins.argrepr.endswith("=") \
                and following.opname == "STORE_FAST" and following.argval in arguments:
            return True
    return False


def _instruction_facts(instructions, k, globals_, cls, depth, self_name):
    """The facts instruction ``k`` adds (None: the code must run)."""
    ins = instructions[k]
    previous = instructions[k - 1] if k else None
    if ins.opname in _STORES:
        return None
    if ins.opname in _SUBSCRIPT_STORES:     # into a container it did not make here
        return None if _statement_reads_state(instructions, k, self_name) else _NOTHING
    if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and ins.argval in _ACTING_ATTRIBUTES:
        return None
    if ins.opname in ("MATCH_CLASS", "MATCH_MAPPING", "MATCH_KEYS"):
        return None                         # patterns read attributes without LOAD_ATTR
    if _loads_self(ins, self_name) and not _self_read_by_attribute(instructions, k):
        return None                         # ``self`` passed on, stored or aliased
    if ins.opname == "STORE_FAST" and previous is not None \
            and previous.opname == "LOAD_ATTR" and k >= 2 \
            and _loads_self(instructions[k - 2], self_name):
        return frozenset([previous.argval + ".*"]), frozenset()     # ``kept = self.kept``
    if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF") and ins.argval == "getattr" \
            and k + 1 < len(instructions) and (_loads_self(instructions[k + 1], self_name)
                                               or _shared_object(instructions[k + 1], globals_)):
        return None                         # ``getattr(self, name)``, ``getattr(cfg, name)``
    if ins.opname == "IMPORT_NAME" and not _known_module(ins.argval):
        return None                         # ``import cfg`` inside the code: its attributes
    if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and _aliased(instructions, k, self_name) \
            and (ins.argval == "type" or _shared_object(ins, globals_)):
        return None                         # ``m = cfg``, ``cls = type(self)``: read unkeyed
    if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
        following = instructions[k + 1] if k + 1 < len(instructions) else None
        return _global_facts(ins.argval, globals_, cls, depth, following)
    if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and _loads_self(previous, self_name):
        return _self_attribute(ins.argval, cls, depth)
    if ins.opname == "LOAD_METHOD" and previous is not None \
            and previous.opname == "LOAD_ATTR" and k >= 2 \
            and _loads_self(instructions[k - 2], self_name):
        return frozenset([previous.argval + "." + ins.argval]), frozenset()
    if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and _after_call(instructions, k, "super"):
        return _super_facts(ins.argval, cls, depth)
    if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and _after_call(instructions, k, "type") \
            and _loads_self(instructions[k - 3], self_name):
        return _self_attribute(ins.argval, cls, depth)      # ``type(self).name``
    return _NOTHING


def _known_module(name):
    """Whether module ``name`` is trusted or of Python's standard library."""
    return _trusted(name) or str(name).partition(".")[0] in sys.stdlib_module_names


def _shared_object(ins, globals_):
    """Whether instruction ``ins`` loads a global (or closure cell) holding state
    other code may change: a module or class of the user's, or ``type``
    (``getattr(type(self), name)``); not a trusted module."""
    if ins.opname == "LOAD_DEREF":
        return True
    if ins.opname not in ("LOAD_GLOBAL", "LOAD_NAME"):
        return False
    value = globals_.get(ins.argval, _MISSING)
    if value is _MISSING:
        return ins.argval == "type"
    if isinstance(value, types.ModuleType):
        return not _known_module(value.__name__)
    return isinstance(value, type) and not _known_module(value.__module__)


def _aliased(instructions, k, self_name):
    """Whether the global loaded at ``k`` (or ``type(self)`` called there) is
    stored in a local name, whose attributes the code then reads unkeyed."""
    j = k + 1
    if j < len(instructions) and _loads_self(instructions[j], self_name):
        j += 1
        while j < len(instructions) and instructions[j].opname in ("PRECALL", "CALL"):
            j += 1
    return j < len(instructions) and instructions[j].opname == "STORE_FAST"


def _statement_reads_state(instructions, k, self_name):
    """Whether the container a subscript store ``k`` writes into is reached from
    ``self``, a global or a closure cell (not a local the code made)."""
    start = k
    while start > 0 and instructions[start].starts_line is None:
        start -= 1
    region = instructions[start:k]
    if not any(ins.opname in ("SWAP", "COPY") for ins in region):
        need, j = 2, k - 1          # the instructions pushing the container and key
        while j >= start and need > 0:
            ins = instructions[j]
            try:
                need -= dis.stack_effect(ins.opcode, ins.arg) \
                    if ins.opcode >= dis.HAVE_ARGUMENT else dis.stack_effect(ins.opcode)
            except ValueError:
                break
            j -= 1
        else:
            region = instructions[j + 1:k]
    return any(ins.opname in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF")
               or ins.opname == "LOAD_FAST" and ins.argval == self_name for ins in region)


def _self_read_by_attribute(instructions, k):
    """Whether ``self`` loaded at ``k`` is only read by an attribute (``self.x``),
    or passed to ``super(Cls, self)``, ``type(self)`` or ``isinstance``."""
    following = instructions[k + 1] if k + 1 < len(instructions) else None
    if following is not None and following.opname in ("LOAD_ATTR", "LOAD_METHOD"):
        return True
    for j in range(k - 1, max(k - 4, -1), -1):
        ins = instructions[j]
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF") \
                and ins.argval in ("super", "type", "isinstance", "id", "__class__"):
            return True
    return False


def _after_call(instructions, k, builtin):
    """Whether instruction ``k`` reads an attribute of ``builtin(...)``
    (``super()``, ``type(self)``)."""
    for j in range(k - 1, max(k - 7, -1), -1):
        ins = instructions[j]
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and ins.argval == builtin:
            return True
        if ins.opname not in ("PRECALL", "CALL", "PUSH_NULL", "CACHE", "LOAD_DEREF",
                              "LOAD_FAST", "LOAD_CLOSURE", "LOAD_GLOBAL", "LOAD_NAME"):
            return False
    return False


def _super_facts(name, cls, depth):
    """What ``super().name`` reads: every definition of ``name`` in the MRO."""
    names, guards = set(), set()
    for klass in cls.__mro__[1:]:
        member = vars(klass).get(name)
        if _is_function(member):
            found = _member_function_facts(member, cls, depth + 1)
            if found is None:
                return None
            names |= found[0]
            guards |= found[1]
    return frozenset(names), frozenset(guards)


def _loads_self(ins, self_name):
    return bool(self_name) and ins is not None and ins.argval == self_name \
        and ins.opname in ("LOAD_FAST", "LOAD_DEREF")


def _self_attribute(name, cls, depth):
    """What reading ``self.name`` takes: a method's own facts, or the name."""
    member = inspect.getattr_static(cls, name, None)
    if _is_function(member):
        return _member_function_facts(member, cls, depth + 1)
    if member is not None and callable(member) and not isinstance(member, type) \
            and not _trusted(type(member).__module__):
        return None                             # a callable object on the class
    return frozenset([name]), frozenset()


def _function_of(member):
    if isinstance(member, (staticmethod, classmethod)):
        return member.__func__
    if isinstance(member, property):
        return member.fget
    return member


def _global_facts(name, globals_, cls, depth, following):
    """What reading global ``name`` takes (``following``: the next instruction,
    an attribute read on it)."""
    value = globals_.get(name, _MISSING)
    if value is _MISSING:           # a builtin
        if following is not None and following.opname in ("LOAD_ATTR", "LOAD_METHOD") \
                and (following.argval in _MUTATORS or following.argval in _WRITING_FUNCTIONS):
            return None                         # ``list.append(self.kept, x)``
        builtins = globals_.get("__builtins__")
        value = getattr(builtins, name, None) if isinstance(builtins, types.ModuleType) \
            else (builtins or {}).get(name)
        return None if value is None or name in _ACTING_BUILTINS else _NOTHING
    if following is not None and following.opname == "LOAD_METHOD" \
            and following.argval in _MUTATORS:
        return None                             # ``LOG.append(x)``
    found = _value_facts(value, cls, depth)
    if found is not _GUARD:
        if found is not None and isinstance(value, (types.ModuleType, type)) \
                and following is not None and following.opname in ("LOAD_ATTR", "LOAD_METHOD"):
            return _member_facts(value, following.argval, cls, depth)
        return found
    return frozenset(), frozenset([(_Space(globals_, mapping=True), name)])


_GUARD = object()       # ``_value_facts``: a plain value, read through a guard


def _value_facts(value, cls, depth):
    """What reading ``value`` (a global, a module's or a class's attribute)
    takes: None if the code must run, ``_GUARD`` for a plain value."""
    if isinstance(value, types.ModuleType):
        return None if value.__name__ in _ACTING_MODULES else _NOTHING
    if isinstance(value, type):
        return _NOTHING
    if isinstance(value, types.FunctionType):
        return _facts(value, cls, depth + 1, method=False)
    if isinstance(value, (types.BuiltinFunctionType, np.ufunc)):
        owner = getattr(value, "__self__", None)
        module = getattr(value, "__module__", None) or getattr(owner, "__name__", "")
        if owner is not None and not isinstance(owner, types.ModuleType) \
                or module in _ACTING_MODULES:
            return None                     # bound to an object (``random.random``), or acting
        return _NOTHING
    if _frozen(value) is not UNFROZEN:
        return _GUARD
    return None


def _member_facts(owner, name, cls, depth):
    """What reading ``owner.name`` takes, ``owner`` a module or class global."""
    module = (owner.__name__ if isinstance(owner, types.ModuleType) else owner.__module__) or ""
    if name in _MUTATORS or name in _WRITING_FUNCTIONS:
        return None                         # ``list.append(self.kept, x)``, ``operator.setitem``
    if _trusted(module) or module.partition(".")[0] in sys.stdlib_module_names:
        if module == "numpy" and name == "random":
            return None                     # ``np.random``: draws at every call
        return _NOTHING
    member = vars(owner).get(name, _MISSING) if isinstance(owner, type) \
        else getattr(owner, name, _MISSING)
    if member is _MISSING:
        member = getattr(owner, name, None)
    if isinstance(member, (types.ModuleType, type)) and not _trusted(
            member.__name__ if isinstance(member, types.ModuleType) else member.__module__):
        return None                         # ``pkg.sub.VALUE``: read no further here
    found = _value_facts(_function_of(member), cls, depth)
    if found is _GUARD:
        return frozenset(), frozenset([(_Space(owner), name)])
    return found


class _Space:
    """Where a guarded value is read: an object's attributes, or a mapping
    (a module's globals); hashed by identity."""

    __slots__ = ("owner", "mapping")

    def __init__(self, owner, mapping=False):
        self.owner, self.mapping = owner, mapping

    def __hash__(self):
        return id(self.owner)

    def __eq__(self, other):
        return type(other) is _Space and other.owner is self.owner

    def get(self, name):
        value = self.owner.get(name) if self.mapping else getattr(self.owner, name, None)
        return _frozen(value)


class _ArrayShape(_Space):
    """The shape and dtype of an array attribute (``F.tile(h, reps=(self.slots.shape[0],
    1))``): its values are read by the operators given it."""

    __slots__ = ()

    def get(self, name):
        value = getattr(self.owner, name, None)
        if isinstance(value, NDArray):
            return ("array", value.shape, value.dtype)
        return _frozen(value)


class _Settings(_Space):
    """The settings of a block kept where ``trie.settings`` does not look (in a
    list attribute, not a registered child): not in the reader's token."""

    __slots__ = ()

    def get(self, name):
        return settings_form(self.owner)


class _Cell(_Space):
    """A closure cell's value."""

    __slots__ = ()

    def get(self, name):
        try:
            return _frozen(self.owner.cell_contents)
        except ValueError:
            return None


_MISSING = object()
UNFROZEN = object()     # a value no key can hold (a guard reading it: the code must run)
_PLAIN = (type(None), bool, int, float, str, bytes, np.generic)
_MAX_ARRAY = 4096       # elements of a numpy array read as a value, guarded by its bytes
# Items of a list, tuple, set or dict read as a value: a larger one (a vocabulary)
# would be copied at every call, which costs more than running the code.
_MAX_ITEMS = 256
_SEQUENCES = (list, tuple, set, frozenset, dict, collections.OrderedDict)


def _frozen(value, depth=0):
    """A hashable copy of a plain value (numbers, strings, enumeration members,
    and lists, tuples, named tuples, sets and dicts of them), or ``UNFROZEN``.

    Two values freeze alike only if code reading them computes alike: floats
    by their bits (``-0.0`` is not ``0.0``), containers in the order code
    iterating over them sees (a set's too), an enumeration member with its
    value and attributes."""
    if isinstance(value, (float, np.floating)):
        return exact(value)
    if isinstance(value, _PLAIN):
        return (type(value), value)
    if isinstance(value, enum.Enum):
        return _frozen_member(value, depth)
    if type(value) is np.ndarray and value.size <= _MAX_ARRAY and not value.dtype.hasobject:
        return (np.ndarray, value.shape, value.dtype.str, value.tobytes())  # a small table
    kind = type(value)
    if kind not in _SEQUENCES and not (isinstance(value, tuple) and hasattr(kind, "_fields")):
        return UNFROZEN                    # (a named tuple's fields are plain values)
    if depth > 4 or len(value) > _MAX_ITEMS:
        return UNFROZEN
    items = value.items() if isinstance(value, dict) else value
    found = tuple(_frozen(item, depth + 1) for item in items)
    return UNFROZEN if UNFROZEN in found else (kind, found)


def _frozen_member(member, depth):
    """An enumeration member with its value and its own attributes, frozen."""
    own = {name: item for name, item in vars(member).items() if not name.startswith("_")}
    found = (_frozen(member.value, depth + 1), _frozen(own, depth + 1))
    return UNFROZEN if UNFROZEN in found else (type(member), member.name) + found
