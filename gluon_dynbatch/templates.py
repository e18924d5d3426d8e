"""Recipes: how the calls a frame recorded go into the graph.

A frame's segment (its calls from its start, or from its last cut) and the
positions it exports select a recipe, built once per template and reused by
every frame that takes the same path:

* :class:`ProgramRecipe`: the whole segment batches row by row, so it
  becomes ONE program node (``calls.py``).  Frames of different templates
  whose programs differ only in row counts share the program, so they batch
  together.
* :class:`OpsRecipe`: otherwise, one node per call, exactly as recorded.
"""
import weakref

from . import calls
from .graph import OP, known_node


def recipe_for(frame, positions):
    """The recipe of ``frame``'s current segment exporting ``positions``."""
    steps = frame.state.steps()
    produced = {}
    for j, step in enumerate(steps):
        for idx, pos in enumerate(step.outs):
            produced[pos] = (j, idx)
    entries, inputs, external = _entries(steps, produced, frame)
    outputs = (tuple, [("n",) + produced[pos] for pos in positions])
    shapes = [frame.out_shapes[ref] if type(ref) is int else ref[1].shape for ref in inputs]
    built = calls.build(tuple(entries), outputs, shapes, type(frame.block).__name__)
    if built is not None:
        return ProgramRecipe(built[0], built[1], inputs, external, len(steps))
    return OpsRecipe(steps, produced)


def _entries(steps, produced, frame):
    """Steps in the form ``calls.build`` reads: refs ``("a", k)`` to the k-th
    outside value or constant, ``("n", j, idx)`` to step outputs, ``("x", k)``
    to the k-th parameter."""
    inputs, where = [], {}
    external, named = [], {}
    entries = []
    for step in steps:
        refs = []
        for ref in step.refs:
            if type(ref) is int and ref in produced:
                refs.append(("n",) + produced[ref])
            elif type(ref) is int or ref[0] == "c":
                # Outside values and constants (a zero state may be row data)
                # are inputs of each call; parameters are shared by all.
                key = ref if type(ref) is int else id(ref[1])
                k = where.get(key)
                if k is None:
                    k = where[key] = len(inputs)
                    inputs.append(ref)
                refs.append(("a", k))
            else:
                k = named.get(id(ref[1]))
                if k is None:
                    k = named[id(ref[1])] = len(external)
                    external.append(ref)
                refs.append(("x", k))
        entries.append((step.op, step.args, step.kwargs, tuple(refs), step.info, step.path))
    return entries, inputs, tuple(external)


def _rebind(lazies, places):
    """Point provisional LazyArrays at their graph values ``(node, idx)``."""
    for lazy, (node, idx) in zip(lazies, places):
        lazy._node = node
        lazy._idx = idx
        outs = node.outs
        if outs is None:
            outs = node.outs = [None] * len(node.out_shapes)
        outs[idx] = weakref.ref(lazy)


def _leaf_value(rec, ref):
    """The graph value ``(node, 0)`` of a parameter or constant ref."""
    lazy = rec.param(ref[1]) if ref[0] == "p" else rec.leaf(ref[1])
    return (lazy._node, 0)


class ProgramRecipe:
    """The segment as one program node (see the module docstring)."""

    def __init__(self, op, info, inputs, external, num_calls):
        self.op = op
        self.info = info
        self.inputs = inputs            # per outside input: a frame position or ("c", array)
        self.external = external        # ("p", parameter) of each shared parameter
        self.num_calls = num_calls

    def apply(self, frame, alive):
        """Record the node for ``frame``; ``alive`` get its outputs, in order."""
        rec = frame.rec
        graph = rec.graph
        found = graph.externals.get(id(self))
        if found is None or found[0] is not self:
            external = [_leaf_value(rec, ref) for ref in self.external]
            sig = calls.shared_signature(self.info, external)
            found = graph.externals[id(self)] = (self, external, sig)
        vals = frame.vals
        arg_values = [rec.value_of(vals[ref]) if type(ref) is int else _leaf_value(rec, ref)
                      for ref in self.inputs]
        node = calls.make_node(rec, self.op, self.info, arg_values, found[1], frame.path,
                               found[2])
        _rebind(alive, [(node, k) for k in range(len(alive))])
        rec.num_calls += self.num_calls


class OpsRecipe:
    """The segment as one node per call, exactly as recorded."""

    def __init__(self, steps, produced):
        self.steps = steps
        self.produced = produced

    def apply(self, frame, alive):
        rec = frame.rec
        graph = rec.graph
        vals = frame.vals
        made = []
        for step in self.steps:
            inputs = []
            for ref in step.refs:
                if type(ref) is int:
                    where = self.produced.get(ref)
                    if where is not None:
                        inputs.append((made[where[0]], where[1]))
                    else:
                        inputs.append(rec.value_of(vals[ref]))      # read from outside
                else:
                    inputs.append(_leaf_value(rec, ref))
            node = known_node(graph, OP, step.op, inputs, step.args, step.kwargs, step.info,
                              frame.sample, frame.path + step.path)
            rec._place(node, step.info)  # pylint: disable=protected-access
            graph.nodes.append(node)
            made.append(node)
        rec.num_recorded += len(made)
        rec.num_calls += len(made)
        places = []
        for lazy in alive:
            j, idx = self.produced[lazy._idx]
            places.append((made[j], idx))
        _rebind(alive, places)
