"""One batch seen again and again: does batching keep its speed as it repeats?

Caches that a model's samples share (a dictionary of word vectors filled as
the samples run, ``memo_words`` of ``tests/user_models.py``) change what each
sample computes when the same batch comes back: the second time round every
word is found in the cache.  A batching library that learns from the paths
it has seen must not get slower on such repeats.

For each case: two warm-up batches (new samples, untimed, eager and batched),
then one further batch of new samples timed ``--repeats`` times, eager then
batched each time (the model's own cache emptied before each run, as
``Case.outputs`` does).  Printed per case: the batched time, ``x eager``,
steps and mean batch size of the first and the last repeat.  This is a
repeated-batch measurement by design; speed on fresh batches is measured by
``scripts/user_models_bench.py``.

Run from the repository root::

    .venv/bin/python scripts/repeat_batch.py --cases memo_words,dag_memo --repeats 11
"""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "tests", ROOT / "scripts"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import mxnet as mx  # noqa: E402

import benchlib  # noqa: E402
import user_models as um  # noqa: E402
from user_models_bench import fresh_batch, time_batch  # noqa: E402

COLUMNS = (("case", "case", "%s"), ("repeat", "repeat", "%d"),
           ("eager_ms", "eager ms", "%.1f"), ("batched_ms", "batched ms", "%.1f"),
           ("x_eager", "x eager", "%.2f"), ("steps", "steps", "%d"),
           ("mean_batch", "mean batch", "%.1f"))


def parse_args(argv=None):
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="memo_words,dag_memo,pointer_net",
                        help="comma list of cases of tests/user_models.py")
    parser.add_argument("--repeats", type=int, default=11,
                        help="times the one batch is run (default 11: ten repeats)")
    parser.add_argument("--samples", type=int, default=64, help="samples per batch")
    parser.add_argument("--hidden", type=int, default=128, help="hidden size")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights and batches")
    args = parser.parse_args(argv)
    if args.repeats < 2:
        parser.error("--repeats must be at least 2")
    return args


def repeat_case(name, args):
    """Rows of the first and the last repeat of one case."""
    case = um.CASES[name](seed=args.seed, n=args.samples, hidden=args.hidden)
    for array in case.inputs:
        array.attach_grad()
    for k in range(2):
        batch = fresh_batch(case, name, benchlib.batch_seed(args.seed, "warmup", k),
                            args.samples, args.hidden)
        time_batch(batch, None)
        time_batch(batch, {})
    batch = fresh_batch(case, name, benchlib.batch_seed(args.seed, "repeated", 0),
                        args.samples, args.hidden)
    rows = []
    for repeat in range(1, args.repeats + 1):
        eager_ms, _ = time_batch(batch, None)
        batched_ms, stats = time_batch(batch, {})
        if repeat in (1, args.repeats):
            rows.append({"case": name, "repeat": repeat, "eager_ms": eager_ms,
                         "batched_ms": batched_ms, "x_eager": eager_ms / batched_ms,
                         "steps": stats.steps, "mean_batch": stats.mean_batch_size})
    return rows


def main(argv=None):
    """Print the table; return its rows."""
    args = parse_args(argv)
    names = [n.strip() for n in args.cases.split(",") if n.strip()]
    unknown = sorted(set(names) - set(um.CASES))
    if unknown:
        sys.exit("unknown case(s) %s" % ", ".join(unknown))
    rows = [row for name in names for row in repeat_case(name, args)]
    print("\n".join(benchlib.text_table(rows, COLUMNS)))
    mx.nd.waitall()
    return rows


if __name__ == "__main__":
    main()
