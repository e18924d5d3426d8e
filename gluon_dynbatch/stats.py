"""Statistics of batching scopes, printable by users."""
from dataclasses import dataclass, field, fields


@dataclass
class BatchStats:
    """Counters and timings, summed over the flushes of a scope.

    Attributes
    ----------
    flushes : int
        Times the pending graph was planned and run.
    samples : int
        Top-level calls of DynBatchBlocks.
    reads : int
        Values read inside the scope: by samples, which wait at their reads
        (a flush serves all the reads of one round), and by the scope's own
        code (a flush each).
    eager_samples : int
        Of the samples, those run eagerly, not recorded, because reads kept
        flushing samples one at a time (see ``BatchingScope.read``).
    nodes : int
        Graph nodes recorded: operator and view nodes (a program node stands
        for many calls); leaves (inputs, parameters, constants) not counted.
    calls : int
        Operator calls recorded (including row views and the calls inside
        child blocks and programs).
    steps : int
        Batched calls launched (one per step of the plans).
    planned_nodes : int
        Operator nodes that ran in those steps (dead code is dropped).
    record_ms, plan_ms, execute_ms : float
        Wall time recording (the user's forward code included), planning (chains
        of additions rewritten, then steps chosen) and executing (launching
        MXNet work; the engine may still be computing).
    compile_ms : float
        Part of ``execute_ms`` spent building CachedOps for new plan shapes.
    cache_hits, cache_misses, evictions : int
        Plan-cache lookups of compiled flushes, and plans evicted by the LRU bound.
    planners : dict
        Flushes per planner whose plan ran (``"depth"``, ``"agenda"``, ...,
        ``"reference"``).
    reused_choices : int
        Flushes under an analysis budget whose planner was remembered from an
        earlier flush with the same plan structure (no search).
    """

    flushes: int = 0
    samples: int = 0
    reads: int = 0
    eager_samples: int = 0
    nodes: int = 0
    calls: int = 0
    steps: int = 0
    planned_nodes: int = 0
    record_ms: float = 0.0
    plan_ms: float = 0.0
    execute_ms: float = 0.0
    compile_ms: float = 0.0
    cache_hits: int = 0
    cache_misses: int = 0
    evictions: int = 0
    planners: dict = field(default_factory=dict)
    reused_choices: int = 0

    @property
    def mean_batch_size(self):
        """Planned nodes per launched step."""
        return self.planned_nodes / self.steps if self.steps else 0.0

    @property
    def us_per_node(self):
        """Recording time per graph node, in microseconds."""
        return 1000.0 * self.record_ms / self.nodes if self.nodes else 0.0

    @property
    def us_per_call(self):
        """Recording time per operator call, in microseconds (the user's code included)."""
        return 1000.0 * self.record_ms / self.calls if self.calls else 0.0

    @property
    def hit_rate(self):
        """Plan-cache hits per compiled flush (0 when nothing was compiled)."""
        lookups = self.cache_hits + self.cache_misses
        return self.cache_hits / lookups if lookups else 0.0

    def add(self, other):
        """Add the counters of ``other`` into this object."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, dict):
                merged = dict(mine)
                for key, count in theirs.items():
                    merged[key] = merged.get(key, 0) + count
                setattr(self, f.name, merged)
            else:
                setattr(self, f.name, mine + theirs)

    def as_dict(self):
        """The counters and derived figures as a plain dict."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["planners"] = dict(self.planners)
        out["mean_batch_size"] = self.mean_batch_size
        out["us_per_node"] = self.us_per_node
        out["us_per_call"] = self.us_per_call
        out["hit_rate"] = self.hit_rate
        return out

    def __str__(self):
        text = ("%d samples, %d calls in %d nodes -> %d steps (mean batch %.1f) in %d "
                "flush(es); record %.1f ms (%.2f us/call), plan %.1f ms, execute %.1f ms"
                % (self.samples, self.calls, self.nodes, self.steps, self.mean_batch_size,
                   self.flushes, self.record_ms, self.us_per_call, self.plan_ms,
                   self.execute_ms))
        if self.reads:
            text += "; %d value(s) read" % self.reads
        if self.eager_samples:
            text += ", %d sample(s) run eagerly" % self.eager_samples
        if self.cache_hits or self.cache_misses:
            text += "; plan cache %d hit(s), %d miss(es), compile %.1f ms" % (
                self.cache_hits, self.cache_misses, self.compile_ms)
        return text
