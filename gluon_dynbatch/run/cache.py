"""The plan cache: compiled plans, LRU-bounded, shared safely between threads."""
import numbers
import threading
from collections import OrderedDict


class PlanCache:
    """Compiled plans keyed by everything that determines their graph.

    Parameters
    ----------
    max_plans : int
        Most plans kept; the least recently used one is evicted past that.
    """

    def __init__(self, max_plans=64):
        if isinstance(max_plans, bool) or not isinstance(max_plans, numbers.Integral) \
                or max_plans < 1:
            raise ValueError("max_cached_plans must be a whole number of at least 1, got %r"
                             % (max_plans,))
        self.max_plans = max_plans
        self._plans = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = self.evictions = 0

    def __getstate__(self):
        # A copy of a block (``copy.deepcopy``, ``pickle``) starts with no plans:
        # they hold MXNet handles, and the lock cannot be copied.
        return {"max_plans": self.max_plans}

    def __setstate__(self, state):
        self.__init__(state["max_plans"])

    def __len__(self):
        return len(self._plans)

    def get(self, key):
        """The entry for ``key`` or None; counts a hit or a miss."""
        with self._lock:
            entry = self._plans.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._plans.move_to_end(key)
            self.hits += 1
            return entry

    def put(self, key, entry):
        """Store ``entry``; returns how many plans were evicted."""
        with self._lock:
            self._plans[key] = entry
            self._plans.move_to_end(key)
            evicted = 0
            while len(self._plans) > self.max_plans:
                self._plans.popitem(last=False)
                evicted += 1
            self.evictions += evicted
            return evicted

    def clear(self):
        """Drop every plan (counters are kept)."""
        with self._lock:
            self._plans.clear()
