"""What the benchmark scripts share: records, machine facts, rounds, tables.

A *record* is the JSON file a benchmark run writes with ``--json PATH`` or
``--record NAME`` (``docs/records/NAME.json``): the command line, the git
commit, the date, the machine, the settings and every figure the run printed,
as named tables of rows (lists of dicts).  ``scripts/tables.py`` renders the
tables of the documentation from these files.

Timing helpers: :func:`interleaved` gives the order in which systems take
turns in rounds, :func:`time_call` times one call between two waits, and
:func:`batch_seed` gives each warm-up or timed batch a seed of its own, so
that every round runs on samples no system has seen.

This module imports neither mxnet nor dynet (the DyNet race's driver uses it
too); the mxnet version comes from the installed package's metadata.
"""
import datetime
import importlib.metadata
import json
import logging
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS_DIR = ROOT / "docs" / "records"
SCHEMA = 1
"""Version of the record layout (``record["schema"]``)."""
REQUIRED_KEYS = ("schema", "benchmark", "command", "argv", "date", "commit",
                 "machine", "settings", "tables")
SIGNIFICANT_DIGITS = 6
"""Floats are stored with this many significant digits."""

LOG = logging.getLogger("benchlib")


class RecordError(ValueError):
    """A record file is missing, unreadable or lacks a required key."""


# --------------------------------------------------------------------------
# The machine, the code and the date
# --------------------------------------------------------------------------

def cpu_model(cpuinfo="/proc/cpuinfo"):
    """The CPU's model name (Linux ``/proc/cpuinfo``), else ``platform.processor()``.

    Parameters
    ----------
    cpuinfo : str, optional
        Path of the file to read.

    Returns
    -------
    str or None
    """
    try:
        with open(cpuinfo, encoding="utf-8") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def memory_gib(meminfo="/proc/meminfo"):
    """Total RAM in GiB (``MemTotal`` of ``/proc/meminfo``), None where unknown."""
    try:
        with open(meminfo, encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024.0 ** 2, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def load_average():
    """The 1-, 5- and 15-minute load averages, None where unknown."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def package_version(name):
    """Version of an installed distribution, None when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def usable_cores():
    """Cores this process may run on (its affinity), else ``os.cpu_count()``."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count()


def machine_facts():
    """The machine and software a run measures.

    Returns
    -------
    dict
        ``cpu_model``, ``cores``, ``usable_cores``, ``ram_gib``, ``system``,
        ``python``, ``mxnet``, ``numpy``, ``load_average`` (1, 5, 15 min, now)
        and the thread variables set in the environment.
    """
    threads = {var: os.environ[var] for var in
               ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "MXNET_CPU_WORKER_NTHREADS")
               if var in os.environ}
    return {"cpu_model": cpu_model(), "cores": os.cpu_count(),
            "usable_cores": usable_cores(), "ram_gib": memory_gib(),
            "system": "%s %s" % (platform.system(), platform.machine()),
            "python": platform.python_version(), "mxnet": package_version("mxnet"),
            "numpy": package_version("numpy"), "load_average": load_average(),
            "thread_env": threads}


def git_facts(root=ROOT):
    """The commit checked out in ``root`` and whether its code has changes.

    Changes under ``docs/`` (records and generated tables) do not count.

    Returns
    -------
    dict
        ``commit`` (hex or None outside a git checkout) and ``dirty`` (bool or
        None).
    """
    def git(*args):
        done = subprocess.run(["git", "-C", str(root)] + list(args),
                              capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else None
    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    changes = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                  ":(exclude)docs")
    return {"commit": commit, "dirty": bool(changes)}


def now_utc():
    """The current time in UTC, ISO 8601 to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def command_line(script, argv):
    """The command that reproduces a run, as a shell line.

    Parameters
    ----------
    script : str
        Path of the script from the repository root, e.g. ``scripts/plan_steps.py``.
    argv : list of str
        Its arguments.
    """
    return " ".join(["python", script] + [shlex.quote(a) for a in argv])


# --------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------

def add_record_arguments(parser):
    """Add ``--json PATH`` and ``--record NAME`` to an argument parser.

    Parameters
    ----------
    parser : argparse.ArgumentParser
    """
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--json", default=None, metavar="PATH",
                       help="write the run's record (command, commit, date, "
                            "machine, every figure) to PATH as JSON")
    group.add_argument("--record", default=None, metavar="NAME",
                       help="write the run's record to docs/records/NAME.json, "
                            "where scripts/tables.py reads it")


def record_path(args, records_dir=RECORDS_DIR):
    """Where ``--json`` or ``--record`` asks the record to go (None: nowhere).

    Raises
    ------
    ValueError
        ``--record`` is not a plain name.
    """
    if getattr(args, "json", None):
        return Path(args.json)
    name = getattr(args, "record", None)
    if not name:
        return None
    if not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError("--record takes a name of letters, digits, - and _: %r" % name)
    return Path(records_dir) / (name + ".json")


def start_record(benchmark, script, argv, settings, root=ROOT):
    """A new record, with the facts known at the start of the run.

    Parameters
    ----------
    benchmark : str
        What was measured, e.g. ``"sick_training"``.
    script : str
        The script's path from the repository root.
    argv : list of str
        The script's arguments.
    settings : dict
        The settings the run used (after defaults and ``--quick``).
    root : path, optional
        The repository whose commit is recorded.

    Returns
    -------
    dict
    """
    record = {"schema": SCHEMA, "benchmark": benchmark,
              "command": command_line(script, list(argv)), "argv": list(argv),
              "date": now_utc(), "seconds": None}
    record.update(git_facts(root))
    record.update(machine=machine_facts(), settings=dict(settings), tables={},
                  notes=[])
    record["_started"] = time.perf_counter()
    return record


def finish_record(record, tables, notes=()):
    """Add the run's tables and notes and its duration; return the record.

    Parameters
    ----------
    record : dict
        From :func:`start_record`.
    tables : dict
        Table name -> list of row dicts (named fields).
    notes : iterable of str, optional
    """
    for name, rows in tables.items():
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise TypeError("table %r must be a list of dicts" % name)
        record["tables"][name] = rows
    record["notes"] = list(record.get("notes", [])) + list(notes)
    started = record.pop("_started", None)
    if started is not None:
        record["seconds"] = round(time.perf_counter() - started, 1)
    return record


def plain(value):
    """``value`` as JSON-ready data: floats rounded, NaN and inf as None.

    Tuples become lists, dict keys strings, numpy scalars Python numbers.
    """
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items() if not str(k).startswith("_")}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return int(value)
    if hasattr(value, "item") and callable(value.item):      # numpy scalar
        return plain(value.item())
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return float("%.*g" % (SIGNIFICANT_DIGITS, value))
    return str(value)


def write_record(record, path):
    """Write a record as JSON (atomically: a temporary file, then a rename).

    Parameters
    ----------
    record : dict
    path : str or Path

    Returns
    -------
    Path
    """
    data = plain(record)
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise RecordError("record lacks %s" % ", ".join(missing))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    LOG.info("record written to %s", path)
    return path


def read_record(path):
    """Read and check a record.

    Raises
    ------
    RecordError
        The file is missing, is not JSON or lacks a required key.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecordError("record %s is missing" % path) from None
    except (OSError, ValueError) as err:
        raise RecordError("record %s cannot be read: %s" % (path, err)) from None
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise RecordError("record %s lacks %s" % (path, ", ".join(missing)))
    if data["schema"] != SCHEMA:
        raise RecordError("record %s has schema %r, expected %d"
                          % (path, data["schema"], SCHEMA))
    return data


def save_if_asked(args, benchmark, script, argv, settings, tables, notes=(),
                  record=None):
    """Write the run's record where ``--json``/``--record`` say; return its path.

    Parameters
    ----------
    args : argparse.Namespace
        With ``json`` and ``record``.
    benchmark, script, argv, settings
        See :func:`start_record` (used when ``record`` is None).
    tables : dict
    notes : iterable of str, optional
    record : dict, optional
        Started at the beginning of the run (so the date and load average are
        those of its start).

    Returns
    -------
    Path or None
    """
    path = record_path(args)
    if path is None:
        return None
    if record is None:
        record = start_record(benchmark, script, argv, settings)
    return write_record(finish_record(record, tables, notes), path)


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------

def number_sick_words(pairs):
    """Give every token of SICK pairs a vocabulary id, in place.

    Tokens are lower-cased; ids are given in order of first appearance, so
    the same pairs in the same order always get the same ids.

    Parameters
    ----------
    pairs : list of examples.sick_data.SickPair

    Returns
    -------
    int
        The vocabulary size.
    """
    from examples.sick_data import attach_words  # pylint: disable=import-outside-toplevel
    vocab = {}
    for pair in pairs:
        for tokens, tree in ((pair.a_tokens, pair.a_tree), (pair.b_tokens, pair.b_tree)):
            attach_words(tree, [vocab.setdefault(t.lower(), len(vocab)) for t in tokens])
    return len(vocab)


# --------------------------------------------------------------------------
# Rounds, fresh batches, timing
# --------------------------------------------------------------------------

def rotation(items, round_index):
    """``items`` rotated left by ``round_index`` (mod their number)."""
    items = list(items)
    if not items:
        return []
    k = round_index % len(items)
    return items[k:] + items[:k]


def interleaved(entries, rounds, rotate=True):
    """The order in which systems take their turns: ``(round, entry)`` pairs.

    Round ``r`` gives every entry one turn, in the entries' order, rotated
    left by ``r`` when ``rotate`` is true (so no system always follows the
    same one); without rotation the order is the same every round (system A
    round 1, system B round 1, system A round 2, ...).

    Parameters
    ----------
    entries : sequence
    rounds : int
    rotate : bool, optional

    Yields
    ------
    tuple
        ``(round index, entry)``.
    """
    for r in range(rounds):
        for entry in (rotation(entries, r) if rotate else entries):
            yield r, entry


def batch_seed(seed, purpose, index):
    """A seed for the ``index``-th batch of a kind (``"warmup"``, ``"timed"``...).

    Distinct purposes and indices give distinct, reproducible seeds, none
    equal to ``seed`` itself (which the scripts use for the weights).

    Parameters
    ----------
    seed : int
    purpose : str
    index : int

    Returns
    -------
    int
    """
    value = zlib.crc32(("%d:%s:%d" % (seed, purpose, index)).encode("ascii"))
    return value if value != seed else value + 1


def time_call(function, sync=None, clock=time.perf_counter):
    """Milliseconds of one call of ``function`` between two waits, and its result.

    Parameters
    ----------
    function : callable
        Called without arguments.
    sync : callable, optional
        Waits for pending work (``mx.nd.waitall``); called before the clock
        starts and before it stops.
    clock : callable, optional
        Seconds, monotonic.

    Returns
    -------
    tuple
        ``(ms, result)``.
    """
    if sync is not None:
        sync()
    start = clock()
    result = function()
    if sync is not None:
        sync()
    return 1000.0 * (clock() - start), result


def median(values):
    """Median of ``values``; None when there are none."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def mean(values):
    """Mean of ``values``; None when there are none."""
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


# --------------------------------------------------------------------------
# Tables as text
# --------------------------------------------------------------------------

def cell(value, fmt="%s"):
    """One formatted table cell; ``-`` for None."""
    if value is None:
        return "-"
    if callable(fmt):
        return fmt(value)
    return fmt % value


def text_table(rows, columns):
    """Rows as aligned text lines under a header and a rule.

    Parameters
    ----------
    rows : list of dict
    columns : sequence of tuple
        ``(field, title, fmt)``: the row key, the header and a ``%`` format
        (or a callable) applied to the value.

    Returns
    -------
    list of str
    """
    cells = [[title for _, title, _ in columns]]
    cells += [[cell(row.get(key), fmt) for key, _, fmt in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(line, widths))).rstrip()
             for line in cells]
    return lines[:1] + ["-" * len(lines[0])] + lines[1:]


def markdown_table(header, body):
    """A Markdown table from a header and rows of strings.

    Parameters
    ----------
    header : list of str
    body : list of list of str

    Returns
    -------
    list of str
    """
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return lines


def apply_quick(args, overrides):
    """Apply the settings of ``--quick`` to ``args`` when it asks for them.

    Parameters
    ----------
    args : argparse.Namespace
        With a ``quick`` flag.
    overrides : dict
        Attribute -> value of the short settings.

    Returns
    -------
    dict
        The settings applied (empty without ``--quick``), for the record.
    """
    if not getattr(args, "quick", False):
        return {}
    for key, value in overrides.items():
        setattr(args, key, value)
    return dict(overrides)


def script_argv(argv):
    """``argv`` as given to ``main``, else the process's own arguments."""
    return list(sys.argv[1:] if argv is None else argv)
