"""Bases: a pending value recorded as a reshape of another remembers it.

A reshape keeps an array's elements in order.  A value ``r`` recorded as a
reshape of a pending value ``b`` remembers ``b`` as its *base* (the
LazyArray's ``_base`` slot), so that later calls on ``r`` can be recorded on
rows of ``b`` instead (``rewrite.reshapes``, ``rewrite.columns``).  Bases
live as long as the values that name them and are forgotten when a frame
hands its values to the graph (``Frame.based``), so they never keep a value
alive that nothing else reads; a replayed call gives its outputs the bases
its first trace gave them.
"""
from .context import MODE_CHANGES
from .lazy import LazyArray

# Operators that only reshape (``rewrite.reshapes`` sees through them).
RESHAPES = frozenset(["reshape", "Reshape", "expand_dims", "squeeze", "Flatten", "flatten"])


def base_of(x):
    """The pending value ``x`` reshapes, or None (also for anything but a LazyArray).

    A base noted under other autograd modes is not used.  A change of modes
    runs what is pending, so a base and its reshape are always recorded under
    the same modes; the check keeps it so should that ever change (rows of
    a value made under ``pause()`` pass no gradient back, rows of its base
    would).
    """
    found = x._base if type(x) is LazyArray else None
    if found is None or found[1] != MODE_CHANGES[0]:
        return None
    return found[0]


def note(rec, out, source):
    """Remember that ``out`` (a pending value just recorded) reshapes ``source``."""
    if type(out) is not LazyArray or type(source) is not LazyArray or out is source \
            or source._node is None:
        return out
    base = base_of(source)
    out._base = (base if base is not None else source, MODE_CHANGES[0])
    frame = rec.frame
    if frame is not None and out._node is frame:
        if frame.based is None:
            frame.based = []
        frame.based.append(out)
    return out


def forget_bases(frame):
    """Drop the bases of ``frame``'s values before their references are counted
    (``Frame.finish``, ``cut``): a base must not keep a value alive (exported
    from the frame) that nothing else reads."""
    for lazy in frame.based:
        lazy._base = None
    frame.based = None


def bases_made(frame, out, start):
    """``((output offset, base offset), ...)`` of the values ``out`` that a child
    block's call, traced from position ``start`` of ``frame``, returned as
    reshapes of its own values; None if it returned none.  Its replays
    (``Frame._replay``) give their outputs the same bases."""
    found = []
    for lazy in (out if isinstance(out, (list, tuple)) else (out,)):
        base = base_of(lazy)
        if base is not None and lazy._node is frame and base._node is frame \
                and base._idx >= start:
            found.append((lazy._idx - start, base._idx - start))
    return tuple(found) or None


def replay_bases(frame, out, bases, start):
    """Give the outputs ``out`` of a replayed call the bases ``bases_made`` found."""
    wanted = {start + o: start + b for o, b in bases}
    made = {}
    for lazy in (out if isinstance(out, (list, tuple)) else (out,)):
        if type(lazy) is LazyArray and lazy._node is frame and lazy._idx in wanted:
            pos = wanted[lazy._idx]
            base = made.get(pos)
            if base is None:
                base = made[pos] = frame._new_lazy(pos)  # pylint: disable=protected-access
                frame.lazies.append(base)
            note(frame.rec, lazy, base)
