"""Whether a sample's call is made inside a ``try``/``except`` of its caller's.

A top-level call whose sample waits at a read returns placeholders at once
(``tasks.Tasks.call``), and an error the sample raises later comes out when
the scope ends.  Eager code raises it at the call: a loop that skips bad
samples (``try: outs.append(model(x)) except ValueError: continue``) goes
on with the others.  Such a call is run to its end before it returns, so
its error comes out where the user catches it.  A ``try`` around the whole
scope is not one: it catches errors at the scope's end either way.

The handlers are read from the code of the caller and of the frames above
it up to the one that entered the scope (Python's exception table), once per
call site.
"""
import dis

_SITES = {}         # (code, offset, the scope's entry in that code or None) -> bool
_MAX_SITES = 4096
_MAX_HOPS = 10
#: Frames looked at above a call (helpers, comprehensions, lambdas between the
#: ``try`` and the call), and above the scope's ``__enter__``.
MAX_FRAMES = 12


def entry_frames(frame):
    """``id(frame) -> (code, offset)`` of ``frame`` (the one entering a scope)
    and the frames above it: where a ``try`` holds the scope itself."""
    found = {}
    for _ in range(MAX_FRAMES):
        if frame is None:
            break
        found[id(frame)] = (frame.f_code, frame.f_lasti)
        frame = frame.f_back
    return found


def caught_at(frame, entered):
    """Whether the call ``frame`` is making is inside a ``try`` with an ``except``
    of its own code or of a frame above it, below the scope (``entered``, from
    :func:`entry_frames`): a ``try`` in the frame that entered the scope counts
    only if it does not also hold the scope's ``with``."""
    for _ in range(MAX_FRAMES):
        if frame is None:
            return False
        code = frame.f_code
        mine = entered.get(id(frame)) if entered else None
        if mine is not None and mine[0] is code:    # the frame the scope is in: the last
            return _caught(code, frame.f_lasti, mine[1])
        if _caught(code, frame.f_lasti, None):
            return True
        frame = frame.f_back
    return False


def _caught(code, offset, scope_at):
    """``_catching``, memoised per call site."""
    key = (code, offset, scope_at)
    found = _SITES.get(key)
    if found is None:
        try:
            found = _catching(code, offset, scope_at)
        except Exception:  # pylint: disable=broad-except
            found = False               # code the reading does not know: as before
        if len(_SITES) < _MAX_SITES:
            _SITES[key] = found
    return found


def _catching(code, offset, scope_at):
    """Whether an error raised at ``offset`` of ``code`` is caught in ``code``, by
    a ``try`` that does not also hold ``scope_at`` (the scope's ``with``)."""
    table = dis._parse_exception_table(code)  # pylint: disable=protected-access
    instructions = {ins.offset: ins for ins in dis.get_instructions(code)}
    catching = _handlers(table, instructions, offset)[-1:]
    if not catching or catching[0][1] != "except":
        return False
    # A ``try`` that also holds the ``with`` of the scope catches at its end only.
    return scope_at is None or catching[0] not in _handlers(table, instructions, scope_at)


def _handlers(table, instructions, offset):
    """The handlers an error raised at ``offset`` goes through, innermost first,
    as ``(target, kind)``, up to the first that catches it."""
    found = []
    for _ in range(_MAX_HOPS):
        entry = _innermost(table, offset)
        if entry is None:
            break
        kind, offset = _handler(instructions, entry.target)
        if kind == "with" and _suppressing(instructions, entry.start):
            kind = "except"
        found.append((entry.target, kind))
        if kind == "except" or offset is None:
            break
    return found


def _suppressing(instructions, start):
    """Whether the ``with`` whose body starts at ``start`` is
    ``contextlib.suppress(...)`` (named in its statement), which catches."""
    ordered = sorted(at for at in instructions if at < start)
    for at in reversed(ordered[-40:]):
        ins = instructions[at]
        if ins.argval == "suppress" and ins.opname.startswith("LOAD_"):
            return True
        if ins.starts_line is not None and ins.opname != "BEFORE_WITH":
            return False
    return False


def _innermost(table, offset):
    """The exception table entry covering ``offset`` (Python keeps one per range)."""
    for entry in table:
        if entry.start <= offset < entry.end:
            return entry
    return None


def _handler(instructions, target):
    """``("except", None)`` if the handler at ``target`` catches (an ``except``
    clause, typed or bare); else ``("with", offset)`` or ``("pass", offset)``: a
    ``with``'s exit or a ``finally``, whose re-raise at ``offset`` goes to the
    next handler."""
    ordered = sorted(instructions)
    start = ordered.index(target)
    first = instructions[target]
    following = instructions[ordered[start + 1]] if start + 1 < len(ordered) else None
    if first.opname == "PUSH_EXC_INFO" and following is not None:
        if following.opname == "POP_TOP":           # ``except:``
            return "except", None
        if following.opname == "WITH_EXCEPT_START":
            return "with", following.offset
    for at in ordered[start:]:
        ins = instructions[at]
        if ins.opname in ("CHECK_EXC_MATCH", "CHECK_EG_MATCH"):    # ``except (*) Error:``
            return "except", None
        if ins.opname == "RERAISE":
            return "pass", at
    return "pass", None
