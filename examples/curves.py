"""The picture of a training run: ``curves.png``.

Two panels: the training loss of every batch (with a running mean), and
dev Pearson and MSE after every epoch; one line per model of an ensemble.
Drawn with matplotlib's Agg backend (``pip install gluon_dynbatch[plots]``);
without matplotlib no picture is drawn and the run goes on.  The series
drawn are stored in the PNG's text chunk ``gluon_dynbatch:series`` (JSON),
exactly as they appear in ``summary.json``'s ``curves``.
"""
import json
import logging

import numpy as np

from gluon_dynbatch.distributed import checkpoint

LOG = logging.getLogger(__name__)

#: PNG text key holding the series drawn, as JSON.
SERIES_KEY = "gluon_dynbatch:series"
FIGSIZE = (10.0, 4.0)
DPI = 100
SMOOTH = 20


def _running_mean(values, width):
    """Mean of each value and the ``width - 1`` before it."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return values
    sums = np.cumsum(np.insert(values, 0, 0.0))
    starts = np.maximum(np.arange(1, values.size + 1) - width, 0)
    ends = np.arange(1, values.size + 1)
    return (sums[ends] - sums[starts]) / (ends - starts)


def _draw(figure, series):
    """Draw the loss and dev panels of every model in ``series``."""
    from matplotlib.ticker import MaxNLocator
    loss_ax, pearson_ax = figure.subplots(1, 2)
    mse_ax = pearson_ax.twinx()
    for k, member in enumerate(series):
        label = f"seed {member.get('seed')}" if len(series) > 1 else None
        color = f"C{k}"
        loss = member["train_loss"]
        steps = np.arange(1, len(loss) + 1)
        loss_ax.plot(steps, loss, color=color, alpha=0.25, linewidth=0.6)
        loss_ax.plot(steps, _running_mean(loss, SMOOTH), color=color,
                     label=label)
        epochs = [d["epoch"] for d in member["dev"]]
        pearson_ax.plot(epochs, [d["pearson"] for d in member["dev"]],
                        "o-", color=color, label=label)
        mse_ax.plot(epochs, [d["mse"] for d in member["dev"]], "s--",
                    color=color, alpha=0.6)
    loss_ax.set(title="training loss (KL) per batch", xlabel="batch",
                ylabel="loss per pair")
    pearson_ax.set(title="dev after each epoch", xlabel="epoch",
                   ylabel="Pearson r (circles)")
    mse_ax.set_ylabel("MSE (squares, dashed)")
    pearson_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if len(series) > 1:
        loss_ax.legend(fontsize="small")
    figure.tight_layout()


def write(path, series):
    """Draw ``series`` into the PNG ``path`` (atomically).

    Parameters
    ----------
    path : pathlib.Path
    series : list of dict
        One per model: ``train_loss`` (list of float), ``dev`` (list of
        dicts with ``epoch``, ``pearson``, ``mse``) and ``seed``.

    Returns
    -------
    pathlib.Path or None
        ``path``, or None when matplotlib is not installed.
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        from matplotlib.figure import Figure
    except ImportError:
        LOG.warning("matplotlib is not installed: no %s "
                    "(pip install gluon_dynbatch[plots])", path.name)
        return None
    figure = Figure(figsize=FIGSIZE, dpi=DPI)
    _draw(figure, series)
    metadata = {SERIES_KEY: json.dumps(series)}
    checkpoint.atomic_write(path, lambda temp: figure.savefig(
        temp, format="png", dpi=DPI, metadata=metadata))
    return path
