"""Whether a sample's call is made inside a ``try``/``except`` of its caller.

A top-level call whose sample waits at a read returns placeholders at once
(``tasks.Tasks.call``), and an error the sample raises later comes out when
the scope ends.  Eager code raises it at the call: a loop that skips bad
samples (``try: outs.append(model(x)) except ValueError: continue``) goes
on with the others.  Such a call is run to its end before it returns, so
its error comes out where the user catches it.  A ``try`` around the whole
scope is not one: it catches errors at the scope's end either way.

The handlers are read from the caller's code (Python's exception table),
once per call site.
"""
import dis

_SITES = {}         # (code, offset, the scope's entry in that code or None) -> bool
_MAX_SITES = 4096
_MAX_HOPS = 10


def caught_at(frame, entered):
    """Whether the call ``frame`` is making (``f_lasti``) is inside a ``try`` with
    an ``except`` in that frame's code that does not also hold ``entered``
    (``(code, offset)`` of the ``with gluon_dynbatch.batching()``, or None)."""
    code, offset = frame.f_code, frame.f_lasti
    scope_at = entered[1] if entered is not None and entered[0] is code else None
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
        found.append((entry.target, kind))
        if kind == "except" or offset is None:
            break
    return found


def _innermost(table, offset):
    """The exception table entry covering ``offset`` (Python keeps one per range)."""
    for entry in table:
        if entry.start <= offset < entry.end:
            return entry
    return None


def _handler(instructions, target):
    """``("except", None)`` if the handler at ``target`` catches (an ``except``
    clause, typed or bare); else ``("pass", offset)``: a ``with``'s exit or a
    ``finally``, whose re-raise at ``offset`` goes to the next handler."""
    ordered = sorted(instructions)
    start = ordered.index(target)
    first = instructions[target]
    following = instructions[ordered[start + 1]] if start + 1 < len(ordered) else None
    if first.opname == "PUSH_EXC_INFO" and following is not None:
        if following.opname == "POP_TOP":           # ``except:``
            return "except", None
        if following.opname == "WITH_EXCEPT_START":
            return "pass", following.offset
    for at in ordered[start:]:
        ins = instructions[at]
        if ins.opname == "CHECK_EXC_MATCH":         # ``except SomeError:``
            return "except", None
        if ins.opname == "RERAISE":
            return "pass", at
    return "pass", None
