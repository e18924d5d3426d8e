"""Errors raised by gluon_dynbatch."""
from mxnet.base import MXNetError


class BatchingError(RuntimeError):
    """A recorded call could not be planned or run.

    The message names the sample (its position among the top-level calls
    of the scope), the block and operator being called, and what was wrong.
    """


class InvalidCallError(BatchingError, MXNetError):
    """A call MXNet refuses for its inputs (their shapes, dtypes or the call's
    attributes), found while the call is recorded.

    Eager MXNet raises ``MXNetError`` at such a call; this error is one too,
    so a sample's ``except MXNetError`` runs as eagerly, and it names the
    sample and the call as every ``BatchingError`` does.
    """


def refused_call(err, message):
    """The error of a call refused by MXNet (``err``) while recording: an
    ``InvalidCallError`` when MXNet raised an ``MXNetError``, else a
    ``BatchingError`` that is also of ``err``'s type (MXNet's own argument
    checks raise ``TypeError``, ``ValueError`` or ``AssertionError``, which the
    message quotes), so that a sample's ``except`` catches it as eagerly."""
    if isinstance(err, MXNetError):
        return InvalidCallError(message)
    return _refused_as(type(err))(message)


_REFUSED_AS = {}        # exception type -> BatchingError subclass of it too


def _refused_as(kind):
    """A ``BatchingError`` class that is also a ``kind`` (where Python can make
    one: a type of another layout, such as ``OSError``, gives ``BatchingError``)."""
    found = _REFUSED_AS.get(kind)
    if found is None:
        try:
            found = type("BatchingError", (BatchingError, kind), {"__module__": __name__})
        except TypeError:
            found = BatchingError
        _REFUSED_AS[kind] = found
    return found


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
