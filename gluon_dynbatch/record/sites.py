"""Call sites: where in the user's code a recorded call was made, and in which loop.

A template is a flat list of calls, but the code that made it has loops: over
a node's children (their iterations independent, but for sums they
accumulate) or over a sentence's tokens (each iteration reading the last).
The passes over a template (``vectorize.py``, ``templates.py``) treat the two
differently, so each call learned by a frame keeps its *site*: the code
object and bytecode offset of every frame of the user's code between the
block's ``hybrid_forward`` and the call.  Sites are read when a call is
learned, never when a known one is matched.

Loops are found in the bytecode (a backward jump closes one), so a loop that
ran once is still a loop; iterations are counted by the offset going back.
"""
import dis
import os
import sys

import mxnet
from mxnet.gluon.rnn import rnn_cell

from ..ir.calls import ADDS, scalar_argument

_LIBRARIES = (os.path.dirname(os.path.abspath(__file__)),
              os.path.dirname(os.path.abspath(mxnet.__file__)))
# Gluon's ``unroll`` methods loop over tokens for the user: their loops count.
_UNROLLS = frozenset(cls.unroll.__code__ for cls in vars(rnn_cell).values()
                     if isinstance(cls, type) and hasattr(cls, "unroll"))
_USER_CODE = {}      # code object -> whether it is the user's (not a library's)
_LOOPS = {}          # code object -> ((start, end), ...) of its loops


def _is_users(code):
    found = _USER_CODE.get(code)
    if found is None:
        path = os.path.abspath(code.co_filename)
        found = _USER_CODE[code] = code in _UNROLLS or not path.startswith(_LIBRARIES)
    return found


def capture(stop):
    """The site of the call being recorded: ``((code, offset), ...)``, outermost first.

    ``stop`` is the id of the Python frame that called the block's
    ``hybrid_forward``; frames of gluon_dynbatch and MXNet are left out.
    Returns None when the call was not made below that frame.
    """
    frame = sys._getframe(1)  # pylint: disable=protected-access
    site = []
    while frame is not None:
        back = frame.f_back
        code = frame.f_code
        if _is_users(code):
            site.append((code, frame.f_lasti))
        if back is not None and id(back) == stop:
            site.reverse()
            return tuple(site)
        frame = back
    return None


def loops(code):
    """The loops of ``code`` as bytecode ranges ``(start, end)``."""
    found = _LOOPS.get(code)
    if found is None:
        ranges = []
        for ins in dis.get_instructions(code):
            if "JUMP" in ins.opname and isinstance(ins.argval, int) \
                    and ins.argval < ins.offset:
                ranges.append((ins.argval, ins.offset))
        # Outer loops first: by start, then the longer one.
        found = _LOOPS[code] = tuple(sorted(set(ranges), key=lambda r: (r[0], -r[1])))
    return found


def _jumped_back(ranges, loop_range, previous, offset, call):
    """Whether going from ``previous`` (an offset and a call) to ``offset`` in
    ``call`` starts a new iteration of ``loop_range`` (not merely of a loop
    nested in it).  Operators of one child-block call share its offset."""
    previous, previous_call = previous
    if offset > previous or (offset == previous and call == previous_call):
        return False
    start, end = loop_range
    for inner in ranges:
        if inner != loop_range and start <= inner[0] and inner[1] <= end \
                and inner[0] <= offset <= inner[1] and inner[0] <= previous <= inner[1]:
            return False
    return True


def _inside_one_call(site, before, level):
    """Whether going from site ``before`` to ``site``, both at one instruction of
    ``level``, happened inside one call made there (a helper function or a
    comprehension going on, or going round a loop of its own), not by
    running that instruction again.  A frame that is the same instruction in
    both, outside that code's loops (a library rewrite recording several
    operators for one call of the user's, each at a line of its own), says
    nothing: the next frame does."""
    deeper = level + 1
    while deeper < len(site) and deeper < len(before) and site[deeper] == before[deeper]:
        code, offset = site[deeper]
        if any(start <= offset <= end for start, end in loops(code)):
            return True         # that instruction again in a loop of its code (``sum(...)``)
        deeper += 1
    if deeper >= len(site) or deeper >= len(before) or site[deeper][0] is not before[deeper][0]:
        return False
    code, offset = site[deeper]
    offset_before = before[deeper][1]
    return offset > offset_before or any(
        start <= offset <= end and start <= offset_before <= end for start, end in loops(code))


def iterations(sites, calls=None):
    """Per call, the loops it ran in, each as ``(loop, iteration)``, outermost first.

    ``loop`` is a number naming one run of a loop (its code, range, and the
    calls and iterations around it); ``iteration`` counts from 0.  A call of no known
    site is in no loop.  ``calls`` numbers the calls: consecutive operators
    of one number come from one child-block call, at one site in one
    iteration (by default every call is a call of its own).
    """
    out = []
    last = {}                 # loop -> (offset, number, site) of its previous call
    count = {}                # loop -> current iteration
    # Loops and the runs of loops around them are numbered, so a key holds its
    # outer loops as one number: as nested tuples, a key would double in size
    # with each loop around it (recursion through a helper function nests a
    # child's loop inside its parent's), and so would the time to hash it.
    loop_ids = {}             # (around, prefix, code, start) -> loop
    around_ids = {}           # (around, loop, iteration) -> around (0: no loop)
    if calls is None:
        calls = range(len(sites))
    for site, call in zip(sites, calls):
        if site is None:
            out.append(())
            continue
        where = []
        around = 0
        for level, prefix, code, offset, start, end, ranges in _enclosing(site):
            key = (around, prefix, code, start)
            loop = loop_ids.get(key)
            if loop is None:
                loop = loop_ids[key] = len(loop_ids)
            previous = last.get(loop)
            if previous is None:
                count[loop] = 0
            elif _jumped_back(ranges, (start, end), previous[:2], offset, call) \
                    and not (offset == previous[0]
                             and _inside_one_call(site, previous[2], level)):
                count[loop] += 1
            last[loop] = (offset, call, site)
            where.append((loop, count[loop]))
            link = (around, loop, count[loop])
            around = around_ids.get(link)
            if around is None:
                around = around_ids[link] = len(around_ids) + 1
        out.append(tuple(where))
    return out


_ENCLOSING = {}     # site -> the loops around it (``_enclosing``)


def _enclosing(site):
    """The loops a call at ``site`` is in, outermost first, each as ``(level,
    site[:level], code, offset, start, end, the code's loops)``; kept per site."""
    found = _ENCLOSING.get(site)
    if found is None:
        found = []
        for level, (code, offset) in enumerate(site):
            ranges = loops(code)
            for start, end in ranges:
                if start <= offset <= end:
                    found.append((level, site[:level], code, offset, start, end, ranges))
        found = tuple(found)
        if len(_ENCLOSING) < 100000:
            _ENCLOSING[site] = found
    return found


def _add_like(step):
    """A one-row addition of two values of its output's shape (an accumulation's step),
    or ``0 + x``: the first step of ``total = 0`` followed by ``total = total + x``."""
    info = step.info
    name = step.op.name
    if name == "_plus_scalar":
        adds = scalar_argument(step) == 0 and len(step.refs) == 1 and type(step.refs[0]) is int
    else:
        adds = len(step.refs) == 2 and name in ADDS
    return adds and len(info.out_shapes) == 1 and info.out_shapes[0][:1] == (1,)


def structure(steps):
    """How a segment's loops shape it: ``(accumulating, segments)``.

    ``accumulating`` holds the additions that carry a sum across a loop's
    iterations (``c = c + f_k * c_k``): one term comes from before the
    iteration, the other from it, and the result is read only after it.
    That holds even when the loop ran once, so such a sum over one child is
    recognised as one over several.

    ``segments`` gives each step's segment: a loop whose iterations read
    values of earlier iterations (other than through such sums) is
    *recurrent* (a sentence's tokens), and each of its iterations is a
    segment of its own, so that iteration t of every sample batches with
    iteration t of the others whatever the samples' lengths.  Steps outside
    recurrent loops stay together.
    """
    its = iterations([step.site for step in steps], [step.call for step in steps])
    producer, home = {}, {}
    for j, step in enumerate(steps):
        for pos in step.outs:
            producer[pos] = j
        for ref in step.refs:
            if type(ref) is int and ref not in producer and ref not in home:
                home[ref] = its[j]          # read from outside for the first time here
    for pos, j in producer.items():
        home[pos] = its[j]
    readers = {}
    for j, step in enumerate(steps):
        for ref in step.refs:
            if type(ref) is int:
                readers.setdefault(ref, []).append(j)
    accumulating = set()
    for j, step in enumerate(steps):
        if its[j] and _add_like(step) and j not in accumulating:
            accumulating.update(_accumulates(its[j][-1], j, steps, home, readers, its,
                                             producer))
    recurrent = set()
    for j, step in enumerate(steps):
        for ref in step.refs:
            k = producer.get(ref) if type(ref) is int else None
            if k is None or (j in accumulating and k in accumulating):
                continue
            for loop, iteration in its[j]:
                for other, before in its[k]:
                    if other == loop and before < iteration:
                        recurrent.add(loop)
    # Loops whose iterations call a child block of several operators (a cell).
    cells = {loop for j, step in enumerate(steps) if step.call != step.outs[0]
             for loop, _ in its[j]}
    return accumulating, _segments(its, recurrent, cells)


def _accumulates(where, j, steps, home, readers, its, producer):
    """The additions that carry a sum from step ``j`` (in ``where``, its
    innermost loop's iteration), or nothing: one term not made in this
    iteration (from before it, or an array read from outside), the other made
    or first read in it; then, while the result's one reader is another such
    addition of this iteration (``total = total + a + b``), that addition too;
    the last result read only after the iteration."""
    here = where

    def made_here(ref):
        return ref in producer and here in home[ref]

    def new_here(ref):
        return here in home.get(ref, ())

    refs = steps[j].refs
    if len(refs) == 1:                      # 0 + x: the zero is from before
        if not new_here(refs[0]):
            return ()
    elif not any(not made_here(a) and new_here(b) for a, b in (refs, refs[::-1])):
        return ()
    chain = [j]
    while True:
        out = steps[chain[-1]].outs[0]
        after = readers.get(out, ())
        if all(here not in its[k] for k in after):
            return chain
        k = after[0]
        # (A one-term addition, ``total + 0`` of a number that is 0 here,
        # adds no term of this iteration: no accumulation.)
        if len(after) != 1 or not _add_like(steps[k]) or here not in its[k] \
                or len(steps[k].refs) != 2 \
                or not any(a == out and new_here(b)
                           for a, b in (steps[k].refs, steps[k].refs[::-1])):
            return ()
        chain.append(k)


def _segments(its, recurrent, cells):
    """Segment ids: a new one wherever the iteration of a recurrent loop changes.

    The outermost recurrent loop cuts; a recurrent loop inside it cuts too
    when its iterations call a cell (the characters of each word of a
    sentence: character c of every word of every sentence is one segment).
    """
    out, current, key = [], -1, object()
    for where in its:
        mine = []
        for loop, iteration in where:
            if loop in recurrent and (not mine or loop in cells):
                mine.append((loop, iteration))
        mine = tuple(mine)
        if mine != key:
            current += 1
            key = mine
        out.append(current)
    return out
