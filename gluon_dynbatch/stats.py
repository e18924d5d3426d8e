"""Statistics of batching scopes, printable by users."""
from dataclasses import dataclass, fields


@dataclass
class BatchStats:
    """Counters and timings, summed over the flushes of a scope.

    Attributes
    ----------
    flushes : int
        Times the pending graph was planned and run.
    samples : int
        Top-level calls of DynBatchBlocks.
    nodes : int
        Operator calls recorded (including row views).
    steps : int
        Batched calls launched (one per step of the plans).
    planned_nodes : int
        Operator nodes that ran in those steps (dead code is dropped).
    record_ms, plan_ms, execute_ms : float
        Wall time recording (the user's forward code included), planning and
        executing (launching MXNet work; the engine may still be computing).
    """

    flushes: int = 0
    samples: int = 0
    nodes: int = 0
    steps: int = 0
    planned_nodes: int = 0
    record_ms: float = 0.0
    plan_ms: float = 0.0
    execute_ms: float = 0.0

    @property
    def mean_batch_size(self):
        """Planned nodes per launched step."""
        return self.planned_nodes / self.steps if self.steps else 0.0

    @property
    def us_per_node(self):
        """Recording time per recorded call, in microseconds."""
        return 1000.0 * self.record_ms / self.nodes if self.nodes else 0.0

    def add(self, other):
        """Add the counters of ``other`` into this object."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self):
        """The counters and derived figures as a plain dict."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["mean_batch_size"] = self.mean_batch_size
        out["us_per_node"] = self.us_per_node
        return out

    def __str__(self):
        return ("%d samples, %d nodes recorded -> %d steps (mean batch %.1f) in %d "
                "flush(es); record %.1f ms (%.2f us/node), plan %.1f ms, execute %.1f ms"
                % (self.samples, self.nodes, self.steps, self.mean_batch_size, self.flushes,
                   self.record_ms, self.us_per_node, self.plan_ms, self.execute_ms))
