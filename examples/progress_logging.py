"""Logging through tqdm, shared by the example and the benchmark scripts.

Log records are written with ``tqdm.write`` so that progress bars stay intact.
"""
import logging
import sys

from tqdm import tqdm


class TqdmHandler(logging.Handler):
    """Logging handler writing through tqdm so progress bars stay intact."""

    def emit(self, record):
        """Write one formatted record to stderr."""
        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # pragma: no cover - logging must never raise
            self.handleError(record)


def setup_logging(verbose, fmt="%(asctime)s %(message)s"):
    """Route the root logger through tqdm at INFO (DEBUG when ``verbose``).

    Parameters
    ----------
    verbose : bool
        Log at DEBUG level instead of INFO.
    fmt : str, optional
        ``logging.Formatter`` format; times are shown as ``%H:%M:%S``.
    """
    handler = TqdmHandler()
    handler.setFormatter(logging.Formatter(fmt, "%H:%M:%S"))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, TqdmHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
