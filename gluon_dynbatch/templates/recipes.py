"""Recipes: how the calls a frame recorded go into the graph.

A frame's segment (its calls from its start, or from its last cut) and the
positions it exports select a recipe, built once per template and reused by
every frame that takes the same path:

* :class:`ProgramRecipe`: the segment batches row by row, so it becomes ONE
  program node (``programs.py``), after ``vectorize.py`` has turned the copies
  of a loop's body into calls on stacked rows.  Frames whose programs differ
  only in row counts (a node with 1 child or 5) share the program, so they
  batch together.  Values read from outside are the node's inputs (stacked
  by views in the graph where the program reads them stacked).
* :class:`OpsRecipe`: otherwise, one node per call, exactly as recorded.
"""
import copy
import weakref

from . import programs
from ..record import sites
from ..record import weights as weight_calls
from ..ir.graph import NO_KWARGS, OP, VIEW, analysed_node, slot
from ..record._core import apply_ops, apply_program, apply_recipe, bind_recipes
from ..record.lazy import LazyArray
from ..ir.ops import Stand, opdef
from ..ir.rules import SHARED
from .sketch import Sketch
from .vectorize import vectorize



def _concat():
    return opdef("concat")


def _slice_axis():
    return opdef("slice_axis")


def recipe_for(frame, positions):
    """The recipe of ``frame``'s current segment exporting ``positions``.

    Each iteration of a recurrent loop (``sites.structure``) becomes a part
    of its own, so the segment may be several nodes; parts pass values on
    through the graph.
    """
    steps = frame.state.steps()
    accumulating, segments = sites.structure(steps)
    accumulating = {id(steps[j]) for j in accumulating}
    if segments[-1] == segments[0]:
        return _recipe(steps, positions, frame, accumulating)
    groups = _hoisted(_by_segment(steps, segments), set(positions), accumulating)
    last_read = {}            # position -> the last group reading it
    for g, (mine, _) in enumerate(groups):
        for step in mine:
            for ref in step.refs:
                if type(ref) is int:
                    last_read[ref] = g
    parts = []
    before = (None, ())       # the previous iteration's operators and exports, relative
    for g, (mine, hoisted) in enumerate(groups):
        made = {pos for step in mine for pos in step.outs}
        wanted = made & (set(positions) | {pos for pos in made if last_read.get(pos, g) > g})
        if not hoisted:
            # A last iteration exports what the one before it did (the state
            # the next would read), so that iteration t of every sample, last
            # or not, shares one program; the extra outputs are dead.
            ops = tuple(step.op for step in mine)
            if ops == before[0]:
                wanted |= {mine[j].outs[k] for j, k in before[1]}
            relative = {pos: (j, k) for j, step in enumerate(mine)
                        for k, pos in enumerate(step.outs)}
            before = (ops, [relative[pos] for pos in wanted])
        wanted = sorted(wanted)
        parts.append((_recipe(mine, wanted, frame, accumulating), tuple(wanted)))
    return PartsRecipe(parts)


def _by_segment(steps, segments):
    """The steps of each segment, in order."""
    out = []
    for step, seg in zip(steps, segments):
        if out and out[-1][0] == seg:
            out[-1][1].append(step)
        else:
            out.append((seg, [step]))
    return [mine for _, mine in out]


def _hoisted(parts, exported, accumulating):
    """``(steps, hoisted)`` per part: before each iteration, the calls that
    make a value the frame exports from nothing of an earlier iteration (a
    word's vector memoised in a dict that other samples read) as a part of
    their own, so that readers elsewhere do not wait for the iteration's
    recurrence (the whole part's node) to be computed."""
    groups, earlier = [], set()
    for mine in parts:
        fresh, made = set(), set()  # made in this part: from no earlier part's value; all
        for step in mine:
            if all(type(ref) is not int or ref in fresh
                   or (ref not in earlier and ref not in made) for ref in step.refs):
                fresh.update(step.outs)
            made.update(step.outs)
        lift = _ancestors(mine, fresh & exported) if earlier else []
        if lift and len(lift) < len(mine) and all(
                weight_calls.deterministic(step.op) and id(step) not in accumulating
                for step in lift):
            chosen = {id(step) for step in lift}
            groups.append((lift, True))
            groups.append(([step for step in mine if id(step) not in chosen], False))
        else:
            groups.append((mine, False))
        earlier.update(pos for step in mine for pos in step.outs)
    return groups


def _ancestors(steps, targets):
    """The steps (in order) that make ``targets`` or what they read, within ``steps``."""
    needed, keep = set(targets), []
    for step in reversed(steps):
        if needed.isdisjoint(step.outs):
            continue
        keep.append(step)
        needed.update(ref for ref in step.refs if type(ref) is int)
    return keep[::-1]


def _recipe(steps, positions, frame, accumulating):
    """The recipe of ``steps`` exporting ``positions``: made once per block for
    calls that differ only in where their values are in the frame (iteration
    t of a sentence's loop after sentences of every length), then moved to
    the frame's positions (``relocated``)."""
    key, numbered = _canonical(steps, positions, frame, accumulating)
    if key is None:
        return _made(steps, positions, frame, accumulating)
    # Kept with the root's own recipes (a state's are keyed by positions alone).
    kept = frame.state.root().recipes
    found = kept.get(key)
    if found is None:
        recipe = _made(steps, positions, frame, accumulating)
        if len(kept) < MAX_RECIPES:
            kept[key] = (recipe, numbered, steps)
        return recipe
    recipe, first, first_steps = found
    where = dict(zip(first, numbered))
    by_step = {id(a): b for a, b in zip(first_steps, steps)}
    return relocated(recipe, where, by_step)


MAX_RECIPES = 4096      # recipes kept per template trie (``_recipe``)


def _canonical(steps, positions, frame, accumulating):
    """``(key, positions)``: the calls with positions numbered in order of
    appearance, with what a recipe reads of them (shapes of values read from
    outside, places in the code); the positions in that order.  ``(None,
    None)`` when a call has an unhashable constant."""
    number = {}
    order = []

    def num(pos):
        found = number.get(pos)
        if found is None:
            found = number[pos] = len(order)
            order.append(pos)
        return found

    items = []
    for step in steps:
        refs = []
        for ref in step.refs:
            if type(ref) is int:
                outside = ref not in number
                refs.append(num(ref))
                if outside:
                    refs.append((frame.out_shapes[ref], frame.out_dtypes[ref]))
            else:
                refs.append(ref)
        outs = tuple(num(pos) for pos in step.outs)
        call = None if step.call is None else num(step.call)
        items.append((step.op, step.args, tuple(sorted(step.kwargs.items())), tuple(refs),
                      outs, _info_key(step.info), step.site, call,
                      step.path, id(step) in accumulating))
    key = (tuple(items), tuple(num(pos) for pos in positions))
    try:
        hash(key)
    except TypeError:
        return None, None
    return key, order


def _info_key(info):
    """What a recipe reads of a call's analysis (``calls.CallInfo``)."""
    return (info.out_shapes, info.out_dtypes, info.attrs, id(info.rule), info.meta, info.kind,
            info.sig, info.shared_pos, info.cacheable, info.stateful, info.link, info.low)


def relocated(recipe, where, by_step):
    """``recipe`` reading its values at new positions (``where``: old -> new) and
    recording its calls as the corresponding steps (``by_step``: id(old) -> new)."""
    if isinstance(recipe, ProgramRecipe):
        return recipe.moved(where)
    if isinstance(recipe, OpsRecipe):
        return OpsRecipe([by_step[id(step)] for step in recipe.steps])
    return PartsRecipe([(relocated(r, where, by_step), tuple(where[p] for p in wanted))
                        for r, wanted in recipe.parts])


def _made(steps, positions, frame, accumulating):
    name = type(frame.block).__name__
    num_calls = len(steps)
    steps = _live(steps, positions)
    plan = vectorize(steps, positions, frame, accumulating)
    recipe = _program(plan, frame, name, num_calls)
    if recipe is None:
        recipe = _program(_plain(steps, positions), frame, name, num_calls)
    if recipe is None:
        recipe = _runs(steps, positions, frame, name)
    return recipe


def _live(steps, positions):
    """``steps`` without the deterministic ones whose outputs nothing reads (a
    reshape whose parts were read from its base, see ``reshapes.py``)."""
    needed = set(positions)
    keep = []
    for step in reversed(steps):
        if needed.isdisjoint(step.outs) and weight_calls.deterministic(step.op):
            continue
        keep.append(step)
        needed.update(ref for ref in step.refs if type(ref) is int)
    return steps if len(keep) == len(steps) else keep[::-1]


def _runs(steps, positions, frame, name):
    """A segment that is no program as a whole: runs of calls that batch row by
    row become programs, the calls between them nodes of their own (one part
    for all of them in a row: a part per call costs more).

    A run is contiguous (so convex); a call whose shared input (a weight) was
    computed in the current run starts a new one.
    """
    runs, current, made = [], [], set()
    for step in steps:
        kind = programs.entry_kind(step.op, step.info)
        shared = [step.refs[k] for k, role in enumerate(step.info.meta or ())
                  if role == SHARED]
        if kind is None or any(ref in made for ref in shared if type(ref) is int):
            if current:
                runs.append(current)
            current, made = [], set()
            if kind is None:
                runs.append([step])
                continue
        current.append(step)
        made.update(step.outs)
    if current:
        runs.append(current)
    runs = _join_singles(runs)
    if len(runs) == 1 and runs[0][1]:
        return OpsRecipe(steps)
    parts = []
    for k, (run, nodes) in enumerate(runs):
        later = {ref for other, _ in runs[k + 1:] for step in other for ref in step.refs
                 if type(ref) is int}
        outs = {pos for step in run for pos in step.outs}
        wanted = sorted(outs & (set(positions) | later))
        recipe = None if nodes else _program(_plain(run, wanted), frame, name, len(run))
        parts.append((recipe or OpsRecipe(run), tuple(wanted)))
    return PartsRecipe(parts)


def _join_singles(runs):
    """``(calls, as nodes)`` per run: runs of one call in a row joined into one
    run of a node per call; longer runs are programs where they can be, and so
    is a call of a Python number that may differ per sample (``s / len(words)``:
    a program batches calls of every number, a node only those of its own)."""
    out = []
    for run in runs:
        step = run[0]
        # (``x + 0``, Python's ``sum``, stays a node: sums.py joins such chains.)
        single = len(run) == 1 and (step.info.link or not programs.takes_number(
            step.op, step.args, step.kwargs, step.info))
        if single and out and out[-1][1]:
            out[-1][0].append(run[0])
        else:
            out.append((list(run), single))
    return out


class PartsRecipe:
    """A segment as several recipes in order (the iterations of a recurrent loop)."""

    def __init__(self, parts):
        self.parts = parts              # (recipe, exported positions)

    def apply(self, frame, alive):
        by_position = {lazy._idx: lazy for lazy in alive}
        vals = frame.vals
        new_lazy = frame.new_lazy       # (a pooled provisional LazyArray, made in C)
        for recipe, wanted in self.parts:
            # Values later parts read go to ``frame.vals``, as arrays read from outside.
            lazies = [by_position[pos] if pos in by_position else new_lazy(pos)
                      for pos in wanted]
            apply_recipe(frame, lazies, recipe)
            for pos, lazy in zip(wanted, lazies):
                vals[pos] = lazy


def _plain(steps, positions):
    """The segment as a program of its calls as recorded (no vectorizing)."""
    plan = Sketch()
    produced = {}
    for j, step in enumerate(steps):
        refs = []
        for ref in step.refs:
            if type(ref) is int and ref in produced:
                refs.append(("n",) + produced[ref])
            elif type(ref) is int:
                refs.append(plan.input_ref(("pos", ref)))
            elif ref[0] == "c":
                refs.append(plan.input_ref(ref))
            else:
                refs.append(plan.param_ref(ref))
        plan.add((step.op, step.args, step.kwargs, tuple(refs), step.info, step.path))
        for idx, pos in enumerate(step.outs):
            produced[pos] = (j, idx)
    plan.exports = [produced[pos] + (None,) for pos in positions]
    return plan


def _program(plan, frame, name, num_calls):
    """A :class:`ProgramRecipe` of ``plan``, or None if it does not batch row by row."""
    wanted = []
    for j, idx, _ in plan.exports:
        if (j, idx) not in wanted:
            wanted.append((j, idx))
    shapes = [_input_shape(spec, frame) for spec in plan.inputs]
    param_shapes = [_shape_of_param(ref, frame) for ref in plan.params]
    built = programs.build(tuple(plan.entries), wanted, shapes, name, param_shapes)
    if built is None:
        return None
    return ProgramRecipe(built[0], built[1], plan, wanted, frame, num_calls)


def _shape_of_param(ref, frame):
    """Shape of a template's parameter (``("p", Parameter)``) or constant, or ()."""
    if ref[0] == "p":
        return tuple(ref[1].shape)
    array = frame.rec.constant_ids.get(ref[1])
    return tuple(array.shape) if array is not None else ()


def _input_shape(spec, frame):
    kind = spec[0]
    if kind == "pos":
        return frame.out_shapes[spec[1]]
    if kind == "c":
        return tuple(spec[1].shape)
    shapes = [_input_shape(s, frame) for s in spec[1]]
    return (sum(s[0] for s in shapes),) + tuple(shapes[0][1:])


def _input_dtype(spec, frame):
    kind = spec[0]
    if kind == "pos":
        return frame.out_dtypes[spec[1]]
    if kind == "c":
        return spec[1].dtype
    return _input_dtype(spec[1][0], frame)


def _moved_spec(spec, where):
    kind = spec[0]
    if kind == "pos":
        return ("pos", where[spec[1]])
    if kind == "c":
        return spec
    return (kind, tuple(_moved_spec(s, where) for s in spec[1]))


# (signature, parameters) -> the first program recipe of that signature reading them
_ORIGINS = weakref.WeakValueDictionary()


def _origin(recipe):
    """The recipe whose external values in a graph ``recipe``'s are (graph.externals).

    Programs of one signature reading the same parameters have the same ones:
    iteration t of a loop over a sample's rows is a program of its own for
    every t and length (its slice's position is part of it), all of one
    signature; their copies reading other positions (``moved``) keep it.
    """
    sig = recipe.info.sig
    if sig is None:
        return recipe
    try:
        key = (sig, tuple([(ref[0], id(ref[1])) for ref in recipe.params]))
        found = _ORIGINS.get(key)
    except TypeError:           # an unhashable attribute: its own
        return recipe
    if found is not None and len(found.params) == len(recipe.params) and all(
            a[0] == b[0] and a[1] is b[1] for a, b in zip(found.params, recipe.params)):
        return found
    _ORIGINS[key] = recipe
    return recipe


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
    """The graph value ``(node, idx)`` of a parameter (or derived weight) or constant ref."""
    lazy = rec.param(ref[1]) if ref[0] == "p" else rec.leaf(ref[1])
    return (lazy._node, lazy._idx)


def _view_node(rec, frame, op, values, args, kwargs, info):
    """A view node of the graph (no step: its consumers gather its rows)."""
    graph = rec.graph
    node = analysed_node(graph, VIEW, op, values, args, kwargs, info, frame.sample, frame.path)
    depth = 0
    for src, _ in values:
        if src.depth > depth:
            depth = src.depth
    node.depth = depth
    graph.nodes.append(node)
    rec.num_recorded += 1
    return node


class ProgramRecipe:
    """The segment as one program node (see the module docstring)."""

    def __init__(self, op, info, plan, wanted, frame, num_calls):
        self.op = op
        # Whose calls these are (``usage.Usage``): programs are shared by blocks.
        info.usage = frame.state.root().usage
        info.usage.note_program(op)
        self.info = info
        self.num_calls = num_calls
        # calls.build orders the node's inputs: info.inputs are refs to the
        # plan's inputs ("a", k) and parameters ("x", k).
        self.inputs = plan.inputs
        self.params = tuple(plan.params)
        rec = frame.rec
        self.views = {}       # plan input k -> CallInfo of its stacking view
        for k, spec in enumerate(plan.inputs):
            if spec[0] == "view":
                sources = [(Stand(_input_shape(s, frame), _input_dtype(s, frame), n), 0)
                           for n, s in enumerate(spec[1])]
                args = tuple(slot(n) for n in range(len(sources)))
                self.views[k] = (args, rec.analyse_stub(_concat(), args, {"dim": 0}, sources))
        self.exports = []     # per exported position: (output index, slice view or None)
        exported = set()
        for j, idx, rows in plan.exports:
            out = wanted.index((j, idx))
            view = None
            if rows is None and out in exported:
                # Two values of the frame are one output (``F.concat(h, dim=0)``
                # and ``h``): the second is a view of all its rows, so that each
                # LazyArray has a node output of its own to be handed.
                rows = (0, info.out_shapes[out][0])
            exported.add(out)
            if rows is not None:
                shape = info.out_shapes[out]
                kwargs = {"axis": 0, "begin": rows[0], "end": rows[1]}
                source = (Stand(shape, info.out_dtypes[out], 0), 0)
                view = (kwargs, rec.analyse_stub(_slice_axis(), (slot(0),), kwargs, [source]))
            self.exports.append((out, view))
        # What every frame of the template does, ready to run (``apply``):
        # the node's inputs in order, from the plan's inputs ("a") or the
        # parameters ("x"); whether every input is a position and every
        # export a whole output.
        self.order = tuple((ref[0] == "a", ref[1]) for ref in info.inputs)
        self.positions = tuple(spec[1] for spec in plan.inputs) \
            if all(spec[0] == "pos" for spec in plan.inputs) else None
        self.sources = tuple(self._source(k, spec) for k, spec in enumerate(plan.inputs))
        self.whole = all(view is None for _, view in self.exports)
        self.origin = _origin(self)

    def apply(self, frame, alive):
        """Record the node for ``frame``; ``alive`` get their values, in order.

        This runs at the end of every frame: the common case (inputs read
        from outside as they are, whole outputs exported) is written out.
        """
        rec = frame.rec
        graph = rec.graph
        if graph.mode is None:          # the autograd modes the frame's calls ran under
            graph.mode = rec.mode
        origin = self.origin
        found = graph.externals.get(id(origin))
        if found is None or found[0] is not origin:
            external = [_leaf_value(rec, ref) for ref in self.params]
            sig = programs.shared_signature(self.info, external)
            # Values of weights alone (weight_calls.DerivedWeight) are steps too.
            below = max([src.depth for src, _ in external], default=0)
            found = graph.externals[id(origin)] = (origin, external, sig, below)
        external, sig = found[1], found[2]
        if sig is not None and self.whole:
            apply_program(frame, alive, self, found)      # the common case, compiled
            return
        if self.positions is not None:
            vals = frame.vals
            args = []
            for pos in self.positions:
                array = vals[pos]
                src = array._node if type(array) is LazyArray else None
                if src is not None and src.graph is graph:
                    args.append((src, array._idx))
                else:
                    args.append(rec.value_of(array))
        else:
            args = [self._input(rec, frame, k, spec) for k, spec in enumerate(self.inputs)]
        node = analysed_node(graph, OP, self.op,
                          [args[k] if from_arg else external[k] for from_arg, k in self.order],
                          (), NO_KWARGS, self.info, rec.sample, frame.path)
        if sig is None:
            rec.place(node, self.info)
        else:           # a call node: its depth from its arguments (leaves have 0)
            depth = found[3]
            for src, _ in args:
                if src.depth > depth:
                    depth = src.depth
            node.depth = depth + 1
            node.sig = sig
        graph.nodes.append(node)
        rec.num_recorded += 1
        rec.num_calls += self.num_calls
        if self.whole:
            outs = node.outs = [None] * len(self.info.out_shapes)
            for lazy, (out, _) in zip(alive, self.exports):
                lazy._node = node
                lazy._idx = out
                outs[out] = weakref.ref(lazy)
            return
        places = []
        for out, view in self.exports:
            if view is None:
                places.append((node, out))
            else:
                kwargs, info = view
                places.append((_view_node(rec, frame, _slice_axis(), [(node, out)],
                                          (slot(0),), kwargs, info), 0))
        _rebind(alive, places)

    def moved(self, where):
        """A copy reading its inputs at new positions (``where``: old -> new)."""
        out = copy.copy(self)
        out.inputs = tuple(_moved_spec(spec, where) for spec in self.inputs)
        if self.positions is not None:
            out.positions = tuple(where[pos] for pos in self.positions)
        out.sources = tuple(out._source(k, spec) for k, spec in enumerate(out.inputs))
        return out

    def _source(self, k, spec):
        """Where input ``k`` of the program comes from, as ``_core.apply_program``
        reads it."""
        kind = spec[0]
        if kind == "pos":
            return (0, spec[1])
        if kind == "c":
            return (1, lambda rec: _leaf_value(rec, spec))
        return (2, self.views[k], tuple(self._source(None, s) for s in spec[1]))

    def _input(self, rec, frame, k, spec):
        kind = spec[0]
        if kind == "pos":
            return rec.value_of(frame.vals[spec[1]])
        if kind == "c":
            return _leaf_value(rec, spec)
        values = [self._input(rec, frame, None, s) for s in spec[1]]
        args, info = self.views[k]
        return (_view_node(rec, frame, _concat(), values, args, {"dim": 0}, info), 0)


class OpsRecipe:
    """The segment as one node per call, exactly as recorded."""

    def __init__(self, steps):
        self.steps = steps
        self.produced = {}
        for j, step in enumerate(steps):
            for idx, pos in enumerate(step.outs):
                self.produced[pos] = (j, idx)

    def apply(self, frame, alive):
        """Record the calls for ``frame``; ``alive`` get their values, in order."""
        apply_ops(frame, alive, self)


bind_recipes(ProgramRecipe, OpsRecipe, _leaf_value)
