"""Errors raised by gluon_dynbatch."""


class BatchingError(RuntimeError):
    """A recorded call could not be planned or run.

    The message names the sample (its position among the top-level calls
    of the scope), the block and operator being called, and what was wrong.
    """


def describe_call(sample, path, op=None):
    """Return ``"sample 3, in TreeLSTM > cell > FullyConnected"`` for messages."""
    where = " > ".join(path) if path else "top level"
    if op is not None:
        where = "%s > %s" % (where, op)
    if sample is None:
        return "outside any sample, in %s" % where
    return "sample %d, in %s" % (sample, where)
