"""``Sketch``: a segment of a frame written as a program, as ``vectorize.py`` emits it.

Its entries are the program's calls (on stacked rows where calls were
grouped); its inputs are values read from outside the frame, its parameters
the weights, its exports the positions the frame hands on.  ``templates.py``
turns a plan into a program node (``programs.build``).
"""


class Sketch:
    """A segment as a program: entries, inputs and exports (see ``templates.py``).

    Attributes
    ----------
    entries : list
        ``(op, args, kwargs, refs, info, path)`` with refs ``("a", k)`` to
        input k, ``("n", j, idx)`` to entry outputs, ``("x", k)`` to
        parameter k.
    inputs : list
        Per input: ``("pos", p)`` (a frame position read from outside),
        ``("c", array)`` (a constant) or ``("view", specs)`` (those stacked
        along axis 0 by a view in the graph).
    params : list
        ``("p", parameter)`` per parameter.
    exports : list
        Per exported position, in order: ``(j, idx, rows)`` where rows is
        None (the whole output) or ``(start, stop)`` (a group member's rows).
    """

    def __init__(self):
        self.entries = []
        self.inputs = []
        self.params = []
        self.exports = []
        self._input_at = {}
        self._param_at = {}

    def input_ref(self, spec):
        if spec[0] == "view" and len(spec[1]) == 1:
            spec = spec[1][0]           # one value stacked is that value
        k = self._input_at.get(spec_key(spec))
        if k is None:
            k = self._input_at[spec_key(spec)] = len(self.inputs)
            self.inputs.append(spec)
        return ("a", k)

    def param_ref(self, ref):
        k = self._param_at.get(id(ref[1]))
        if k is None:
            k = self._param_at[id(ref[1])] = len(self.params)
            self.params.append(ref)
        return ("x", k)

    def add(self, entry):
        self.entries.append(entry)
        return len(self.entries) - 1


def spec_key(spec):
    """A hashable key of an input spec (constants by identity)."""
    if spec[0] == "view":
        return ("view", tuple(spec_key(s) for s in spec[1]))
    return (spec[0], id(spec[1])) if spec[0] == "c" else spec
