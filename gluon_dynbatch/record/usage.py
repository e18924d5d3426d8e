"""Whether a block's programs batch, and the switch to recording operator by operator.

Frames of a model whose structure is each sample's own (message passing
over each sample's graph) become programs that batch with nothing.  A
block's :class:`Usage` counts how its programs batched; when they do not,
the block's calls are recorded operator by operator instead, where
operators batch across samples by signature whatever the structure.

A block whose calls keep taking new paths through its code batch after
batch (each sample a graph of its own, written vertex by vertex) pays for
learning those paths at every call, however well its programs batch.  Such
a block is tried both ways for a few flushes (``note_learning``), and
recorded operator by operator from then on if that was clearly faster.  A
trial that kept frames is run again later if the calls go on learning (a
trial's timings can be misled by a busy machine), a few times at most.
"""
import logging

log = logging.getLogger(__name__)


#: Calls of a block that made new programs, at least 75% of its calls so far,
#: after which the block is recorded operator by operator (``Usage``).
FRESH_CALLS = 48
#: ``note_learning``, which starts a trial of recording a block operator by
#: operator:
#: - after ``LEARNING_WARMUP`` flushes of the block (its first included), when
#:   ``LEARNING_STRIKES`` flushes in a row learned ``LEARNING_STATES`` or more new
#:   template states a call (a new use of a block, such as decoding after
#:   training, learns in a flush or two, then replays); or when
#:   ``LEARNING_GAPPED`` more did so, each after at most one flush that learned
#:   nothing (a second scope over the same samples: an evaluation after
#:   training, run on every batch);
#: - without the warm-up, when that many flushes in a row (its first ones
#:   too) learned ``LEARNING_SEVERE`` or more (message passing written vertex by vertex learns
#:   a hundred and more in every flush; a seq2seq model as much in its first
#:   two, a path per sentence length, then replays).
#: The trial runs ``LEARNING_TRIAL`` flushes (alternately operator by operator
#: and as frames) and keeps recording operator by operator if that cost at most
#: ``LEARNING_GAIN`` of the frames' cost a call.
LEARNING_WARMUP = 3
LEARNING_STATES = 4.0
LEARNING_STRIKES = 3
LEARNING_GAPPED = 2
LEARNING_SEVERE = 64.0
LEARNING_TRIAL = 4
LEARNING_GAIN = 0.8
#: A trial decides as soon as both ways have run and one cost at most this
#: fraction of the other per call (each slow flush of a trial is a slow batch).
LEARNING_CLEAR = 0.5
#: Fewest calls of a block in a flush for the flush to count.
LEARNING_CALLS = 8
#: A trial that kept frames may have been misled (a machine busy with other
#: work during its flushes by operator): a block whose calls go on learning is
#: tried again, after ``LEARNING_RETRY`` times as many counted flushes as
#: trials so far, up to ``LEARNING_TRIALS`` trials in all.
LEARNING_RETRY = 8
LEARNING_TRIALS = 3


class Usage:
    """Whether a block's programs batch: one per block (and recursive helper),
    shared by its roots of every parameter version and autograd mode.

    Frames of a model whose structure is each sample's own (a graph's
    adjacency) become programs of their own, which batch with nothing.
    After two of three flushes in a row where the block's program steps held
    few nodes for the samples of the flush (``note_flush``), its calls are
    recorded operator by operator instead (``irregular``): operators batch
    across samples by signature whatever the structure.  The switch comes
    sooner, inside a scope, when almost every call of the block has made a
    program never seen before (``note_program``): each sample its own.
    """

    __slots__ = ("strikes", "irregular", "told", "frames", "fresh", "programs", "counters",
                 "op_calls", "watch", "name", "trial_ms")

    def __init__(self):
        self.strikes, self.irregular, self.told = 0, False, False
        self.frames = 0         # calls recorded as frames (``Frame`` counts them)
        self.fresh = 0          # of those, calls that made a program new to the block
        self.programs = set()   # uids of the programs of the block's recipes
        self.counters = []      # state counters of the block's trie roots (``trie.root``)
        self.op_calls = 0       # calls recorded operator by operator
        self.watch = None       # ``note_learning``'s record; "done" once decided
        self.name = ""          # the block's class, for the log
        self.trial_ms = None    # the trial's (by operator, as frames) ms a call

    def note_program(self, program):
        """A recipe of this block's was made with ``program`` (``templates.py``)."""
        if program.uid not in self.programs:
            self.programs.add(program.uid)
            self.fresh += 1
            if self.fresh >= FRESH_CALLS and self.fresh >= 0.75 * self.frames:
                self.irregular = True

    def note_flush(self, nodes, steps, samples):
        """Count a flush where this block's programs ran as ``nodes`` nodes in ``steps`` steps.

        Two of the last three flushes count: a sample that reads a value splits
        its calls into a part before the read, which batches (every sample's
        alike), and a part after it, a structure of each sample's own (experts
        picked by the value read), so good and bad flushes alternate.
        """
        mean = nodes / steps
        bad = nodes >= 32 and samples >= 8 and mean < min(4.0, samples / 8.0)
        self.strikes = ((self.strikes << 1) | bad) & 0b111     # the last three, as bits
        self.irregular = self.irregular or bin(self.strikes).count("1") >= 2

    # -- calls that keep learning ------------------------------------------------
    def states(self):
        """Template states the block's tries hold (every root, every version)."""
        return sum(counter[0] for counter in self.counters)

    def note_learning(self, flush_ms, mode):
        """Count a flush of ``flush_ms`` (recording, planning, running) run in
        ``mode`` (how its plan ran); try and decide whether the block's calls
        are cheaper recorded operator by operator.

        Flushes with few calls of the block add up until they have enough.  A
        trial compares flushes of one mode with each other only.  Returns True
        while a trial runs or when it has just decided.
        """
        watch = self.watch
        if watch == "done":
            return False
        calls = self.frames + self.op_calls
        if watch is None:           # the block's first flush: all its calls so far
            watch = self.watch = _new_watch(0, 0, (0, 0))
        if calls == watch["seen"]:          # none of its calls in this flush
            return watch["trial"] is not None
        watch["seen"] = calls
        trial = watch["trial"]
        if trial is not None:
            # Flushes run in different modes (a model run both ways, or
            # ``compiled=True`` choosing between its executors) are compared
            # with those of their own mode only.
            trial["op"], trial["frame"] = trial.setdefault("modes", {}).setdefault(mode, ([], []))
        watch["ms"] += flush_ms
        new_calls = calls - watch["mark"][0]
        if new_calls < LEARNING_CALLS:
            return watch["trial"] is not None
        states = self.states()
        learned = states - watch["mark"][1]
        ms_per_call, watch["ms"] = watch["ms"] / new_calls, 0.0
        watch["mark"] = (calls, states)
        if watch["trial"] is not None:
            return self._trial_flush(watch, ms_per_call)
        if self.irregular:                   # switched by how its programs batch
            self.watch = "done"
            return False
        watch["flushes"] += 1
        striking = learned >= LEARNING_STATES * new_calls
        watch["strikes"] = watch["strikes"] + 1 if striking else 0
        watch["severe"] = watch["severe"] + 1 if learned >= LEARNING_SEVERE * new_calls else 0
        # A row that one flush learning nothing may interrupt (a second scope
        # over the samples just recorded: an evaluation after training).
        idle = watch["idle"] = watch["idle"] + 1 if not learned else 0
        if idle != 1:
            watch["gapped"] = watch["gapped"] + 1 if striking else 0
        if watch["severe"] >= LEARNING_STRIKES and watch["flushes"] > 0 \
                or watch["flushes"] > LEARNING_WARMUP and (
                watch["strikes"] >= LEARNING_STRIKES
                or watch["gapped"] >= LEARNING_STRIKES + LEARNING_GAPPED):
            # This flush ran as frames and learned as the next ones would: it is
            # the trial's first flush as frames (one slow batch fewer).
            ops, frames = [], [ms_per_call]
            watch["trial"] = {"op": ops, "frame": frames, "modes": {mode: (ops, frames)}}
            self.irregular = self.told = True   # the trial's next flush: by operator
        return watch["trial"] is not None

    def _trial_flush(self, watch, ms_per_call):
        """Count a flush of the trial under the way it ran; run the next one the
        way fewer have run; decide once both ways have run ``LEARNING_TRIAL``
        flushes between them (or one way alone twice as many), or as soon as
        both have run and one is clearly cheaper (``LEARNING_CLEAR``).  Flushes
        of the mode of this one (``note_learning``), unless no mode has run
        both ways."""
        trial = watch["trial"]
        ops, frames = trial["op"], trial["frame"]
        # A flush meant to run as frames may have switched itself to operators
        # (its frames made programs of their own: ``note_program``).
        (ops if self.irregular else frames).append(ms_per_call)
        if not (ops and frames):
            # Flushes of each mode may all have run one way (the ways alternate,
            # and so may the modes): then every mode's flushes together.
            every = list(trial.get("modes", {}).values())
            pooled = ([x for way, _ in every for x in way], [x for _, way in every for x in way])
            if all(pooled) and len(pooled[0]) + len(pooled[1]) >= 2 * LEARNING_TRIAL:
                ops, frames = pooled
        done = len(ops) + len(frames)
        by_op = sum(ops) / len(ops) if ops else None
        by_frame = sum(frames) / len(frames) if frames else None
        clear = bool(ops and frames) and (by_op <= LEARNING_CLEAR * by_frame
                                          or by_frame <= LEARNING_CLEAR * by_op)
        if not clear and (done < LEARNING_TRIAL or (not (ops and frames)
                                                    and done < 2 * LEARNING_TRIAL)):
            self.irregular = len(ops) <= len(frames)
            return True
        self.irregular = self.told = by_frame is None or (
            by_op is not None and by_op < LEARNING_GAIN * by_frame)
        self.trial_ms = (by_op, by_frame)
        trials = watch.get("trials", 0) + 1
        if self.irregular or trials >= LEARNING_TRIALS:
            self.watch = "done"
        else:                       # kept frames: tried again if it goes on learning
            self.watch = _new_watch(trials, watch.get("seen", 0), watch.get("mark", (0, 0)))
        if self.irregular:
            log.info("%s: calls keep taking new paths through the code (a structure of each "
                     "sample's own); recorded operator by operator they cost %s us a call "
                     "against %s as templates: recording them operator by operator",
                     self.name, _us(by_op), _us(by_frame))
        return True


def _new_watch(trials, seen, mark):
    """``note_learning``'s record of a block after ``trials`` trials, its calls
    counted up to ``seen`` and ``mark`` (calls, template states): a new trial
    waits for ``LEARNING_RETRY`` counted flushes a trial so far first."""
    return {"flushes": -LEARNING_RETRY * trials, "strikes": 0, "severe": 0, "gapped": 0,
            "idle": 0, "trial": None, "ms": 0.0, "seen": seen, "mark": mark,
            "trials": trials}


def _us(ms):
    """Milliseconds as microseconds for the log (``None``: that way never ran)."""
    return "-" if ms is None else "%.1f" % (1000.0 * ms)
