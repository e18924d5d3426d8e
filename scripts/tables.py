"""The tables of the documentation, generated from the benchmark records.

A generated table sits between two comment lines in a Markdown file::

    <!-- table: sick_training -->
    ... (written by this script) ...
    <!-- end table -->

The name after ``table:`` is a key of :data:`TABLES`, which says which
records (``docs/records/NAME.json``, written by the benchmark scripts'
``--record NAME``) the table comes from and how it is laid out.  Each table
starts with a line naming the command, date, commit and machine of its
records.

Usage, from the repository root::

    python scripts/tables.py            # rewrite every generated table
    python scripts/tables.py --check    # exit 1, naming each table that is stale
                                        # or whose record is missing

Files: ``docs/benchmarks.md``, ``docs/bench_dynet.md`` and, when it has
markers, ``README.md`` (its table is ``readme_performance``).
"""
import argparse
import logging
import os
import re
import sys
from collections import namedtuple
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))

import benchlib  # noqa: E402

LOG = logging.getLogger("tables")
REGION = re.compile(r"(<!-- table: ([\w-]+) -->\n)(.*?)(<!-- end table -->)", re.S)
DOCS = ("docs/benchmarks.md", "docs/bench_dynet.md", "README.md")
"""Files searched for generated tables, from the repository root."""

Column = namedtuple("Column", ["title", "value"])
Column.__doc__ = """A table column: its header and ``value(row) -> str``."""
Table = namedtuple("Table", ["records", "body", "doc"])
Table.__doc__ = """A generated table.

Attributes
----------
records : tuple of str
    Names of the records it reads.
body : callable
    ``body(records) -> list of str``: the Markdown table, from a dict of the
    records by name.
doc : str or None
    The file that must hold it (``--check`` fails when its markers are
    missing); None for an optional table.
"""


# --------------------------------------------------------------------------
# Cells
# --------------------------------------------------------------------------

def field(key, fmt="%s"):
    """A cell function: ``row[key]`` formatted with ``fmt``, ``-`` when absent."""
    return lambda row: benchlib.cell(row.get(key), fmt)


def share(key):
    """A cell function: a fraction as a percentage."""
    return lambda row: benchlib.cell(row.get(key), lambda v: "%.1f%%" % (100.0 * v))


def times(key, digits=2):
    """A cell function: a ratio as ``1.23x``."""
    return lambda row: benchlib.cell(row.get(key), lambda v: "%.*fx" % (digits, v))


def hits(hit_key, miss_key):
    """A cell function: ``98% (171 of 175)`` from hit and miss counts."""
    def text(row):
        found, missed = row.get(hit_key) or 0, row.get(miss_key) or 0
        if not found + missed:
            return "-"
        return "%.0f%% (%d of %d)" % (100.0 * found / (found + missed), found,
                                      found + missed)
    return text


def batched(key, fmt="%.1f"):
    """A cell function: ``row[key]`` for a gluon_dynbatch system, ``-`` for the others.

    Eager and hand-batched rows have no ``scope.stats`` (no mean batch size).
    """
    return lambda row: "-" if row.get("mean_batch_size") is None else benchlib.cell(
        row.get(key), fmt)


def escape(text):
    """Text safe inside a Markdown table cell."""
    return str(text).replace("|", "\\|")


def render(columns, rows):
    """Markdown lines of ``rows`` under ``columns``."""
    body = [[escape(c.value(row)) for c in columns] for row in rows]
    return benchlib.markdown_table([c.title for c in columns], body)


def simple(record, table, columns, where=None, doc="docs/benchmarks.md"):
    """A :class:`Table` of the rows of one table of one record.

    Parameters
    ----------
    record : str
        The record's name.
    table : str
        The name of the table in the record.
    columns : list of Column
    where : callable, optional
        Keeps the rows for which ``where(row)`` is true.
    doc : str or None, optional
    """
    def body(records):
        rows = records[record]["tables"].get(table, [])
        return render(columns, [r for r in rows if where is None or where(r)])
    return Table((record,), body, doc)


# --------------------------------------------------------------------------
# The tables
# --------------------------------------------------------------------------

def sick_system(row):
    """A readable name of a system of ``scripts/benchmark.py``."""
    kind, strategy, budget = row.get("kind"), row.get("strategy"), row.get("budget")
    names = {"eager": "eager Gluon", "handbatched": "hand-batched",
             "imperative": "imperative", "compiled": "`compiled=True`",
             "step": "`compiled=\"step\"`"}
    name = names.get(kind, kind)
    if kind in ("imperative", "compiled", "step"):
        name += ", " + (strategy or "default strategy")
    if budget is not None:
        name += ", budget %s" % ("`\"auto\"`" if budget == "auto" else "%g s" % budget)
    return name


SICK_COLUMNS = [
    Column("system", sick_system), Column("model", field("model")),
    Column("trees/s", field("trees_per_s", "%.1f")),
    Column("ms/batch", field("total_ms", "%.1f")),
    Column("x eager", field("vs_eager", "%.1f")), Column("x hand", field("vs_hand", "%.2f")),
    Column("record", field("record_ms", "%.1f")), Column("plan", field("plan_ms", "%.1f")),
    Column("compile", field("compile_ms", "%.1f")),
    Column("launch", field("launch_ms", "%.1f")), Column("other", field("other_ms", "%.1f")),
    Column("steps", batched("steps_per_batch")),
    Column("mean batch", field("mean_batch_size", "%.1f")),
    Column("plan-cache hits", hits("cache_hits", "cache_misses")),
    Column("trees/s again (batches seen before)", field("trees_per_s_again", "%.1f")),
    Column("trees/s back to back", field("trees_per_s_b2b", "%.1f")),
]
EPOCH_COLUMNS = [
    Column("system", sick_system), Column("model", field("model")),
    Column("batches", field("batches", "%d")),
    Column("trees/s", field("trees_per_s", "%.1f")),
    Column("plan-cache hits after the first 5 batches",
           hits("hits_after_skip", "misses_after_skip")),
    Column("analysis + compilation", share("analysis_compile_share")),
    Column("planner", field("planners")),
]
BUDGET_COLUMNS = [
    Column("model", field("model")), Column("system", sick_system),
    Column("trees/s", field("trees_per_s", "%.1f")),
    Column("plan ms", field("plan_ms", "%.1f")),
    Column("steps", batched("steps_per_batch")),
    Column("mean batch", field("mean_batch_size", "%.1f")),
    Column("planner", field("planners")), Column("reused", field("reused_choices", "%d")),
]
CORE_COLUMNS = [
    Column("mode", field("mode")), Column("ms", field("ms", "%.1f")),
    Column("x eager", field("x_eager", "%.1f")), Column("calls", field("calls", "%.0f")),
    Column("nodes", field("nodes", "%.0f")), Column("steps", field("steps", "%.1f")),
    Column("mean batch", field("mean_batch_size", "%.1f")),
    Column("record ms", field("record_ms", "%.1f")),
    Column("us/call", field("us_per_call", "%.2f")),
    Column("plan ms", field("plan_ms", "%.1f")),
    Column("execute ms", field("execute_ms", "%.1f")),
    Column("compile ms", field("compile_ms", "%.1f")),
]
CASE_EAGER_COLUMNS = [Column("case", field("case")),
                      Column("eager ms", field("eager_ms", "%.1f"))]
USER_COLUMNS = CASE_EAGER_COLUMNS + [
    Column("batched ms", field("batched_ms", "%.1f")),
    Column("x eager", field("x_eager", "%.2f")), Column("steps", field("steps", "%.1f")),
    Column("mean batch", field("mean_batch", "%.1f")),
    Column("us/call", field("us_per_call", "%.2f")), Column("planner", field("planner")),
]

USER_COMPILED_COLUMNS = CASE_EAGER_COLUMNS + [
    Column("imperative ms", field("batched_ms", "%.1f")),
    Column("compiled=True ms", field("compiled_ms", "%.1f")),
    Column("x eager, imperative", field("x_eager", "%.2f")),
    Column("x eager, compiled=True", field("x_eager_compiled", "%.2f")),
    Column("imperative / compiled", field("compiled_vs_imperative", "%.2f")),
]


def steps_and_cost(planner, granularity):
    """A cell function: ``11 (3.33 ms)``, a planner's steps and estimated ms."""
    def text(row):
        steps = row.get("%s_%s" % (planner, granularity))
        cost = row.get("%s_cost_ms_%s" % (planner, granularity))
        if steps is None:
            return "-"
        return "%d (%.2f ms)" % (steps, cost) if cost is not None else "%d" % steps
    return text


PLAN_COLUMNS = [
    Column("case", field("case")), Column("bound", field("bound_call", "%d")),
    Column("depth steps (est. ms)", steps_and_cost("depth", "call")),
    Column("agenda steps (est. ms)", steps_and_cost("agenda", "call")),
    Column("bound, per operator", field("bound_op", "%d")),
    Column("depth, per operator", field("depth_op", "%d")),
    Column("agenda, per operator", field("agenda_op", "%d")),
    Column("note", lambda row: row.get("note") or ""),
]


def dynet_system(row):
    """A system of the DyNet race, with its note when it has one."""
    return row["system"] + (" (%s)" % row["note"] if row.get("note") else "")


DYNET_COLUMNS = [
    Column("workload", field("workload")), Column("system", dynet_system),
    Column("train sent/s", field("train", "%.1f")),
    Column("infer sent/s", field("infer", "%.1f")),
    Column("train x DyNet autobatch", times("train_x_dynet")),
    Column("infer x DyNet autobatch", times("infer_x_dynet")),
    Column("train x hand-batched (sparse)", times("train_x_hand_sparse")),
]
DYNET_GDB_COLUMNS = [
    Column("workload", field("workload")), Column("system", field("system")),
    Column("record ms", field("record_ms", "%.1f")), Column("plan ms", field("plan_ms", "%.1f")),
    Column("execute ms", field("execute_ms", "%.1f")),
    Column("compile ms", field("compile_ms", "%.1f")),
    Column("nodes", field("nodes", "%.0f")),
    Column("mean batch", field("mean_batch_size", "%.1f")),
]


def process_text(row):
    """``own`` or ``shared by N systems``, or ``-`` for a system that did not run."""
    if row.get("pid") is None:
        return "-"
    return "own" if row.get("hosted") == 1 else "shared by %s systems" % row.get("hosted")


def pair(first, second, fmt="%d"):
    """A cell function: ``first / second`` of two fields."""
    return lambda row: "%s / %s" % (benchlib.cell(row.get(first), fmt),
                                    benchlib.cell(row.get(second), fmt))


PROCESS_COLUMNS = [
    Column("workload", field("workload")), Column("system", field("system")),
    Column("process", process_text),
    Column("cores", lambda row: ",".join(str(c) for c in row.get("cores") or []) or "-"),
    Column("OMP_NUM_THREADS", field("OMP_NUM_THREADS")),
    Column("OS threads", field("os_threads", "%d")),
    Column("peak RSS MB", field("max_rss_mb", "%.0f")),
    Column("warm-up batches", field("train_warmup", "%d")),
    Column("timed batches train / infer", pair("train_batches", "infer_batches")),
    Column("rounds train / infer", pair("train_rounds", "infer_rounds")),
]
SOAK_COLUMNS = [
    Column("model", lambda row: {"reads": "branching on reads, 1 scope in %s left early"
                                 % row.get("stop_every")}.get(row.get("model"), "Tree-LSTM")),
    Column("batches", field("batches", "%d")), Column("trees a batch", field("batch_size", "%d")),
    Column("strategy", field("strategy")), Column("compiled", field("compiled")),
    Column("ms/batch", field("ms_per_batch", "%.1f")),
    Column("RSS after warm-up MB", field("rss_warm_mb", "%.1f")),
    Column("RSS at the end MB", field("rss_end_mb", "%.1f")),
    Column("growth MB", field("growth_mb", "%+.1f")), Column("bound MB", field("bound_mb", "%.0f")),
    Column("tasks left", lambda row: "-" if row.get("model") != "reads"
           else "%+d" % (row["tasks_end"] - row["tasks_warm"])),
    Column("verdict", field("verdict")),
]


def _find(rows, **match):
    """The first row whose fields equal ``match``, or an empty dict."""
    return next((r for r in rows if all(r.get(k) == v for k, v in match.items())), {})


def _rate(row, key, ratio_key=None):
    """``1,234`` or ``1,234 (18.3x)``; ``-`` when the row lacks the figure."""
    if row.get(key) is None:
        return "-"
    text = "{:,.0f}".format(row[key])
    if ratio_key and row.get(ratio_key) is not None:
        text += " (%.1fx)" % row[ratio_key]
    return text


def readme_body(records):
    """The README's performance table: SICK and SST training, default settings."""
    sick = records["sick_training"]["tables"].get("systems", [])
    race = records["dynet_race"]["tables"].get("summary", [])
    sst = [r for r in race if r.get("workload") == "treelstm 128/128"]
    dynet = _find(sst, key="dynet-1")
    body = []
    for model, label in (("cell", "SICK Child-Sum Tree-LSTM, cell-written (trees/s)"),
                         ("opbyop", "the same, written op by op")):
        body.append([label, _rate(_find(sick, kind="eager", model=model), "trees_per_s"),
                     _rate(_find(sick, kind="imperative", strategy="depth", model=model),
                           "trees_per_s", "vs_eager"),
                     _rate(_find(sick, kind="handbatched"), "trees_per_s")
                     if model == "cell" else "-", "-"])
    for encoder, label in (("cell", "SST Tree-LSTM 128/128, cell-written (sentences/s)"),
                           ("op", "the same, written op by op")):
        body.append([label, _rate(_find(sst, key="eager"), "train"),
                     _rate(_find(sst, key="gdb-%s-depth:imperative" % encoder), "train",
                           "train_x_eager"),
                     _rate(_find(sst, key="hand-sparse"), "train")
                     if encoder == "cell" else "-", _rate(dynet, "train")])
    header = ["model, training step", "eager Gluon", "gluon_dynbatch (default settings)",
              "hand-batched MXNet", "DyNet autobatch"]
    return benchlib.markdown_table(header, body)


TABLES = {
    "sick_training": simple("sick_training", "systems", SICK_COLUMNS),
    "sick_epoch": simple("sick_training", "epoch", EPOCH_COLUMNS),
    "sick_budget": simple("sick_budget", "systems", BUDGET_COLUMNS),
    "sick_budget_epoch": simple("sick_budget", "epoch", EPOCH_COLUMNS),
    "bench_core": simple("bench_core", "modes", CORE_COLUMNS),
    "user_models": simple("user_models", "cases", USER_COLUMNS),
    "user_models_compiled": simple("user_models_compiled", "cases", USER_COMPILED_COLUMNS),
    "plan_steps": simple("plan_steps", "cases", PLAN_COLUMNS),
    "dynet_race": simple("dynet_race", "summary", DYNET_COLUMNS),
    "dynet_gluon_dynbatch": simple("dynet_race", "gluon_dynbatch", DYNET_GDB_COLUMNS),
    "dynet_processes": simple("dynet_race", "processes", PROCESS_COLUMNS,
                              doc="docs/bench_dynet.md"),
    "soak": simple("soak", "soak", SOAK_COLUMNS),
    "soak_reads": simple("soak_reads", "soak", SOAK_COLUMNS),
    "readme_performance": Table(("sick_training", "dynet_race"), readme_body, None),
}


# --------------------------------------------------------------------------
# Sources and regions
# --------------------------------------------------------------------------

def source_line(name, record, link):
    """The sentence saying where a record's figures come from."""
    machine = record.get("machine") or {}
    loads = machine.get("load_average") or [None]
    facts = ["commit `%s`" % (record.get("commit") or "?")[:10]]
    facts.append("%s, %s cores, %s GiB" % (machine.get("cpu_model") or "?",
                                           machine.get("cores") or "?",
                                           machine.get("ram_gib") or "?"))
    facts.append("Python %s, mxnet %s" % (machine.get("python") or "?",
                                          machine.get("mxnet") or "?"))
    if loads[0] is not None:
        facts.append("load average %.1f at the start" % loads[0])
    text = "Measured on %s by `%s` (%s); record [%s](%s)." % (
        str(record.get("date", "?"))[:10], record.get("command", "?"), "; ".join(facts),
        name, link)
    quick = (record.get("settings") or {}).get("quick")
    if quick:
        given = ""
        if isinstance(quick, dict):
            given = ", which sets %s" % " ".join(
                "`--%s %s`" % (k.replace("_", "-"), v) for k, v in quick.items())
        text += (" Quick settings (`--quick`%s): a short run showing that the script "
                 "works, not final figures." % given)
    if record.get("dirty"):
        text += " The code had changes not committed."
    return text


def region_text(name, records, doc_dir, records_dir):
    """The generated text of table ``name`` in a file of folder ``doc_dir``."""
    table = TABLES[name]
    lines = []
    for record_name in table.records:
        link = os.path.relpath(Path(records_dir) / (record_name + ".json"), doc_dir)
        lines.append(source_line(record_name, records[record_name],
                                 Path(link).as_posix()))
        lines.append("")
    lines += table.body(records)
    return "\n".join(lines) + "\n"


def load_records(names, records_dir, cache):
    """The records ``names`` as a dict; a list of problems for those missing."""
    problems = []
    for name in names:
        if name in cache:
            continue
        try:
            cache[name] = benchlib.read_record(Path(records_dir) / (name + ".json"))
        except benchlib.RecordError as err:
            problems.append(str(err))
    return {n: cache[n] for n in names if n in cache}, problems


def update_text(text, doc, doc_dir, records_dir, cache):
    """``text`` with every generated region rewritten; its problems and stale tables.

    Returns
    -------
    new_text : str
    problems : list of str
        Unknown tables and missing records (their regions are left as they are).
    stale : list of str
        Names of the tables whose text changed.
    """
    problems, stale = [], []

    def replace(match):
        head, name, old, tail = match.groups()
        if name not in TABLES:
            problems.append("%s: unknown table %r (known: %s)"
                            % (doc, name, ", ".join(sorted(TABLES))))
            return match.group(0)
        records, missing = load_records(TABLES[name].records, records_dir, cache)
        if missing:
            problems.extend("%s: table %s: %s" % (doc, name, m) for m in missing)
            return match.group(0)
        new = region_text(name, records, doc_dir, records_dir)
        if new != old:
            stale.append(name)
        return head + new + tail
    return REGION.sub(replace, text), problems, stale


def required_tables(doc):
    """Names of the tables file ``doc`` must hold."""
    return [name for name, table in TABLES.items() if table.doc == doc]


def process(root, records_dir, check):
    """Rewrite (or, with ``check``, compare) every generated table under ``root``.

    Returns
    -------
    list of str
        Problems: stale tables (with ``check``), missing records, unknown or
        missing tables.  Empty when all is well.
    """
    problems, cache = [], {}
    for doc in DOCS:
        path = Path(root) / doc
        if not path.is_file():
            if required_tables(doc):
                problems.append("%s is missing" % doc)
            continue
        text = path.read_text(encoding="utf-8")
        present = {m.group(2) for m in REGION.finditer(text)}
        problems += ["%s: table %s is missing (no markers)" % (doc, name)
                     for name in required_tables(doc) if name not in present]
        new, found, stale = update_text(text, doc, path.parent, records_dir, cache)
        problems += found
        if check:
            problems += ["%s: table %s differs from its record(s) %s; run python "
                         "scripts/tables.py" % (doc, name, ", ".join(TABLES[name].records))
                         for name in stale]
        elif new != text:
            path.write_text(new, encoding="utf-8")
            LOG.info("%s: rewrote %s", doc, ", ".join(stale))
    return problems


def main(argv=None):
    """Rewrite or check the generated tables; the exit status (0 when all is well)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 when a table differs from its "
                             "records, a record is missing or a table is unknown")
    parser.add_argument("--root", default=str(ROOT),
                        help="the repository whose files are read (default: this one)")
    parser.add_argument("--records", default=None,
                        help="folder of the records (default: ROOT/docs/records)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    records_dir = Path(args.records or Path(args.root) / "docs" / "records")
    problems = process(args.root, records_dir, args.check)
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        LOG.info("every generated table matches its records" if args.check
                 else "tables up to date")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
