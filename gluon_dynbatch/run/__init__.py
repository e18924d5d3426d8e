"""Running: a plan becomes batched MXNet calls, and the held values get their rows.

Enters: a plan and the live outputs (the LazyArrays users hold).
Leaves: every live LazyArray filled with its rows of the batched results,
with autograd history as ordinary MXNet calls.  ``lowering`` locates every
value as row segments and computes the gathers; ``executors`` run steps
imperatively, as one CachedOp per plan or one per step, kept in a
``cache``; ``choice`` picks among them by measured cost under
``compiled=True``; ``reference`` runs the graph node by node as recorded (the oracle
of the tests).
"""
