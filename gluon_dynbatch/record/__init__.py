"""Recording: the calls of many samples become a graph, without running them.

Enters: the user's calls inside a batching scope: ``DynBatchBlock`` calls and
child-block calls (``dispatch``), operators of the recording ``F`` and of
``mx.nd`` on pending values (``namespace``), LazyArray arithmetic, fluent
methods and indexing (``arithmetic``).
Leaves: nodes of the scope's graph (``ir.graph``) and LazyArrays standing for
their outputs.  A ``DynBatchBlock`` call is a frame (``frames``): its calls
follow a trie of templates learned once (``trie``), then become graph nodes
through the recipe ``templates`` makes; calls outside frames become nodes
directly (``recorder``).  Calls reach the recorder as written; the passes
of ``rewrite`` plug in through ``passes``.
"""
