"""The recorded graph and what a recorded call is: shared by every stage.

Enters: nothing; the stages build and read what this package defines.
Leaves: ``graph`` (nodes of leaves, operator calls and views, in creation
order), ``ops`` (operators by name, shape inference), ``calls`` (a call's
analysis, learned once per call shape), ``rules`` (the batching-rule protocol,
roles and the registry), ``known`` (values known before a graph runs).
"""
