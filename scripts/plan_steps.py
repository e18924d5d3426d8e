"""Steps of each planner against a lower bound, on the user-style models.

No plan can have fewer steps than the longest chain of dependent operator
nodes, nor fewer than the number of distinct batching signatures: the larger
of the two is the lower bound printed.  A planner at the bound leaves nothing
for a larger analysis budget to find.  Each plan's estimated run time comes
from the cost model calibrated on this machine (``budget.calibrate``).

For every case of ``tests/user_models.py`` and every granularity of
``--granularity`` (``call``: a call or loop iteration is one node, the
library's default; ``op``: one node per operator), one batch is recorded
twice (the first scope learns the templates) and the second scope's plan is
kept, once per planner.

Usage: python scripts/plan_steps.py [--samples 16] [--hidden 8] [--granularity call,op]
    [--record plan_steps]
"""
import argparse
import logging
import os
import sys

from tqdm import tqdm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests"), os.path.join(ROOT, "scripts")]

import gluon_dynbatch as gdb  # noqa: E402
from gluon_dynbatch.plan import budget  # noqa: E402
import user_models  # noqa: E402

import benchlib  # noqa: E402

LOG = logging.getLogger("plan_steps")
SCRIPT = "scripts/plan_steps.py"
PLANNERS = ("depth", "agenda")
GRANULARITIES = ("call", "op")
SKIPPED = ("mid_sample_reads", "routed_tokens")
"""Cases left out: they read values while recording and run eagerly."""


def plan_of(case, strategy, granularity):
    """The plan of one batch of ``case`` (templates learned on a first batch)."""
    for _ in range(2):
        with gdb.batching(strategy=strategy, granularity=granularity,
                          keep_plan=True) as scope:
            outs = case.outputs()
    assert outs is not None
    return scope.last_plan


def lower_bound(plan):
    """max(longest dependency chain, distinct signatures) of a plan's nodes."""
    return budget.lower_bound(plan)


def case_row(name, args, model):
    """Bound, steps and estimated ms of each planner, per granularity, for one case.

    Parameters
    ----------
    name : str
        A key of ``user_models.CASES``.
    args : argparse.Namespace
    model : CostModel
        From ``budget.calibrate``.

    Returns
    -------
    dict
        ``case``, and for each granularity ``g``: ``bound_g``, and for each
        planner ``p``: ``p_g`` (steps) and ``p_cost_ms_g``; or, when recording
        or running the case fails, ``failed_g`` (the error).
    """
    row = {"case": name}
    for granularity in args.granularity:
        try:
            plans = {p: plan_of(user_models.CASES[name](n=args.samples, hidden=args.hidden),
                                p, granularity)
                     for p in PLANNERS}
        except Exception as err:  # pylint: disable=broad-except
            LOG.error("%s, granularity %s: %s: %s", name, granularity, type(err).__name__, err)
            row["failed_" + granularity] = failure_text(err)
            row["note"] = "; ".join(filter(None, [row.get("note"), "granularity %s failed: %s"
                                                  % (granularity, row["failed_" + granularity])]))
            continue
        row["bound_" + granularity] = lower_bound(plans["depth"])
        for planner, plan in plans.items():
            row["%s_%s" % (planner, granularity)] = len(plan.steps)
            row["%s_cost_ms_%s" % (planner, granularity)] = 1000.0 * model.cost(plan)
    return row


def failure_text(err, limit=160):
    """An error's type and last line, shortened: what the table says of a failed plan.

    The last line of an error MXNet raised holds its message (the lines before
    are its C++ traceback).
    """
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    text = "%s (%s)" % (type(err).__name__, lines[-1] if lines else "")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def text_columns(granularities):
    """Columns of the printed table."""
    columns = [("case", "case", "%s")]
    for g in granularities:
        columns.append(("bound_" + g, "bound (%s)" % g, "%d"))
        for p in PLANNERS:
            columns += [("%s_%s" % (p, g), "%s steps" % p, "%d"),
                        ("%s_cost_ms_%s" % (p, g), "%s ms" % p, "%.2f")]
    return columns + [("note", "note", "%s")]


def build_parser():
    """Return the command-line parser."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=16,
                        help="samples per batch (default: %(default)s)")
    parser.add_argument("--hidden", type=int, default=8,
                        help="hidden size (default: %(default)s)")
    parser.add_argument("--granularity", default=",".join(GRANULARITIES),
                        help="comma list of call and op (default: %(default)s)")
    parser.add_argument("--cases", default=",".join(
        n for n in user_models.CASES if n not in SKIPPED),
                        help="comma list of cases (default: every case that batches)")
    benchlib.add_record_arguments(parser)
    return parser


def parse_args(argv):
    """Parse and check the command line."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.granularity = [g.strip() for g in args.granularity.split(",") if g.strip()]
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    bad = [g for g in args.granularity if g not in GRANULARITIES]
    bad += [c for c in args.cases if c not in user_models.CASES]
    if bad or not args.granularity:
        parser.error("unknown granularity or case: %s" % ", ".join(bad))
    return args


def main(argv=None):
    """Plan every case; print and return the rows."""
    argv = benchlib.script_argv(argv)
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s",
                        datefmt="%H:%M:%S")
    settings = {"samples": args.samples, "hidden": args.hidden,
                "granularity": args.granularity, "planners": list(PLANNERS)}
    record = benchlib.start_record("plan_steps", SCRIPT, argv, settings)
    model = budget.calibrate()
    rows = [case_row(name, args, model)
            for name in tqdm(args.cases, desc="cases", unit="case", leave=False,
                             disable=None)]
    print("\n".join(benchlib.text_table(rows, text_columns(args.granularity))))
    benchlib.save_if_asked(args, "plan_steps", SCRIPT, argv, settings, {"cases": rows},
                           record=record)
    return rows


if __name__ == "__main__":
    main()
