"""Warnings of the recorder, each given once per process.

Messages go through ``logging``, to the logger ``gluon_dynbatch.record``.
"""
import logging

_WARNED = set()
LOG = logging.getLogger("gluon_dynbatch.record")


def warn_once(key, message, *args):
    """Log ``message`` (``%``-formatted with ``args``) the first time ``key`` comes up."""
    if key not in _WARNED:
        _WARNED.add(key)
        LOG.warning(message, *args)
