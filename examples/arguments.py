"""Command-line argument types shared by the example scripts."""
import argparse


def count(least):
    """An argparse type: a whole number of at least ``least``.

    Parameters
    ----------
    least : int

    Returns
    -------
    callable
        ``int`` of the text, or ``argparse.ArgumentTypeError`` below ``least``.
    """
    def parse(text):
        value = int(text)
        if value < least:
            raise argparse.ArgumentTypeError("must be at least %d, got %d" % (least, value))
        return value
    parse.__name__ = "count"        # argparse's "invalid count value" on a non-number
    return parse
