"""Errors raised by gluon_dynbatch."""


class BatchingError(RuntimeError):
    """A recorded call could not be planned or run.

    The message names the sample (its position among the top-level calls
    of the scope), the block and operator being called, and what was wrong.
    """


SHOWN_NAMES = 6     # of a longer path of blocks, the first and last three are named


def describe_call(sample, path, op=None):
    """Return ``"sample 3, in TreeLSTM > cell > FullyConnected"`` for messages.

    A path of nested calls longer than ``SHOWN_NAMES`` (a deep recursion) is
    shortened to its first and last names and the count of those between.
    """
    if path and len(path) > SHOWN_NAMES:
        half = SHOWN_NAMES // 2
        path = tuple(path[:half]) + ("(%d more)" % (len(path) - 2 * half),) \
            + tuple(path[-half:])
    where = " > ".join(path) if path else "top level"
    if op is not None:
        where = "%s > %s" % (where, op)
    if sample is None:
        return "outside any sample, in %s" % where
    return "sample %d, in %s" % (sample, where)
