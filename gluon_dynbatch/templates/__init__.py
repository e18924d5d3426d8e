"""Templates: a frame's calls, learned once per path, become graph nodes.

Enters: the calls a frame recorded along its path through the trie (each
with its site in the user's code) and the positions it exports.
Leaves: a recipe, built once per template and applied to every frame that
takes the path: one program node for the whole frame where its calls batch
row by row (``programs``), after copies of a loop's body became calls on
stacked rows (``vectorize``); else programs of its runs and a node per call
(``recipes``).
"""
