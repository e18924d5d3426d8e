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


def _flat(out):
    return out if isinstance(out, (list, tuple)) else (out,)


def bases_made(frame, out, start, args):
    """How a replay of a call gives its outputs ``out`` the bases they have now:
    ``((output position, source), ...)`` with source ``("new", position)`` (a
    value the call made, from position ``start`` of ``frame``), ``("arg", k)``
    (its array argument ``k``) or ``("argbase", k)`` (that argument's base);
    None if no output has a base, False if a base is none of these."""
    found = []
    for lazy in _flat(out):
        base = base_of(lazy)
        if base is None or lazy._node is not frame or lazy._idx < start:
            continue                    # (an argument handed back keeps its own base)
        if base._node is frame and base._idx >= start:
            found.append((lazy._idx, ("new", base._idx)))
            continue
        for k, arg in enumerate(args):
            if arg is base:
                found.append((lazy._idx, ("arg", k)))
                break
            if base_of(arg) is base:
                found.append((lazy._idx, ("argbase", k)))
                break
        else:
            return False
    return tuple(found) or None


def replay_bases(frame, out, bases, args):
    """Give the outputs ``out`` of a replayed call the bases ``bases_made`` found."""
    wanted = dict(bases)
    made = {}
    for lazy in _flat(out):
        if type(lazy) is not LazyArray or lazy._node is not frame:
            continue
        source = wanted.get(lazy._idx)
        if source is None:
            continue
        kind, where = source
        if kind == "arg":
            base = args[where]
        elif kind == "argbase":
            base = base_of(args[where])
        else:
            base = made.get(where)
            if base is None:
                base = made[where] = frame.new_lazy(where)
                frame.lazies.append(base)
        note(frame.rec, lazy, base)
