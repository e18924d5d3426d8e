"""Recursion that is not ``self(...)``: each call a frame of its own.

A frame is one call of a DynBatchBlock's ``hybrid_forward``; frames of the
same Python path share a template.  Users also recurse through

* helper methods, ``def encode(self, F, node)`` or ``encode(self, node)``
  calling itself (directly or through another helper): wrapped when the
  class is created;
* nested functions, ``def rec(node)`` inside ``hybrid_forward`` calling
  itself: each call of ``hybrid_forward`` makes a new closure, so the
  closure is wrapped while the call runs (``watch_closures``).

Without this the whole tree is one frame, a template of each tree's own
shape, learned at tens of microseconds per call.
"""
import functools
import inspect
import sys
import threading
import types

from . import context

# Recording a call nested in another takes up to this many times the frames
# (Python's, and C calls Python counts) that eager execution takes: a
# recursive helper or closure is its wrapper, the frame's set-up and the
# function, where eager runs the function alone.
FRAMES_PER_LEVEL = 4
# And this many beyond the deepest call: analysing a call, inferring shapes.
HEADROOM = 200
# Never raised past this many frames (unless the user's limit is higher): the
# compiled recording's calls take C stack the limit does not count, and a
# limit raised further let a deep recursion overflow it (a segfault where
# eager raises RecursionError).
MOST_FRAMES = 16000
_LIMIT_LOCK = threading.Lock()
_RAISED = [0, None]     # top-level calls recording, and the limit before the first

# Generators and coroutines run their bodies after the call returns.
_LAZY_BODIES = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def recursive_helpers(methods):
    """Names of the recursive helpers among ``methods`` (a class's namespace):
    plain functions taking ``self`` that call themselves by name, directly or
    through other such helpers.

    ``def encode(self, F, node)`` (or ``encode(self, node)``, calling child
    blocks and fluent methods) recursing over a tree from ``hybrid_forward``
    records each node as ``self(child)`` would: as a frame of its own, so that
    the nodes of every tree share templates.  Inside a scope a helper without
    operators costs a frame per call and changes nothing else.
    """
    helpers = {name: value.__code__ for name, value in methods.items()
               if isinstance(value, types.FunctionType) and not name.startswith("__")
               and name not in ("hybrid_forward", "forward")
               and not value.__code__.co_flags & _LAZY_BODIES
               and value.__code__.co_argcount >= 1}
    calls = {name: {other for other in helpers if _names_in(code, other)}
             for name, code in helpers.items()}
    return {name for name in helpers if name in _reachable(calls, name)}


def recursive_closures(function):
    """Code objects of the functions nested in ``function`` that call themselves
    through their own closure (``def rec(node): ... rec(child)``)."""
    found = set()
    todo = [c for c in function.__code__.co_consts if isinstance(c, types.CodeType)]
    while todo:
        code = todo.pop()
        todo.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
        if not code.co_flags & _LAZY_BODIES and code.co_name in code.co_freevars:
            found.add(code)
    return frozenset(found)


def _reachable(calls, start):
    """Names reachable from ``start`` in one or more calls."""
    seen, todo = set(), list(calls[start])
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(calls[name])
    return seen


def _names_in(code, name):
    """Whether ``code`` or a code object nested in it (a comprehension) names ``name``."""
    if name in code.co_names:
        return True
    return any(isinstance(const, types.CodeType) and _names_in(const, name)
               for const in code.co_consts)


def helper_frames(function, block=None):
    """``function`` recording each call as a frame inside a scope: a recursive
    helper method (its block is its ``self``), or a closure of ``block``."""
    @functools.wraps(function)
    def helper(*args, **kwargs):
        rec = context.TLS.recorder
        if rec is None or rec.depth == 0 or rec.eager or not rec.frames_on():
            return function(*args, **kwargs)
        owner = args[0] if block is None else block
        return owner._record_helper(rec, function, args, kwargs)  # pylint: disable=W0212
    return helper


def watch_closures(block, codes):
    """Wrap each recursive closure of ``codes`` that ``block``'s running call
    creates, at its first call; the tracer to pass to ``stop_watching``.

    The closure refers to itself through a cell; the tracer (``sys.settrace``,
    until every closure is wrapped or the call returns) puts the wrapped
    closure in that cell, so the recursive calls are frames.  The first call,
    already running, stays in the enclosing frame.  Nothing is watched when
    another tracer (a debugger, coverage) is set.
    """
    if sys.gettrace() is not None:
        return None
    pending = set(codes)

    def tracer(frame, event, arg):
        code = frame.f_code
        if event == "call" and code in pending:
            pending.discard(code)
            _wrap_in_cell(block, frame, code.co_name)
            if not pending:
                sys.settrace(None)
        return None

    sys.settrace(tracer)
    return tracer


def stop_watching(tracer):
    """Remove ``tracer`` (from ``watch_closures``) if it is still set."""
    if tracer is not None and sys.gettrace() is tracer:
        sys.settrace(None)


def _wrap_in_cell(block, frame, name):
    locals_ = frame.f_locals        # the frame's free variables too
    function = locals_.get(name)
    if not isinstance(function, types.FunctionType) or function.__code__ is not frame.f_code:
        return
    cell = function.__closure__[function.__code__.co_freevars.index(name)]
    wrapped = helper_frames(function, block)
    cell.cell_contents = wrapped
    # The tracer's caller writes ``f_locals`` back into the frame's cells.
    locals_[name] = wrapped


def raise_limit():
    """Raise Python's recursion limit while a top-level call records, so that
    models as deep as eager execution allows record too (``restore_limit``
    puts it back when the last such call ends)."""
    with _LIMIT_LOCK:
        if not _RAISED[0]:
            _RAISED[1] = limit = sys.getrecursionlimit()
            sys.setrecursionlimit(max(limit, min(limit * FRAMES_PER_LEVEL + HEADROOM,
                                                 MOST_FRAMES)))
        _RAISED[0] += 1


def restore_limit():
    """Undo one ``raise_limit``."""
    with _LIMIT_LOCK:
        _RAISED[0] -= 1
        if not _RAISED[0]:
            try:
                sys.setrecursionlimit(_RAISED[1])
            except RecursionError:      # called deeper than the old limit: keep it raised
                pass


def recursion_note(where):
    """What to add to a RecursionError raised while recording ``where``: short,
    with the limit eager execution has."""
    return ("gluon_dynbatch: Python's recursion limit was reached while recording %s "
            "(recording allows %d times the limit of %d that eager execution has); "
            "sys.setrecursionlimit raises it" % (where, FRAMES_PER_LEVEL, _RAISED[1]
                                                  or sys.getrecursionlimit()))
