"""Eager against batched training steps of the user-style models, on fresh batches.

For every case of ``tests/user_models.py`` (a model written the way Gluon
and DyNet users write it, with its samples) this times one training batch --
forward of every sample, one loss over all outputs concatenated, backward --
eagerly, one sample at a time, and inside one ``gdb.batching()`` scope with
the library's default settings.

Method.  The case's model and shared inputs are built once from ``--seed``.
Every batch, warm-up or timed, holds new samples, generated with a seed of its
own (``benchlib.batch_seed``), so the batched side never replays a batch it
has seen.  Both systems first run the same ``--warmup`` batches untimed (the
first initialises deferred parameters, the next ones let the library learn
its templates).  Then ``--rounds`` rounds: round k times eager on batch k,
then batched on the same batch k, each between two waits for MXNet, then
round k + 1.  The figures are medians over rounds: ``eager_ms``,
``batched_ms`` and ``x_eager``, the median of the per-round ratios (both
halves of a ratio ran back to back, so a drift of the machine's speed cancels
out).  ``steps``, ``mean_batch``, ``nodes`` and ``us_per_call`` are means over
the timed batches of ``scope.stats``.

``--compiled both`` times a third system in each round, the same scope with
``compiled=True``, after the imperative one on the same samples, with a twin
of the model (same weights, templates of its own, so that a batch the
imperative scope has just learned is not a repeat for it): ``compiled_ms``,
``x_eager_compiled`` and ``compiled_vs_imperative`` (the median per-round
ratio of imperative to compiled time: above 1 when compiled is faster).  Eager
then warms up on the first two warm-up batches only; give ``--warmup 16`` so
that ``compiled=True`` has made its measured choice (whole plans, compiled
steps or imperative calls) before the timed rounds.

A model that reads a value inside its samples (``float(x.asscalar())``,
branching on a computed score: ``mid_sample_reads``) batches through tasks:
each sample waits at its read while the others record, and a scope flushes
once per read of the sample that reads most.

Run from the repository root::

    .venv/bin/python scripts/user_models_bench.py --samples 64 --hidden 128 \\
        --record user_models
"""
import argparse
import logging
import sys
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "tests", ROOT / "scripts"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import mxnet as mx  # noqa: E402

import benchlib  # noqa: E402
import user_models as um  # noqa: E402

LOG = logging.getLogger("user_models_bench")
SCRIPT = "scripts/user_models_bench.py"
SYSTEMS = ("eager", "batched")
QUICK = {"samples": 16, "hidden": 32, "rounds": 2, "warmup": 2}
"""Settings of ``--quick``: a smoke run of every case in a few minutes."""

COLUMNS = (("case", "case", "%s"), ("samples", "samples", "%d"),
           ("eager_ms", "eager ms", "%.1f"), ("batched_ms", "batched ms", "%.1f"),
           ("x_eager", "x eager", "%.2f"), ("steps", "steps", "%.1f"),
           ("mean_batch", "mean batch", "%.1f"), ("nodes", "nodes", "%.0f"),
           ("us_per_call", "us/call", "%.2f"), ("planner", "planner", "%s"),
           ("notes", "notes", "%s"))
COMPILED_COLUMNS = (("compiled_ms", "compiled ms", "%.1f"),
                    ("x_eager_compiled", "x eager compiled", "%.2f"),
                    ("compiled_vs_imperative", "imperative/compiled", "%.2f"))


def build_parser():
    """Return the command-line parser.

    Returns
    -------
    argparse.ArgumentParser
    """
    parser = argparse.ArgumentParser(
        description="Eager against batched time of a training batch of each user-style "
                    "model, on batches new to both, the two timed in alternating rounds.")
    parser.add_argument("--cases", default=",".join(um.CASES),
                        help="comma list of cases (default: all)")
    parser.add_argument("--samples", type=int, default=16,
                        help="samples per batch (default: %(default)s)")
    parser.add_argument("--hidden", type=int, default=um.HIDDEN,
                        help="hidden size (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the weights and of the batches' seeds (default: "
                             "%(default)s)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="timed rounds, each on a new batch, eager then batched; "
                             "medians are shown (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed batches each system runs first, the same ones "
                             "for both (default: %(default)s)")
    parser.add_argument("--analysis-budget", default=None,
                        help="the scopes' analysis_budget: seconds, or 'auto' (default: each "
                             "model's own, \"auto\" with the depth strategy); 0 never "
                             "searches past the depth plan")
    parser.add_argument("--compiled", choices=("false", "true", "step", "both"),
                        default="false",
                        help="the scopes' compiled mode (default: %(default)s, imperative); "
                             "both: imperative and compiled=True timed in the same rounds")
    parser.add_argument("--quick", action="store_true",
                        help="short settings for a smoke run: %s" % ", ".join(
                            "--%s %s" % item for item in QUICK.items()))
    benchlib.add_record_arguments(parser)
    return parser


def parse_args(argv=None):
    """Parse the command line, apply ``--quick`` and check the counts."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.quick_settings = benchlib.apply_quick(args, QUICK)
    if args.rounds < 1 or args.warmup < 1 or args.samples < 1:
        parser.error("--rounds, --warmup and --samples must be at least 1")
    return args


def parse_budget(text):
    """``--analysis-budget``: None, ``"auto"`` or seconds."""
    if text is None or text == "auto":
        return text
    return float(text)


def fresh_batch(case, name, seed, samples, hidden):
    """``case``'s model and shared inputs on new samples, drawn with ``seed``.

    Parameters
    ----------
    case : user_models.Case
        The case whose model is timed.
    name : str
        Its name in ``user_models.CASES``.
    seed : int
        Seed of the new samples.
    samples, hidden : int

    Returns
    -------
    user_models.Case
    """
    drawn = um.CASES[name](seed=seed, n=samples, hidden=hidden)
    return um.Case(case.model, drawn.samples, case.inputs, call=case.call,
                   notes=case.notes, fresh=case.fresh)


def time_batch(batch, batching, clock=None):
    """Milliseconds of one forward and backward of ``batch``, and its stats.

    Parameters
    ----------
    batch : user_models.Case
    batching : dict or None
        Arguments of ``gdb.batching``; None runs eagerly.
    clock : callable, optional
        Seconds (``time.perf_counter`` by default).
    """
    def step():
        return um.forward_backward(batch, batching, loss_fn=um.concat_loss)[1]
    kwargs = {} if clock is None else {"clock": clock}
    return benchlib.time_call(step, sync=mx.nd.waitall, **kwargs)


def run_rounds(batches, run, warmup, systems=SYSTEMS, eager_warmup=None):
    """Warm the systems up, then time them in alternating rounds.

    Parameters
    ----------
    batches : list
        ``warmup`` warm-up batches, then one batch per timed round.
    run : callable
        ``run(system, batch) -> (ms, stats)``, ``system`` one of ``systems``.
    warmup : int
    systems : tuple of str, optional
        In the order each round runs them (default :data:`SYSTEMS`).
    eager_warmup : int, optional
        Warm-up batches of the eager system, if fewer than ``warmup`` (eager
        has nothing to learn once its parameters are initialised).

    Returns
    -------
    dict
        System -> list of ``(ms, stats)``, one per timed round, in order.
    """
    for k, batch in enumerate(batches[:warmup]):
        for system in systems:
            if system != "eager" or eager_warmup is None or k < eager_warmup:
                run(system, batch)
    timed = batches[warmup:]
    out = {system: [] for system in systems}
    for r, system in benchlib.interleaved(systems, len(timed), rotate=False):
        out[system].append(run(system, timed[r]))
    return out


def summarize(name, samples, notes, runs):
    """The row of one case from its timed rounds.

    Parameters
    ----------
    name : str
    samples : int
    notes : str
    runs : dict
        From :func:`run_rounds`.

    Returns
    -------
    dict
    """
    eager = [ms for ms, _ in runs["eager"]]
    batched = [ms for ms, _ in runs["batched"]]
    stats = [s for _, s in runs["batched"]]
    planners = sorted({p for s in stats for p in s.planners})
    extra = {}
    if "compiled" in runs:
        compiled = [ms for ms, _ in runs["compiled"]]
        extra = {"compiled_ms": benchlib.median(compiled),
                 "x_eager_compiled": benchlib.median(e / c for e, c in zip(eager, compiled)),
                 "compiled_vs_imperative": benchlib.median(
                     b / c for b, c in zip(batched, compiled))}
    return dict(extra, **{"case": name, "samples": samples, "notes": notes, "rounds": len(eager),
            "eager_ms": benchlib.median(eager), "batched_ms": benchlib.median(batched),
            "x_eager": benchlib.median(e / b for e, b in zip(eager, batched)),
            "steps": benchlib.mean(s.steps for s in stats),
            "mean_batch": benchlib.mean(s.mean_batch_size for s in stats),
            "flushes": benchlib.mean(s.flushes for s in stats),
            "nodes": benchlib.mean(s.nodes for s in stats),
            "us_per_call": benchlib.mean(s.us_per_call for s in stats),
            "planner": ",".join(planners) or "-"})


def bench_case(name, args):
    """Figures of one case (see the module docstring)."""
    case = um.CASES[name](seed=args.seed, n=args.samples, hidden=args.hidden)
    for array in case.inputs:
        array.attach_grad()
    seeds = ([benchlib.batch_seed(args.seed, "warmup", i) for i in range(args.warmup)]
             + [benchlib.batch_seed(args.seed, "timed", i) for i in range(args.rounds)])
    batches = [fresh_batch(case, name, seed, args.samples, args.hidden) for seed in seeds]
    budget = parse_budget(args.analysis_budget)
    scoped = {} if budget is None else {"analysis_budget": budget}
    settings = {"eager": None, "batched": scoped}
    if args.compiled in ("true", "step"):
        scoped["compiled"] = True if args.compiled == "true" else "step"
    systems, eager_warmup = SYSTEMS, None
    if args.compiled == "both":
        settings["compiled"] = dict(scoped, compiled=True)
        systems, eager_warmup = SYSTEMS + ("compiled",), 2
        # A model of its own, the same weights and samples: the templates one
        # system learns on a batch must not make the batch a repeat for the other.
        twin = um.CASES[name](seed=args.seed, n=args.samples, hidden=args.hidden)
        for array in twin.inputs:
            array.attach_grad()
        batches = [{"eager": batch, "batched": batch,
                    "compiled": fresh_batch(twin, name, seed, args.samples, args.hidden)}
                   for batch, seed in zip(batches, seeds)]
    runs = run_rounds(batches, lambda system, batch: time_batch(
        batch[system] if isinstance(batch, dict) else batch, settings[system]),
        args.warmup, systems, eager_warmup)
    return summarize(name, args.samples, case.notes, runs)


def settings_of(args):
    """The run's settings, for the record."""
    settings = {key: getattr(args, key) for key in
                ("samples", "hidden", "seed", "rounds", "warmup", "analysis_budget",
                 "compiled")}
    return dict(settings, quick=args.quick_settings)


def main(argv=None):
    """Run the timings; print and return the rows."""
    argv = benchlib.script_argv(argv)
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s",
                        datefmt="%H:%M:%S")
    names = [n.strip() for n in args.cases.split(",") if n.strip()]
    unknown = sorted(set(names) - set(um.CASES))
    if unknown:
        sys.exit("unknown case(s) %s; choose from %s" % (", ".join(unknown),
                                                         ", ".join(um.CASES)))
    record = benchlib.start_record("user_models", SCRIPT, argv, settings_of(args))
    rows = []
    for name in tqdm(names, desc="cases", unit="case", leave=False, disable=None):
        rows.append(bench_case(name, args))
        LOG.info("%-18s eager %8.1f ms  batched %7.1f ms  x%.2f%s", name,
                 rows[-1]["eager_ms"], rows[-1]["batched_ms"], rows[-1]["x_eager"],
                 "  compiled %.1f ms  x%.2f" % (rows[-1]["compiled_ms"],
                                               rows[-1]["x_eager_compiled"])
                 if "compiled_ms" in rows[-1] else "")
    columns = COLUMNS if args.compiled != "both" else \
        COLUMNS[:5] + COMPILED_COLUMNS + COLUMNS[5:]
    print("\n".join(benchlib.text_table(rows, columns)))
    benchlib.save_if_asked(args, "user_models", SCRIPT, argv, settings_of(args),
                           {"cases": rows}, record=record)
    return rows


if __name__ == "__main__":
    main()
