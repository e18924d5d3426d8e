"""Operators: MXNet's callables by name, and the shapes and dtypes of their outputs.

An :class:`OpDef` names an operator reachable as ``mx.nd.<path>`` and
``mx.sym.<path>``.  Output shapes and dtypes are inferred once per (operator,
constant arguments, input shapes, input dtypes): row slices and row
concatenations, whose constants change with every call, here; the common
operators of ``shapes.py`` there; anything else by MXNet's symbolic inference.
"""
import ctypes
import inspect
import re
import threading
import warnings

import mxnet as mx
from mxnet.base import _LIB, MXNetError, OpHandle, c_str, check_call
import numpy as np

from . import shapes
from .graph import OP, Slot


def op_handle(name):
    """The ``OpHandle`` value of MXNet operator ``name``."""
    found = OpHandle()
    check_call(_LIB.NNGetOpHandle(c_str(name), ctypes.byref(found)))
    return found.value


class OpDef:
    """An MXNet operator reachable as ``mx.nd.<path>`` and ``mx.sym.<path>``."""

    __slots__ = ("name", "path", "nd_fn", "sym_fn", "arrays", "params", "typed",
                 "array_names")

    def __init__(self, path):
        self.path = path
        # Rules go by the last name (``contrib.div_sqrt_dim``, ``linalg.gemm2``),
        # but ``image``'s operators share names with others of their own
        # (``image.crop`` is no ``crop``, MXNet's ``slice``).
        self.name = path[-1] if path[0] != "image" else "image." + path[-1]
        self.nd_fn = _resolve(mx.nd, path)
        self.sym_fn = _resolve(mx.sym, path)
        self.arrays, self.params = _parameters(self.nd_fn)
        self.typed = _attribute_parsers(self.nd_fn)
        # Names of the array parameters (``lhs``, ``rhs``); None when there is none.
        self.array_names = frozenset(self.params[:self.arrays]) if self.arrays else None

    def parsed(self, kwargs):
        """``kwargs`` with attributes written as strings (``transpose_b="False"``,
        ``axis="(0,)"``) read as MXNet reads them: rules compare and branch on
        Python values (a copy; the same dict for an operator without such
        attributes)."""
        typed = self.typed
        if not typed:
            return kwargs
        out = dict(kwargs)
        for name, value in kwargs.items():
            parse = typed.get(name)
            if parse is not None and type(value) is str:
                out[name] = parse(value)
        return out

    def positional(self, args, kwargs):
        """``(args, kwargs)`` with arrays given by name (``F.dot(rhs=b, lhs=a)``,
        ``F.where(y=b, x=a, condition=c)``) moved to their places by position, in
        the operator's order, as far as arrays given reach without a gap (an
        optional array left out, such as ``bias``): rules and batched calls read
        a call's arrays by position."""
        moved = []
        for name in self.params[len(args):self.arrays]:
            if not isinstance(kwargs.get(name), mx.nd.NDArray):
                break
            moved.append(name)
        if not moved:
            return args, kwargs
        kwargs = dict(kwargs)
        return tuple(args) + tuple(kwargs.pop(name) for name in moved), kwargs

    def named(self, args, kwargs):
        """``(args, kwargs)`` with the non-array arguments given by position
        (``F.swapaxes(x, 0, 1)``, ``x.sum(1)``) moved to keywords, as rules read
        them; unchanged when an array follows one of them."""
        names = self.params
        if self.arrays is None:
            return args, kwargs
        for k in range(self.arrays, len(args)):
            if not isinstance(args[k], mx.nd.NDArray):
                break
        else:
            return args, kwargs
        if len(args) > len(names) \
                or any(isinstance(a, mx.nd.NDArray) for a in args[k + 1:]):
            return args, kwargs
        kwargs = dict(kwargs)
        for name, value in zip(names[k:], args[k:]):
            if name in kwargs:
                raise TypeError("%s() got multiple values for argument %r" % (self.name, name))
            kwargs[name] = value
        return args[:k], kwargs

    def __repr__(self):
        return "OpDef(%s)" % ".".join(self.path)


def positional(op, args, kwargs):
    """``op.positional(args, kwargs)`` for an operator that names its array
    parameters and is given one by keyword; ``(args, kwargs)`` otherwise (a
    pass's own operators)."""
    names = getattr(op, "array_names", None)
    if names is None or names.isdisjoint(kwargs):
        return args, kwargs
    return op.positional(args, kwargs)


def _parameters(fn):
    """(number of array parameters, names of positional parameters) of a generated
    ``mx.nd`` operator function; (None, ()) when it takes arrays variadically or
    is not a generated function."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None, ()
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None, ()
    names = tuple(p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD
                  and p.name not in ("out", "name"))
    arrays = 0
    for p in params:
        if p.name in ("out", "name") or p.default is not None:
            break
        arrays += 1
    return arrays, names


_PARAM_LINE = re.compile(r"^(\w+) : (.*?)(?:,\s*(?:optional|required).*)?$", re.M)


def _attribute_parsers(fn):
    """Attribute name -> parser of its string form, for the boolean and numeric
    attributes of a generated ``mx.nd`` operator (read from the parameter list
    MXNet writes into its docstring); None when it has none."""
    doc = getattr(fn, "__doc__", None) or ""
    if "Parameters\n----------" not in doc:
        return None
    body = doc.split("Parameters\n----------", 1)[1].split("Returns\n-------", 1)[0]
    parsers = {}
    for name, kind in _PARAM_LINE.findall(body):
        parse = _parser_of(kind)
        if parse is not None:
            parsers[name] = parse
    return parsers or None


def _parser_of(kind):
    """The parser of an attribute of MXNet's documented type ``kind``, or None."""
    optional = kind.endswith("or None")
    if kind.startswith("boolean"):
        parse = _parse_bool
    elif kind.startswith(("int", "long")):
        parse = _number_parser(_INT, int)
    elif kind.startswith(("float", "double")):
        parse = _number_parser(_FLOAT, float)
    elif kind.startswith(("Shape", "tuple of <int", "tuple of <long")):
        parse = _tuple_parser(_INT, int)
    elif kind.startswith(("tuple of <float", "tuple of <double")):
        parse = _tuple_parser(_FLOAT, float)
    else:
        return None
    if not optional:
        return parse
    return lambda text: None if text.strip() == "None" else parse(text)


# Numbers as dmlc reads them: space around, leading zeros; no sign "+", no "_"
# or hexadecimal, which MXNet refuses (its error then comes from the operator).
_INT = re.compile(r"^\s*-?\d+\s*$")
_FLOAT = re.compile(r"^\s*-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$|^\s*-?(inf|nan)\s*$",
                    re.IGNORECASE)


def _parse_bool(text):
    """A boolean attribute's string as dmlc parses it; the string itself if it
    is none of its forms (MXNet then raises its own error)."""
    word = text.lower()
    if word in ("true", "1"):
        return True
    if word in ("false", "0"):
        return False
    return text


def _number_parser(pattern, kind):
    def parse(text):
        return kind(text) if pattern.match(text) else text
    return parse


def _tuple_parser(pattern, kind):
    """A shape's or tuple's string (``"(0, 1)"``, ``"[0]"``, ``"(1, None)"``, or one
    number, read as that number) as Python values; the string itself if it is
    not one."""
    def parse(text):
        inner = text.strip()
        if pattern.match(inner):
            return kind(inner)
        if len(inner) < 2 or inner[0] + inner[-1] not in ("()", "[]"):
            return text
        items = [item.strip() for item in inner[1:-1].split(",")]
        if items and not items[-1]:
            items.pop()                     # "(1,)"
        if not all(item == "None" or pattern.match(item) for item in items):
            return text
        return tuple(None if item == "None" else kind(item) for item in items)
    return parse


def _resolve(module, path):
    obj = module
    for part in path:
        obj = getattr(obj, part)
    return obj


_OPDEFS = {}


def opdef(*path):
    """The cached OpDef of ``mx.nd.<path>``."""
    found = _OPDEFS.get(path)
    if found is None:
        found = _OPDEFS[path] = OpDef(path)
    return found


def hashable(value):
    if isinstance(value, (list, tuple)):
        return tuple(hashable(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.dtype) or isinstance(value, type):
        return np.dtype(value).name
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


MAX_INFERRED = 100000
"""Call shapes whose inferred outputs are kept (``_InferCache``): a server seeing
ever new input shapes starts over past it, rather than growing without bound."""


class _InferCache:
    """Output shapes and dtypes per (op, attributes, input shapes, dtypes)."""

    def __init__(self):
        self._cache = {}
        self._lock = threading.Lock()

    def infer(self, op, node, in_shapes, in_dtypes, attrs_key):
        key = (op.name, attrs_key, in_shapes, in_dtypes)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        result = _infer_rows_view(op, node, in_shapes, in_dtypes) \
            or shapes.infer(op, node, in_shapes, in_dtypes) \
            or _infer_symbolic(op, node, in_shapes, in_dtypes)
        if op.name == "where":
            _check_where(in_shapes)
        elif op.name in _ALONG_AN_AXIS:
            _check_axis(op.name, node.kwargs, in_shapes)
        if all(all(s > 0 for s in shape) for shape in in_shapes):
            with self._lock:
                if len(self._cache) >= MAX_INFERRED:
                    self._cache.clear()
                self._cache[key] = result
        return result


def _infer_rows_view(op, node, in_shapes, in_dtypes):
    """Shapes of axis-0 slices and concatenations, without MXNet; None otherwise.

    Their constant arguments differ per call (a word's row of an embedding
    table), so each new one would otherwise pay a symbolic inference.
    """
    if not in_shapes or any(not s or 0 in s for s in in_shapes) or node.args[1:]:
        return None
    if len(set(in_dtypes)) != 1 or not all(isinstance(a, Slot) for a in node.args):
        return None
    kwargs = node.kwargs
    if op.name == "slice_axis" and len(in_shapes) == 1 and kwargs.get("axis") == 0 \
            and set(kwargs) == {"axis", "begin", "end"}:
        rows = in_shapes[0][0]
        begin, end = kwargs["begin"], kwargs["end"]
        if not isinstance(begin, int) or not isinstance(end, (int, type(None))):
            return None
        if not -rows <= begin < rows or (end is not None and not -rows <= end <= rows):
            return None        # out of range: MXNet's inference raises its error
        start, stop, _ = slice(begin, end).indices(rows)
        if stop <= start:
            return None
        out = (stop - start,) + tuple(in_shapes[0][1:])
    elif op.name in ("concat", "Concat") and set(kwargs) <= {"dim", "num_args"} \
            and kwargs.get("dim", 1) == 0 and len(set(s[1:] for s in in_shapes)) == 1:
        out = (sum(s[0] for s in in_shapes),) + tuple(in_shapes[0][1:])
    else:
        return None
    return (out,), (in_dtypes[0],), tuple(tuple(s) for s in in_shapes)


def _check_where(in_shapes):
    """Refuse ``where`` of shapes eager MXNet refuses: its symbolic inference
    accepts them (a condition of another length), and its kernel then dies of
    a floating point exception."""
    if len(in_shapes) != 3 or not all(in_shapes):
        return
    cond, x, y = (tuple(s) for s in in_shapes)
    if x != y or cond != x and not (len(cond) == 1 and cond[0] == x[0]):
        raise MXNetError("where needs a condition of the shape of x and y, or of one "
                         "dimension as long as their first; got condition %s, x %s, y %s"
                         % (cond, x, y))


_ALONG_AN_AXIS = frozenset(("softmax", "log_softmax", "softmin"))


def _check_axis(name, kwargs, in_shapes):
    """Refuse a softmax along an axis its input does not have: MXNet's inference
    accepts it and its kernel refuses, after a batched step ran every sample's
    call (the others would then read values never written)."""
    axis = kwargs.get("axis", -1)
    if not in_shapes or not in_shapes[0] or type(axis) is not int:
        return
    ndim = len(in_shapes[0])
    if not -ndim <= axis < ndim:
        raise MXNetError("%s along axis %d of a value of %d axes, shape %s"
                         % (name, axis, ndim, tuple(in_shapes[0])))


class UnknownShape(ValueError):
    """MXNet's inference cannot give a call's output shapes from its input shapes:
    they depend on the data (``F.contrib.boolean_mask``)."""


def _infer_symbolic(op, node, in_shapes, in_dtypes):
    """Run MXNet's shape and type inference on a one-operator symbol."""
    names = ["x%d" % k for k in range(len(in_shapes))]
    syms = [mx.sym.var(n) for n in names]
    args = [syms[a.k] if isinstance(a, Slot) else a for a in node.args]
    kwargs = {k: (syms[v.k] if isinstance(v, Slot) else v) for k, v in node.kwargs.items()}
    args, kwargs = by_name(op, args, kwargs)
    sym = op.sym_fn(*args, **kwargs)
    missing = [n for n in sym.list_arguments() if n not in names]
    if missing:
        # MXNet's symbols make a variable of each input not given (a weight);
        # its arrays take no such default.
        raise ValueError("no array given for its input(s) %s" % ", ".join(
            n.rpartition("_")[2] for n in missing))
    known = {n: s for n, s in zip(names, in_shapes) if s and all(d > 0 for d in s)}
    with warnings.catch_warnings():     # shapes it cannot decide: UnknownShape below
        warnings.simplefilter("ignore", UserWarning)
        arg_shapes, out_shapes, aux_shapes = sym.infer_shape(**known)
    if out_shapes is None or any(s is None or 0 in s for s in out_shapes):
        raise UnknownShape("cannot infer output shapes from input shapes %s" % (in_shapes,))
    all_names = sym.list_arguments() + sym.list_auxiliary_states()
    all_shapes = dict(zip(all_names, list(arg_shapes) + list(aux_shapes)))
    _, out_types, _ = sym.infer_type(**dict(zip(names, in_dtypes)))
    if any(np.dtype(t).kind == "V" for t in out_types or ()):
        # (MXNet's Python names bfloat16 by a structured numpy dtype)
        raise TypeError("it gives bfloat16 values (MXNet's mixed precision on the CPU, "
                        "amp.init(target_dtype='bfloat16')), which a batching scope does "
                        "not take: run bfloat16 models eagerly, or in float32 or float16")
    out_dtypes = tuple(np.dtype(t).type for t in out_types)
    inferred_inputs = tuple(tuple(all_shapes.get(n, ())) for n in names)
    return tuple(tuple(s) for s in out_shapes), out_dtypes, inferred_inputs


INFER = _InferCache()


def by_name(op, args, kwargs):
    """``(args, kwargs)`` with array inputs whose place depends on other
    attributes given by name, as ``mx.sym`` composes only so: a fused GRU or
    RNN's sequence lengths follow its one state, where an LSTM's second
    state (``state_cell``) would be."""
    if op.name == "RNN" and len(args) == 4 and kwargs.get("use_sequence_length") \
            and kwargs.get("mode") != "lstm" and "sequence_length" not in kwargs:
        kwargs = dict(kwargs, sequence_length=args[3])
        args = args[:3]
    return args, kwargs


class Stand:
    """A value standing in as a node's output during a call's analysis."""

    __slots__ = ("out_shapes", "out_dtypes", "id", "param", "value", "kind", "depth")

    def __init__(self, shape, dtype, uid):
        self.out_shapes = (shape,)
        self.out_dtypes = (dtype,)
        self.id = -1 - uid
        self.param = self.value = None
        self.kind = OP
        self.depth = 0



def first_line(err):
    """The line of an MXNet error message worth showing."""
    text = str(err).strip()
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("Stack trace"):
            if "Check failed" in line or "Error" in line or len(text.splitlines()) == 1:
                return line[:300]
    return text.splitlines()[0][:300] if text else type(err).__name__
