"""Replay of traced child-block calls: trace once per call shape, then copy.

Tracing a child HybridBlock runs its Python ``hybrid_forward`` and records
every operator through the generic path.  The first call of a block with a
given *call shape* (input shapes and dtypes, structure of the non-array
arguments, its parameters, autograd's modes) is traced for real and captured
as a ``Template``: its operator nodes with their analysis (``CallInfo``) and
where each input comes from.  Later calls of the same shape copy the template
into the graph without running Python code of the block.

As with ``hybridize()``, this assumes ``hybrid_forward`` depends only on its
inputs and parameters, not on mutable attributes; ``batching(replay=False)``
turns it off.  Calls that read anything else (values recorded outside the
call, random constants) are never templated.
"""
from mxnet import nd

from . import calls
from .fuse import FusedOp, fuse_entries
from .graph import LEAF, OP, known_node
from .lazy import LazyArray

_SIMPLE = (int, float, str, bool, type(None))


# Helpers below are module functions, not nested closures: a recursive closure
# is a reference cycle, and it would keep a whole batch's nodes alive.

_FLAT = {}     # number of arguments -> structure of that many plain arrays


def flatten_args(args):
    """(arrays, structure) of nested lists/tuples; None if a leaf is not simple."""
    for a in args:
        if not isinstance(a, nd.NDArray):
            break
    else:                                   # only arrays: the common case
        structure = _FLAT.get(len(args))
        if structure is None:
            structure = _FLAT[len(args)] = _walk_args(tuple(args), [])
        return args, structure
    arrays = []
    structure = _walk_args(tuple(args), arrays)
    return (arrays, structure) if structure is not None else (None, None)


def _walk_args(obj, arrays):
    if isinstance(obj, nd.NDArray):
        arrays.append(obj)
        return ("A", len(arrays) - 1)
    if isinstance(obj, (list, tuple)):
        inner = tuple(_walk_args(o, arrays) for o in obj)
        return None if None in inner else (type(obj).__name__, inner)
    return ("C", obj) if isinstance(obj, _SIMPLE) else None


def block_version(block):
    """Identity of a block's parameters and their shapes and dtypes."""
    return tuple((id(p), p.shape, p.dtype) for p in block.collect_params().values())


class Template:
    """Operator nodes of one traced call, with where their inputs come from.

    ``entries`` hold ``(op, args, kwargs, refs, info, path)``; a ref is
    ``("a", k)`` the k-th array argument, ``("n", j, idx)`` output ``idx`` of
    entry ``j`` or ``("x", k)`` the k-th of ``external``, which are
    ``("p", parameter)`` or ``("c", array)`` (a constant).
    ``outputs`` mirrors the returned structure with refs in place of arrays.
    """

    __slots__ = ("entries", "outputs", "external", "fused", "call")

    def __init__(self, entries, outputs):
        self.outputs = outputs
        self.call = None          # (CallOp, calls.CallInfo) when recorded as one node
        # The parameters and constants the entries read, each listed once;
        # entries refer to them as ("x", position in ``external``).
        positions, external = {}, []
        rewritten = []
        for op, args, kwargs, refs, info, path in entries:
            new_refs = []
            for ref in refs:
                if ref[0] in ("p", "c"):
                    k = positions.get(id(ref[1]))
                    if k is None:
                        k = positions[id(ref[1])] = len(external)
                        external.append(ref)
                    ref = ("x", k)
                new_refs.append(ref)
            rewritten.append((op, args, kwargs, tuple(new_refs), info, path))
        self.entries = tuple(rewritten)
        self.external = tuple(external)
        self.fused = any(isinstance(entry[0], FusedOp) for entry in self.entries)


UNTEMPLATABLE = object()


def capture(graph, start, arg_values, out, prefix_len, constants, fuse=True,
            whole_calls=False, block_class=""):
    """A Template of nodes ``graph.nodes[start:]`` producing ``out``, or UNTEMPLATABLE.

    With ``whole_calls``, a template that batches row by row is replayed as one
    call node (``calls.py``); otherwise, with ``fuse``, runs of row-wise
    operators become fused entries (``fuse.py``).
    """
    where = {"local": {}, "args": {}, "constants": constants}
    for k, value in enumerate(arg_values):
        where["args"].setdefault(value, k)
    entries = []
    for node in graph.nodes[start:]:
        if node.kind == LEAF:
            continue
        refs = tuple(_ref_of(where, src, idx) for src, idx in node.inputs)
        if None in refs or node.info is None:
            return UNTEMPLATABLE
        where["local"][node] = len(entries)
        entries.append((node.op, node.args, node.kwargs, refs, node.info,
                        node.path[prefix_len:]))
    outputs = _map_out(where, out)
    if outputs is None:
        return UNTEMPLATABLE
    if whole_calls:
        template = Template(tuple(entries), outputs)
        shapes = [src.out_shapes[idx] for src, idx in arg_values]
        template.call = calls.build(template.entries, outputs, shapes, block_class)
        if template.call is not None:
            return template
    if fuse:
        entries, outputs = fuse_entries(entries, outputs)
    return Template(tuple(entries), outputs)


def _ref_of(where, src, idx):
    """How a template finds value ``(src, idx)``; None if it cannot."""
    position = where["args"].get((src, idx))
    if position is not None:
        return ("a", position)
    local = where["local"].get(src)
    if local is not None:
        return ("n", local, idx)
    if src.kind == LEAF:
        if src.param is not None:
            return ("p", src.param)
        if id(src.value) in where["constants"]:
            return ("c", src.value)
    return None


def _map_out(where, obj):
    if isinstance(obj, LazyArray):
        src = obj._node
        return None if src is None else _ref_of(where, src, obj._idx)
    if isinstance(obj, (list, tuple)):
        inner = [_map_out(where, o) for o in obj]
        return None if any(i is None for i in inner) else (type(obj), inner)
    return ("v", obj) if isinstance(obj, _SIMPLE) else None


def replay(rec, template, arg_values, path):
    """Copy ``template`` into ``rec``'s graph; return the call's outputs.

    This runs once per child-block call of every sample, so it is written for
    speed: parameters and constants are resolved once per call, not per node.
    """
    graph = rec.graph
    if graph.mode is None:
        graph.mode = rec.mode
    found = graph.externals.get(id(template))
    if found is None or found[0] is not template:
        external = _externals(rec, template)
        sig = calls.shared_signature(template.call[1], external) \
            if template.call is not None else None
        found = graph.externals[id(template)] = (template, external, sig)
    external = found[1]
    if template.call is not None:
        op, info = template.call
        node = calls.make_node(rec, op, info, arg_values, external, path, found[2])
        if info.out_kind is None:
            return _build(rec, info.outputs, arg_values, [node])
        return calls.outputs(node, info)
    made = []
    sample = rec.sample
    nodes = graph.nodes
    place = rec._place  # pylint: disable=protected-access
    for op, args, kwargs, refs, info, suffix in template.entries:
        inputs = []
        for ref in refs:
            kind = ref[0]
            if kind == "n":
                inputs.append((made[ref[1]], ref[2]))
            elif kind == "a":
                inputs.append(arg_values[ref[1]])
            else:
                inputs.append(external[ref[1]])
        node = known_node(graph, OP, op, inputs, args, kwargs, info, sample, path + suffix)
        place(node, info)
        nodes.append(node)
        made.append(node)
    rec.num_recorded += len(made)
    return _build(rec, template.outputs, arg_values, made)


def _externals(rec, template):
    """The graph's values of a template's parameters and constants (once per graph)."""
    external = []
    for kind, value in template.external:
        lazy = rec.param(value) if kind == "p" else rec.leaf(value)
        external.append((lazy._node, 0))
    return external


def _build(rec, obj, arg_values, made):
    """The outputs of a replayed call, from the template's output refs."""
    kind = obj[0]
    if kind == "v":
        return obj[1]
    if isinstance(kind, type):
        items = [_build(rec, o, arg_values, made) for o in obj[1]]
        return kind(items) if kind in (list, tuple) else kind(*items)
    if kind == "a":
        src, idx = arg_values[obj[1]]
    elif kind == "m":                 # output k of a call node
        src, idx = made[0], obj[1]
    elif kind == "n":
        src, idx = made[obj[1]], obj[2]
    else:
        return rec.param(obj[1]) if kind == "p" else rec.leaf(obj[1])
    if src.kind == LEAF:
        return rec.leaf(src.value) if src.param is None else rec.param(src.param)
    return src.output(idx)


def call_key(block, structure, values, version, mode, template_mode):
    """The call shape of a block call (hashable); ends with ``template_mode``'s
    two items (fuse, whole_calls).

    Besides shapes and dtypes it holds the aliasing of the array arguments
    (which positions pass the same value): a template traced where two
    arguments were one value must not serve calls where they differ.
    """
    # Shapes and dtypes from the recorded values (cheaper than LazyArray.shape).
    return (id(block), version, structure, aliasing(values),
            tuple([(src.out_shapes[i], src.out_dtypes[i]) for src, i in values]),
            mode, template_mode[0], template_mode[1])


def aliasing(values):
    """Per argument, the first position holding the same value (which arguments alias)."""
    first = {}
    return tuple([first.setdefault(v, k) for k, v in enumerate(values)])
