"""Whether a block's programs batch, and the switch to recording operator by operator.

Frames of a model whose structure is each sample's own (message passing
over each sample's graph) become programs that batch with nothing.  A
block's :class:`Usage` counts how its programs batched; when they do not,
the block's calls are recorded operator by operator instead, where
operators batch across samples by signature whatever the structure.
"""


#: Calls of a block that made new programs, at least 75% of its calls so far,
#: after which the block is recorded operator by operator (``Usage``).
FRESH_CALLS = 48


class Usage:
    """Whether a block's programs batch: one per block (and recursive helper),
    shared by its roots of every parameter version and autograd mode.

    Frames of a model whose structure is each sample's own (a graph's
    adjacency) become programs of their own, which batch with nothing.
    After two flushes in a row where the block's program steps held few
    nodes for the samples of the flush (``note_flush``), its calls are
    recorded operator by operator instead (``irregular``): operators batch
    across samples by signature whatever the structure.  The switch comes
    sooner, inside a scope, when almost every call of the block has made a
    program never seen before (``note_program``): each sample its own.
    """

    __slots__ = ("strikes", "irregular", "told", "frames", "fresh", "programs")

    def __init__(self):
        self.strikes, self.irregular, self.told = 0, False, False
        self.frames = 0         # calls recorded as frames (``Frame`` counts them)
        self.fresh = 0          # of those, calls that made a program new to the block
        self.programs = set()   # uids of the programs of the block's recipes

    def note_program(self, program):
        """A recipe of this block's was made with ``program`` (``templates.py``)."""
        if program.uid not in self.programs:
            self.programs.add(program.uid)
            self.fresh += 1
            if self.fresh >= FRESH_CALLS and self.fresh >= 0.75 * self.frames:
                self.irregular = True

    def note_flush(self, nodes, steps, samples):
        """Count a flush where this block's programs ran as ``nodes`` nodes in ``steps`` steps."""
        mean = nodes / steps
        if nodes >= 32 and samples >= 8 and mean < min(4.0, samples / 8.0):
            self.strikes += 1
            self.irregular = self.irregular or self.strikes >= 2
        else:
            self.strikes = 0
