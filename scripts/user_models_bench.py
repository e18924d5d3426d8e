"""One-batch timings of the user-style models of tests/user_models.py.

For every case (a model written the way Gluon and DyNet users write it, with
its samples) this times one training batch -- forward of every sample,
the loss, backward -- eagerly, one sample at a time, and inside one
``gdb.batching()`` scope with the library's default settings, and prints the
two times, their ratio and figures of ``scope.stats``: mean batch size
(operator nodes per launched step), steps, flushes and recording time per
operator call.  The loss is one computation over every output concatenated.
Each is the median of ``--repeats`` runs after two untimed
runs of the same batch (the first initialises deferred parameters, the
second learns the templates), waiting for MXNet before and after.  It is a benchmark, not a
test: the machine's load moves the figures; read the ratios of one run.

A model that reads a value inside most samples (``float(x.asscalar())``,
branching on a computed score) cannot batch: its first scope runs a few
samples batched, then the rest eagerly, and its later scopes give up at the
first read (``mid_sample_reads``).

Run from the repository root::

    .venv/bin/python scripts/user_models_bench.py --samples 8
"""
import argparse
import json
import logging
import sys
import time
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "tests"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import mxnet as mx  # noqa: E402

import user_models as um  # noqa: E402

LOG = logging.getLogger("user_models_bench")

COLUMNS = (("case", "%s"), ("samples", "%d"), ("eager_ms", "%.1f"), ("batched_ms", "%.1f"),
           ("x_eager", "%.2f"), ("mean_batch", "%.1f"), ("steps", "%d"), ("flushes", "%d"),
           ("nodes", "%d"), ("us_per_call", "%.2f"), ("planner", "%s"), ("notes", "%s"))


def build_parser():
    """Return the command-line parser."""
    parser = argparse.ArgumentParser(
        description="Eager against batched time of one batch of each user-style model.")
    parser.add_argument("--cases", default=",".join(um.CASES),
                        help="comma list of cases (default: all: %(default)s)")
    parser.add_argument("--samples", type=int, default=16,
                        help="samples per batch (default: %(default)s)")
    parser.add_argument("--hidden", type=int, default=um.HIDDEN,
                        help="hidden size (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed runs per case and mode; the median is shown "
                             "(default: %(default)s)")
    parser.add_argument("--analysis-budget", default=None,
                        help="the scopes' analysis_budget: seconds, or 'auto' (default: each "
                             "model's own, \"auto\" with the depth strategy); 0 never "
                             "searches past the depth plan")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    return parser


def parse_budget(text):
    """``--analysis-budget``: None, ``"auto"`` or seconds."""
    if text is None or text == "auto":
        return text
    return float(text)


def time_batch(case, batching):
    """Milliseconds of one forward and backward of ``case``, and its stats."""
    mx.nd.waitall()
    start = time.perf_counter()
    _, stats = um.forward_backward(case, batching, loss_fn=um.concat_loss)
    mx.nd.waitall()
    return 1000.0 * (time.perf_counter() - start), stats


def bench_case(name, samples, hidden, seed, repeats=3, analysis_budget=None):
    """Figures of one case: eager and batched ms (medians), ratio, stats."""
    case = um.CASES[name](seed=seed, n=samples, hidden=hidden)
    for array in case.inputs:
        array.attach_grad()
    row = {"case": name, "samples": len(case.samples), "notes": case.notes}
    scoped = {} if analysis_budget is None else {"analysis_budget": analysis_budget}
    for label, batching in (("eager", None), ("batched", scoped)):
        for _ in range(2):                              # untimed: shapes, templates
            time_batch(case, batching)
        runs = sorted((time_batch(case, batching) for _ in range(max(1, repeats))),
                      key=lambda run: run[0])
        row[label + "_ms"], stats = runs[len(runs) // 2]
    row["x_eager"] = row["eager_ms"] / row["batched_ms"]
    row.update(mean_batch=stats.mean_batch_size, steps=stats.steps,
               flushes=stats.flushes, nodes=stats.nodes,
               us_per_call=stats.us_per_call,
               planner=",".join(sorted(stats.planners)) or "-")
    return row


def table(rows):
    """The rows as aligned text lines."""
    cells = [[key for key, _ in COLUMNS]]
    cells += [[fmt % row[key] for key, fmt in COLUMNS] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) if i in (0, len(COLUMNS) - 1) else c.rjust(w)
                       for i, (c, w) in enumerate(zip(line, widths))).rstrip()
             for line in cells]
    return lines[:1] + ["-" * len(lines[0])] + lines[1:]


def main(argv=None):
    """Run the timings; print and return the rows."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s",
                        datefmt="%H:%M:%S")
    names = [n.strip() for n in args.cases.split(",") if n.strip()]
    unknown = sorted(set(names) - set(um.CASES))
    if unknown:
        sys.exit("unknown case(s) %s; choose from %s" % (", ".join(unknown),
                                                         ", ".join(um.CASES)))
    rows = []
    for name in tqdm(names, desc="cases", unit="case", leave=False, disable=None):
        rows.append(bench_case(name, args.samples, args.hidden, args.seed, args.repeats,
                               parse_budget(args.analysis_budget)))
        LOG.info("%-18s eager %8.1f ms  batched %7.1f ms  x%.2f", name,
                 rows[-1]["eager_ms"], rows[-1]["batched_ms"], rows[-1]["x_eager"])
    print("\n".join(table(rows)))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return rows


if __name__ == "__main__":
    main()
