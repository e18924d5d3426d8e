"""Steps of each planner against a lower bound, on the user-style models.

No plan can have fewer steps than the longest chain of dependent operator
nodes, nor fewer than the number of distinct batching signatures: the larger
of the two is the lower bound printed.  A planner at the bound leaves nothing
for a larger analysis budget to find.

Usage: python scripts/plan_steps.py [--samples 16] [--hidden 8] [--granularity call]
"""
import argparse
import logging
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

import gluon_dynbatch as gdb  # noqa: E402
from gluon_dynbatch.plan import budget  # noqa: E402
import user_models  # noqa: E402

LOG = logging.getLogger("plan_steps")
PLANNERS = ("depth", "agenda")


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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=8)
    parser.add_argument("--granularity", default="call", choices=("call", "op"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    model = budget.calibrate()
    header = "%-18s %6s %s" % ("case", "bound", " ".join(
        "%14s" % ("%s steps/cost" % p) for p in PLANNERS))
    LOG.info(header)
    for name in user_models.CASES:
        if name == "mid_sample_reads":       # reads: runs eagerly, nothing to plan
            continue
        make = getattr(user_models, "case_" + name)
        plans = {p: plan_of(make(n=args.samples, hidden=args.hidden), p, args.granularity)
                 for p in PLANNERS}
        cells = ["%6d/%7.2fms" % (len(plans[p].steps), 1000 * model.cost(plans[p]))
                 for p in PLANNERS]
        LOG.info("%-18s %6d %s", name, lower_bound(plans["depth"]), " ".join(cells))


if __name__ == "__main__":
    main()
