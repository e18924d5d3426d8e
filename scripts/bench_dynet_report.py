"""Tables, files and plot of ``scripts/bench_dynet.py`` (no mxnet, no dynet).

:func:`build_report` turns the results of every workload into rows: one
summary row per system (throughput, ratios, loss gaps), one row per system
saying how it ran (process, threads, warm-up, timed batches, rounds), the
gluon_dynbatch figures and the batch-size sweep. :func:`markdown` renders
them, :func:`write_outputs` writes Markdown, CSV, JSON and the PNG.
"""
import csv
import json
import os
import platform

import benchlib
from bench_dynet_common import DYNET_SKIP, MODES, STAT_MS, SWEEP_DIMS

REFERENCES = (("eager", "x_eager"), ("dynet-1", "x_dynet"),
              ("hand-sparse", "x_hand_sparse"))
"""Ratios every row gets: system key of the reference, column suffix."""


def _result(run, key, mode, size=None):
    """The summary of ``key`` in ``mode`` (at ``size``, or its only size)."""
    by_size = run["results"].get(key, {}).get(mode, {})
    if size is None:
        return next(iter(by_size.values()), None)
    return by_size.get(size)


def loss_gap(result, reference):
    """Relative differences of the losses both runs computed.

    Returns
    -------
    tuple of float or None
        ``(first, largest)``: the gap on the first batch (same weights, a
        pure forward comparison) and the largest over the common batches
        (training lets float rounding, and a different optimiser rule, drift
        through the updates).
    """
    gaps = [abs(a - b) / max(abs(b), 1e-12)
            for a, b in zip(result["losses"], reference["losses"])]
    return (gaps[0], max(gaps)) if gaps else (None, None)


def _reference_key(run):
    """Key of the system whose losses the others are compared with."""
    keys = [s["key"] for s in run["specs"] if s["key"] in run["results"]]
    if "eager" in keys:
        return "eager"
    return keys[0] if keys else None


def summary_rows(name, run, size=None):
    """One row per system of a workload (at ``size``): figures and ratios."""
    ref_key = _reference_key(run)
    ref_label = next((s["label"] for s in run["specs"] if s["key"] == ref_key), None)
    rows = []
    for spec in run["specs"]:
        row = {"workload": name, "system": spec["label"], "key": spec["key"],
               "kind": spec["kind"], "size": size, "loss_reference": ref_label,
               "note": run["failures"].get(spec["key"], "")}
        if spec["key"] in run["skipped"]:
            row["note"] = DYNET_SKIP
        for mode in MODES:
            res = _result(run, spec["key"], mode, size)
            ref = _result(run, ref_key, mode, size) if ref_key else None
            row[mode] = res["sentences_per_s"] if res else None
            row[mode + "_ms"] = res["median_ms"] if res else None
            row[mode + "_batches"] = res["batches"] if res else 0
            row[mode + "_rounds"] = res["rounds"] if res else 0
            row[mode + "_cut"] = bool(res and res["cut"])
            first, largest = (loss_gap(res, ref) if res and ref
                              and spec["key"] != ref_key else (None, None))
            row[mode + "_loss_gap_first"] = first
            row[mode + "_loss_gap"] = largest
        rows.append(row)
    by_key = {row["key"]: row for row in rows}
    for row in rows:
        for mode in MODES:
            for ref_key_, suffix in REFERENCES:
                ref = by_key.get(ref_key_)
                value = None
                if ref is not None and ref[mode] and row[mode]:
                    value = row[mode] / ref[mode]
                row["%s_%s" % (mode, suffix)] = value
    return rows


def process_rows(name, run):
    """How each system of a workload ran: process, threads, batches, rounds."""
    rows = []
    for spec in run["specs"]:
        env = run["envs"].get(spec["key"], {})
        row = {"workload": name, "system": spec["label"], "key": spec["key"],
               "pid": env.get("pid"), "hosted": env.get("hosted"),
               "cores": env.get("cores"), "os_threads": env.get("os_threads"),
               "max_rss_mb": env.get("max_rss_mb")}
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                    "MXNET_CPU_WORKER_NTHREADS"):
            row[var] = env.get(var)
        for mode in MODES:       # summed over the sizes of a sweep
            found = list(run["results"].get(spec["key"], {}).get(mode, {}).values())
            row[mode + "_warmup"] = found[0]["warmup_batches"] if found else None
            row[mode + "_batches"] = sum(res["batches"] for res in found)
            row[mode + "_rounds"] = sum(res["rounds"] for res in found)
            row[mode + "_timing"] = found[0]["timing"] if found else None
        rows.append(row)
    return rows


def gdb_rows(name, run):
    """gluon_dynbatch's own figures (training) per gluon_dynbatch system."""
    rows = []
    for spec in run["specs"]:
        res = _result(run, spec["key"], "train")
        if spec["kind"] != "gdb" or not res or "stats" not in res:
            continue
        row = {"workload": name, "system": spec["label"]}
        row.update({k: res["stats"].get(k) for k in STAT_MS + (
            "nodes", "steps", "mean_batch_size")})
        row["nodes"] = row["nodes"] / max(res["batches"], 1)
        rows.append(row)
    return rows


def sweep_rows(run):
    """Batch-size rows: one per size and system, ratios to DyNet."""
    sizes = sorted({size for modes in run["results"].values()
                    for by_size in modes.values() for size in by_size})
    rows = []
    for size in sizes:
        rows += summary_rows("batchsize", run, size)
    return rows


def threads_text(args, envs):
    """How many threads the workers used, in words."""
    gluon = next((e for e in envs if e.get("side") == "gluon"), {})
    dynet = next((e for e in envs if e.get("side") == "dynet"), {})
    if args.threads:
        head = "--threads %d: every worker pinned to %d core(s) with " \
               "OMP/MKL/OpenBLAS/MXNet engine threads = %d" % (
                   args.threads, args.threads, args.threads)
    else:
        head = "machine defaults (OMP_NUM_THREADS=%s, %s cores)" % (
            gluon.get("OMP_NUM_THREADS") or "unset",
            len(gluon.get("cores") or []) or "?")
    return "%s; OS threads per process after the run: Gluon %s, DyNet %s" % (
        head, gluon.get("os_threads", "?"), dynet.get("os_threads", "?"))


def how_text(args):
    """The paragraph that says how every system was run and timed."""
    processes = ("each Gluon system in a worker process of its own"
                 if args.gluon_processes == "system" else
                 "the Gluon systems of a workload in one shared worker process")
    train = ("each batch timed alone between two waits for MXNet; median over "
             "batches" if not args.train_back_to_back else
             "like inference")
    return (
        "How the systems ran: %s, each DyNet setting in its own (configured "
        "before import); the driver sends requests over pipes, one worker "
        "computes at a time. Per mode, every system warms up on the same %d "
        "batch(es) (initial weights, fresh optimiser and block), then is "
        "timed on the same %d batches that follow, in rounds of %d batch(es) "
        "per system, the systems' order rotating each round. Training "
        "(forward, backward, update): %s. Inference (forward, same loss): a "
        "round's batches back to back, one wait at the end; median over "
        "rounds of sentences/s of the block. Figures are sentences/s; "
        "'x eager', 'x DyNet-ab' and 'x hand-sparse' divide by eager Gluon, "
        "DyNet autobatch=1 and the sparse hand-batched model."
        % (processes, args.warmup, args.batches, args.round_batches, train))


def profile_text(profiles):
    """Readable text of the workers' ``profile`` results."""
    out = []
    for prof in profiles:
        stats = prof["stats"]
        total = sum(ms for name, ms in prof["phases"] if not name.startswith(" "))
        out.append("%s, %d trees (%d tree nodes), one training batch: %.1f ms"
                   % (prof["label"], prof["trees"], prof["tree_nodes"], total))
        for name, ms in prof["phases"]:
            out.append("  %-56s %8.1f ms  %5.1f%%"
                       % (name, ms, 100.0 * ms / total if total else 0.0))
        out.append("  scope.stats: record %.1f ms, plan %.1f ms, execute "
                   "%.1f ms (compile %.1f ms); %d calls recorded (%.2f us "
                   "each) in %d nodes, %d steps, mean batch %.1f, cache %d hit / %d miss"
                   % (stats["record_ms"], stats["plan_ms"], stats["execute_ms"],
                      stats["compile_ms"], stats["calls"], stats["us_per_call"],
                      stats["nodes"],
                      stats["steps"], stats["mean_batch_size"],
                      stats["cache_hits"], stats["cache_misses"]))
        for key, title in (("operators", "top operators"),
                           ("api", "top MXNet C API calls")):
            out.append("  %s (mx.profiler, one more batch):" % title)
            if not prof[key]:
                out.append("    (mx.profiler returned no rows)")
            for op in prof[key]:
                out.append("    %-40s %8.2f ms  %6d calls"
                           % (op["op"][:40], op["total_ms"], op["count"]))
        out.append("  top Python functions by own time (cProfile, one more batch):")
        out += ["    " + line for line in prof["python"].splitlines()]
        out.append("")
    return "\n".join(out)


def build_report(runs, args, notes, loads):
    """The report dict of a whole run.

    Parameters
    ----------
    runs : dict
        Workload name -> ``bench_dynet.run_workload`` result.
    args : argparse.Namespace
    notes : list of str
    loads : dict
        ``load_start``, ``load_end``, ``workload_loads``.
    """
    workloads, processes, gdb, sweep, profiles, raw = {}, {}, [], [], [], {}
    envs = []
    for name, run in runs.items():
        raw[name] = run["results"]
        envs += list(run["envs"].values())
        processes[name] = process_rows(name, run)
        gdb += gdb_rows(name, run)
        profiles += run.get("profiles") or []
        for key, text in run["failures"].items():
            notes.append("%s, %s: %s" % (name, key, text))
        if name == "batchsize":
            sweep = sweep_rows(run)
        else:
            workloads[name] = summary_rows(name, run)
    mxnet = next((e.get("mxnet") for e in envs if e.get("mxnet")), None)
    env = dict(loads, cpu_count=os.cpu_count(), machine=platform.machine(),
               python=platform.python_version(), mxnet=mxnet,
               threads=threads_text(args, envs), argv=args.argv)
    return {"env": env, "how": how_text(args), "workloads": workloads,
            "processes": processes, "gdb": gdb, "sweep": sweep,
            "notes": notes, "profile": profile_text(profiles) if profiles
            else None, "raw": raw}


def _fmt(value, digits=1):
    """Number for a table; '-' for None."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return "%.*f" % (digits, value)
    return str(value)


def _ratio(value):
    """Ratio for a table, e.g. '1.23x'."""
    return "-" if value is None else "%.2fx" % value


def _gaps(row):
    """'first / max' relative loss gaps of a summary row over both modes."""
    firsts = [row[m + "_loss_gap_first"] for m in MODES
              if row[m + "_loss_gap_first"] is not None]
    largest = [row[m + "_loss_gap"] for m in MODES
               if row[m + "_loss_gap"] is not None]
    if not firsts:
        return "-"
    return "%.1e / %.1e" % (max(firsts), max(largest))


REFERENCE_NAMES = {"x_eager": "eager", "x_dynet": "DyNet-ab",
                   "x_hand_sparse": "hand-sparse"}


def _summary_lines(rows):
    """The summary table; ratio columns only for references that ran."""
    suffixes = [suffix for _, suffix in REFERENCES
                if any(row["train_" + suffix] or row["infer_" + suffix] for row in rows)]
    ratios = [(mode, suffix) for mode in MODES for suffix in suffixes]
    header = (["system", "train sent/s", "infer sent/s"]
              + ["%s x %s" % (mode, REFERENCE_NAMES[suffix]) for mode, suffix in ratios]
              + ["loss gap vs %s, 1st batch / max"
                 % (rows[0]["loss_reference"] if rows else "-")])
    body = []
    for row in rows:
        cut = " (cut)" if row["train_cut"] or row["infer_cut"] else ""
        name = row["system"] + cut + (" (%s)" % row["note"] if row["note"] else "")
        body.append([name, _fmt(row["train"]), _fmt(row["infer"])]
                    + [_ratio(row["%s_%s" % pair]) for pair in ratios] + [_gaps(row)])
    return benchlib.markdown_table(header, body)


def _process_lines(rows):
    header = ["system", "process", "cores", "OMP / MKL / MXNet engine threads",
              "OS threads", "peak RSS MB", "warm-up batches", "timed batches train / infer",
              "rounds train / infer", "timing train / infer"]
    body = []
    for row in rows:
        where = "-" if row["pid"] is None else "pid %s, %s" % (
            row["pid"], "own" if row["hosted"] == 1
            else "shared by %s systems" % row["hosted"])
        threads = " / ".join(row[v] or "unset" for v in (
            "OMP_NUM_THREADS", "MKL_NUM_THREADS", "MXNET_CPU_WORKER_NTHREADS"))
        cores = ",".join(str(c) for c in row["cores"] or []) or "-"
        body.append([row["system"], where, cores, threads, _fmt(row["os_threads"]),
                     _fmt(row["max_rss_mb"], 0), _fmt(row["train_warmup"]),
                     "%d / %d" % (row["train_batches"], row["infer_batches"]),
                     "%d / %d" % (row["train_rounds"], row["infer_rounds"]),
                     "%s / %s" % (_timing(row["train_timing"]),
                                  _timing(row["infer_timing"]))])
    return benchlib.markdown_table(header, body)


def _timing(kind):
    return {"batch": "per batch, synced", "block": "per round, back to back"}.get(
        kind, "-")


def markdown(report):
    """The Markdown report (also printed)."""
    env = report["env"]
    lines = ["# gluon_dynbatch vs eager Gluon, hand-batched MXNet and DyNet", "",
             "Machine: %s, %s CPUs, Python %s, mxnet %s; threads: %s; "
             "1-minute load average %s at the start, %s at the end, %s at the "
             "start of each workload (other jobs share the machine)."
             % (env["machine"], env["cpu_count"], env["python"],
                env.get("mxnet") or "?", env["threads"], env["load_start"],
                env["load_end"], ", ".join(env["workload_loads"]) or "-"),
             "", report["how"], ""]
    for name, rows in report["workloads"].items():
        lines += ["## %s" % name, ""] + _summary_lines(rows) + [""]
        lines += ["How each system ran:", ""]
        lines += _process_lines(report["processes"][name]) + [""]
    if report["gdb"]:
        lines += ["## gluon_dynbatch per training batch (medians)", ""]
        header = ["workload", "system", "record ms", "plan ms", "execute ms",
                  "compile ms", "nodes", "mean batch"]
        lines += benchlib.markdown_table(header, [
            [r["workload"], r["system"], _fmt(r["record_ms"]), _fmt(r["plan_ms"]),
             _fmt(r["execute_ms"]), _fmt(r["compile_ms"]), _fmt(r["nodes"], 0),
             _fmt(r["mean_batch_size"])] for r in report["gdb"]])
        lines.append("")
    if report["sweep"]:
        lines += ["## Batch size (treelstm %d/%d)" % SWEEP_DIMS, ""]
        header = ["trees per batch", "system", "train sent/s", "infer sent/s",
                  "train x DyNet-ab", "infer x DyNet-ab"]
        lines += benchlib.markdown_table(header, [
            [str(r["size"]), r["system"], _fmt(r["train"]), _fmt(r["infer"]),
             _ratio(r["train_x_dynet"]), _ratio(r["infer_x_dynet"])] for r in report["sweep"]])
        lines += ["", "How each system ran:", ""]
        lines += _process_lines(report["processes"]["batchsize"]) + [""]
    if report["notes"]:
        lines += ["## Notes", ""] + ["- " + n for n in report["notes"]] + [""]
    if report.get("profile"):
        lines += ["## Profile of one treelstm training batch", "", "```",
                  report["profile"], "```", ""]
    return "\n".join(lines)


CSV_FIELDS = ("table", "workload", "system", "size", "train", "infer",
              "train_ms", "infer_ms", "train_batches", "infer_batches",
              "train_rounds", "infer_rounds", "train_x_eager", "train_x_dynet",
              "train_x_hand_sparse", "infer_x_eager", "infer_x_dynet",
              "infer_x_hand_sparse", "train_loss_gap_first", "train_loss_gap",
              "infer_loss_gap_first", "infer_loss_gap", "note", "pid", "hosted",
              "os_threads", "max_rss_mb", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
              "MXNET_CPU_WORKER_NTHREADS", "train_warmup", "train_timing",
              "infer_timing") + STAT_MS + ("nodes", "mean_batch_size")


def write_csv(path, report):
    """One CSV: summary, processes, gluon_dynbatch and batch-size rows."""
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for table, groups in (("summary", report["workloads"].values()),
                              ("processes", report["processes"].values()),
                              ("gluon_dynbatch", [report["gdb"]]),
                              ("batch_size", [report["sweep"]])):
            for rows in groups:
                for row in rows:
                    writer.writerow(dict(row, table=table))


def record_tables(report):
    """The report's tables for the run's record: named lists of rows.

    ``summary`` holds every workload's rows (each names its workload),
    ``processes`` how each system ran, ``gluon_dynbatch`` the library's own
    figures per training batch and ``batch_size`` the sweep.
    """
    return {"summary": [row for rows in report["workloads"].values() for row in rows],
            "processes": [row for rows in report["processes"].values() for row in rows],
            "gluon_dynbatch": list(report["gdb"]), "batch_size": list(report["sweep"])}


def plot_sweep(path, rows):
    """Sentences/s against batch size, one panel per mode (PNG)."""
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    systems = list(dict.fromkeys(r["system"] for r in rows))
    sizes = sorted({r["size"] for r in rows})
    for ax, mode in zip(axes, MODES):
        for system in systems:
            pts = [(r["size"], r[mode]) for r in rows
                   if r["system"] == system and r[mode]]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                        label=system)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes)
        ax.set_xticklabels([str(n) for n in sizes])
        ax.set_yscale("log")
        ax.set_xlabel("trees per batch")
        ax.set_ylabel("sentences/s")
        ax.set_title("%s, Tree-LSTM %d/%d on SST" % ((mode,) + SWEEP_DIMS))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(out_dir, report):
    """bench_dynet.md, .csv, .json and (after a sweep) batch_size.png."""
    (out_dir / "bench_dynet.md").write_text(markdown(report) + "\n")
    write_csv(out_dir / "bench_dynet.csv", report)
    if report["sweep"]:
        plot_sweep(out_dir / "batch_size.png", report["sweep"])
    with open(out_dir / "bench_dynet.json", "w") as handle:
        json.dump(report, handle, indent=1, default=str)
