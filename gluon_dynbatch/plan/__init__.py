"""Planning: the graph's operator nodes grouped into batched steps.

Enters: the nodes a flush needs (the graph's creation order is topological),
each with its signature.
Leaves: a plan, the steps in execution order, each a set of nodes of one
signature.  Chains of additions become segment sums first (``sums``); the
planners (``planners``: depth, agenda, unbatched) run within an analysis
budget (``budget``).
"""
