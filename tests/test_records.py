"""The benchmarks' records and the generated tables of the docs (fast, no benchmark runs).

* ``scripts/benchlib.py``: records written and read back, their checks, the
  machine and commit facts, the order of interleaved rounds, fresh seeds,
  timing with a fake clock;
* the scripts' interleaving: user_models_bench alternates eager and batched
  rounds on new batches after the same warm-up; bench_core rotates its
  modes; benchmark.py interleaves its second and back-to-back passes;
* ``scripts/tables.py`` on fixture records: tables written between their
  markers, ``--check`` passing, then failing (and naming the table) when a
  record changes, is missing, or a table is unknown or missing;
* the repository's own docs match their committed records.
"""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = REPO_ROOT / "scripts"
for _path in (str(REPO_ROOT), str(SCRIPTS), str(REPO_ROOT / "tests")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import benchlib  # noqa: E402
import tables  # noqa: E402


# ------------------------------------------------------------------ records

def _record(**tables_):
    record = benchlib.start_record("demo", "scripts/demo.py", ["--quick", "--x", "a b"],
                                   {"quick": True})
    return benchlib.finish_record(record, tables_, notes=["a note"])


def test_a_record_holds_command_commit_date_machine_and_rows(tmp_path):
    record = _record(rows=[{"name": "a", "ms": 1.23456789, "bad": float("nan")}])
    path = benchlib.write_record(record, tmp_path / "sub" / "demo.json")
    back = benchlib.read_record(path)
    assert back["command"] == "python scripts/demo.py --quick --x 'a b'"
    assert back["argv"] == ["--quick", "--x", "a b"]
    assert len(back["commit"]) == 40 and isinstance(back["dirty"], bool)
    assert back["date"][:2] == "20" and back["date"].endswith("+00:00")
    machine = back["machine"]
    assert machine["cores"] >= 1 and machine["python"].count(".") == 2
    assert machine["mxnet"] == "1.9.1" and len(machine["load_average"]) == 3
    assert back["tables"]["rows"] == [{"name": "a", "ms": 1.23457, "bad": None}]
    assert back["notes"] == ["a note"] and back["seconds"] >= 0
    assert "_started" not in back and not list(tmp_path.glob("sub/*.tmp"))


def test_reading_a_bad_record_says_what_is_wrong(tmp_path):
    with pytest.raises(benchlib.RecordError, match="missing"):
        benchlib.read_record(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(benchlib.RecordError, match="cannot be read"):
        benchlib.read_record(tmp_path / "bad.json")
    record = benchlib.plain(_record(rows=[]))
    del record["commit"]
    (tmp_path / "short.json").write_text(json.dumps(record))
    with pytest.raises(benchlib.RecordError, match="lacks commit"):
        benchlib.read_record(tmp_path / "short.json")
    record = benchlib.plain(_record(rows=[]))
    record["schema"] = 99
    (tmp_path / "new.json").write_text(json.dumps(record))
    with pytest.raises(benchlib.RecordError, match="schema"):
        benchlib.read_record(tmp_path / "new.json")
    with pytest.raises(TypeError):
        benchlib.finish_record(benchlib.start_record("d", "s.py", [], {}), {"t": [1, 2]})


def test_plain_makes_json_ready_data():
    import numpy as np
    data = benchlib.plain({"a": (1, np.float32(0.5)), 2: [math.inf, True, None],
                           "_private": 1, "n": np.int64(3)})
    assert data == {"a": [1, 0.5], "2": [None, True, None], "n": 3}
    json.dumps(data, allow_nan=False)


def test_record_path_from_the_command_line():
    import argparse
    parser = argparse.ArgumentParser()
    benchlib.add_record_arguments(parser)
    assert benchlib.record_path(parser.parse_args([])) is None
    assert benchlib.record_path(parser.parse_args(["--json", "x/y.json"])) == Path("x/y.json")
    named = benchlib.record_path(parser.parse_args(["--record", "sick_training"]))
    assert named == benchlib.RECORDS_DIR / "sick_training.json"
    assert benchlib.RECORDS_DIR == REPO_ROOT / "docs" / "records"
    with pytest.raises(ValueError):
        benchlib.record_path(parser.parse_args(["--record", "../x"]))
    with pytest.raises(SystemExit):
        parser.parse_args(["--record", "a", "--json", "b"])


def test_machine_facts_from_proc_files(tmp_path):
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nmodel name\t: Test CPU 9000\n")
    (tmp_path / "meminfo").write_text("MemTotal:       24641536 kB\nMemFree: 1 kB\n")
    assert benchlib.cpu_model(str(tmp_path / "cpuinfo")) == "Test CPU 9000"
    assert benchlib.memory_gib(str(tmp_path / "meminfo")) == 23.5
    assert benchlib.memory_gib(str(tmp_path / "none")) is None


def test_git_facts_outside_a_repository(tmp_path):
    assert benchlib.git_facts(tmp_path) == {"commit": None, "dirty": None}


# ------------------------------------------------------------------ rounds

def test_interleaved_rounds_rotate_or_alternate():
    assert list(benchlib.interleaved("abc", 3)) == [
        (0, "a"), (0, "b"), (0, "c"), (1, "b"), (1, "c"), (1, "a"),
        (2, "c"), (2, "a"), (2, "b")]
    assert list(benchlib.interleaved(["eager", "batched"], 2, rotate=False)) == [
        (0, "eager"), (0, "batched"), (1, "eager"), (1, "batched")]
    assert list(benchlib.interleaved([], 3)) == []


def test_batch_seeds_are_distinct_and_reproducible():
    seeds = [benchlib.batch_seed(0, purpose, i) for purpose in ("warmup", "timed")
             for i in range(50)]
    assert len(set(seeds)) == len(seeds) and 0 not in seeds
    assert seeds == [benchlib.batch_seed(0, purpose, i) for purpose in ("warmup", "timed")
                     for i in range(50)]
    assert benchlib.batch_seed(1, "timed", 0) != benchlib.batch_seed(0, "timed", 0)


class FakeClock:
    """Seconds that advance only when told to."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_time_call_waits_around_the_call_and_reads_the_clock():
    clock, events = FakeClock(), []

    def work():
        events.append("work")
        clock.now += 0.25
        return "result"

    ms, result = benchlib.time_call(work, sync=lambda: events.append("sync"), clock=clock)
    assert (ms, result) == (250.0, "result")
    assert events == ["sync", "work", "sync"]


def test_user_models_bench_alternates_eager_and_batched_on_new_batches():
    import user_models_bench as umb
    clock, log = FakeClock(), []
    cost = {"eager": 0.5, "batched": 0.1}

    def run(system, batch):
        def work():
            if isinstance(batch, int):                  # timed: odd batches take twice as long
                clock.now += cost[system] * (1 + batch % 2)
        log.append((system, batch))
        return benchlib.time_call(work, clock=clock)[0], None

    runs = umb.run_rounds(["w0", "w1", 0, 1, 2], run, warmup=2)
    assert log == [("eager", "w0"), ("batched", "w0"), ("eager", "w1"), ("batched", "w1"),
                   ("eager", 0), ("batched", 0), ("eager", 1), ("batched", 1),
                   ("eager", 2), ("batched", 2)]
    assert [ms for ms, _ in runs["eager"]] == [500.0, 1000.0, 500.0]

    class Stats:
        def __init__(self, steps):
            self.steps, self.mean_batch_size, self.flushes = steps, 2.0, 1
            self.nodes, self.us_per_call, self.planners = 10, 1.5, {"depth": 1}
    runs["batched"] = [(ms, Stats(k + 1)) for k, (ms, _) in enumerate(runs["batched"])]
    row = umb.summarize("case", 8, "", runs)
    assert row["eager_ms"] == 500.0 and row["batched_ms"] == pytest.approx(100.0)
    assert row["x_eager"] == pytest.approx(5.0) and row["steps"] == 2.0
    assert row["planner"] == "depth" and row["rounds"] == 3


def test_user_models_bench_batches_hold_new_samples_for_the_same_model():
    import user_models_bench as umb
    import user_models as um
    case = um.CASES["lstm_cell"](seed=0, n=4, hidden=4)
    seeds = [benchlib.batch_seed(0, "timed", k) for k in (0, 0, 1)]
    fresh, again, other = [umb.fresh_batch(case, "lstm_cell", seed, 4, 4) for seed in seeds]
    assert fresh.model is case.model and fresh.inputs is case.inputs
    assert len(fresh.samples) == 4 and fresh.samples != case.samples
    assert again.samples == fresh.samples and other.samples != fresh.samples


def test_bench_core_rotates_its_modes_after_a_common_warm_up():
    import bench_core
    log = []
    runs = bench_core.run_rounds(["eager", "depth", "agenda"], ["w", 0, 1], 1,
                                 lambda mode, batch: log.append((mode, batch)) or (1.0, None))
    assert log == [("eager", "w"), ("depth", "w"), ("agenda", "w"),
                   ("eager", 0), ("depth", 0), ("agenda", 0),
                   ("depth", 1), ("agenda", 1), ("eager", 1)]
    assert [len(v) for v in runs.values()] == [2, 2, 2]


def test_benchmark_passes_are_interleaved_and_back_to_back_runs_new_batches(monkeypatch):
    import argparse
    import benchmark
    log = []

    class FakeRunner:
        def __init__(self, name):
            self.name = name

        def step(self, batch, sync=True):
            log.append((self.name, batch, sync))
            return {"total_ms": 1.0}

    args = argparse.Namespace(warmup=1, batches=2, eager_batches=2, no_back_to_back=False,
                              round_batches=1, no_second_pass=False)
    batches = list(range(10))
    systems = [benchmark.System("e", "eager", None, None),
               benchmark.System("c", "compiled", "depth", None)]
    assert benchmark.system_batches(systems[0], args, batches) == ([0], [1, 2], [3, 4])
    assert benchmark.system_batches(systems[1], args, batches) == ([0], [1, 2], [3, 4])
    monkeypatch.setattr(benchmark, "nd", type("nd", (), {"waitall": staticmethod(lambda: None)}))
    entries = [benchmark.Timed(s, FakeRunner(s.name), [1, 2], [3, 4]) for s in systems]
    benchmark.time_all_passes(entries, args)
    assert log == [("e", 1, True), ("c", 1, True), ("c", 2, True), ("e", 2, True),
                   ("c", 1, True), ("c", 2, True),                  # again: caching kinds
                   ("e", 3, False), ("c", 3, False), ("c", 4, False), ("e", 4, False)]
    assert [len(e.b2b) for e in entries] == [2, 2] and not entries[0].again


# ------------------------------------------------------------------ tables

def _write(path, record):
    benchlib.write_record(record, path)
    return record


def _fixture(root):
    """A repository with records for sick_training and soak and a doc holding their tables."""
    records = root / "docs" / "records"
    sick = _record(systems=[
        {"system": "eager", "kind": "eager", "model": "cell", "strategy": None,
         "budget": None, "trees_per_s": 50.0, "available": True},
        {"system": "imperative-depth", "kind": "imperative", "model": "cell",
         "strategy": "depth", "budget": None, "trees_per_s": 1000.0, "vs_eager": 20.0,
         "cache_hits": 0, "cache_misses": 0},
        {"system": "handbatched", "kind": "handbatched", "model": "cell", "strategy": None,
         "budget": None, "trees_per_s": 2000.0, "cache_hits": 3, "cache_misses": 1}],
        epoch=[])
    _write(records / "sick_training.json", sick)
    _write(records / "soak.json", _record(soak=[{"batches": 600, "verdict": "PASS"}]))
    doc = root / "docs" / "benchmarks.md"
    doc.write_text("# B\n\ntext\n\n<!-- table: sick_training -->\n<!-- end table -->\n\n"
                   "more\n<!-- table: soak -->\nold\n<!-- end table -->\n")
    return doc


@pytest.fixture
def fixture_root(tmp_path, monkeypatch):
    """Only the fixture's two tables are required of docs/benchmarks.md."""
    monkeypatch.setattr(tables, "TABLES", {
        name: tables.TABLES[name] for name in ("sick_training", "soak", "readme_performance")})
    _fixture(tmp_path)
    return tmp_path


def test_tables_are_written_between_their_markers(fixture_root):
    assert tables.main(["--root", str(fixture_root), "--check"]) == 1
    assert tables.main(["--root", str(fixture_root)]) == 0
    text = (fixture_root / "docs" / "benchmarks.md").read_text()
    assert text.startswith("# B\n\ntext\n\n<!-- table: sick_training -->\nMeasured on 20")
    assert "`python scripts/demo.py --quick --x 'a b'`" in text
    assert "record [sick_training](records/sick_training.json)" in text
    assert "Quick settings (`--quick`)" in text
    assert "| imperative, depth | cell | 1000.0 | - |" in text
    assert "| hand-batched | cell | 2000.0 |" in text and "75% (3 of 4)" in text
    assert "| Tree-LSTM | 600 | - | - | - | - | - | - | - | - | - | PASS |" in text
    assert "old" not in text and text.endswith("<!-- end table -->\n")
    assert tables.main(["--root", str(fixture_root), "--check"]) == 0


def test_check_names_a_stale_table(fixture_root, capsys):
    tables.main(["--root", str(fixture_root)])
    path = fixture_root / "docs" / "records" / "soak.json"
    record = benchlib.read_record(path)
    record["tables"]["soak"][0]["verdict"] = "FAIL"
    path.write_text(json.dumps(record))
    capsys.readouterr()
    assert tables.main(["--root", str(fixture_root), "--check"]) == 1
    err = capsys.readouterr().err
    assert "table soak differs from its record(s) soak" in err and "sick_training" not in err
    assert "PASS" in (fixture_root / "docs" / "benchmarks.md").read_text()   # unchanged


def test_check_names_a_missing_record_an_unknown_and_a_missing_table(fixture_root, capsys):
    tables.main(["--root", str(fixture_root)])
    (fixture_root / "docs" / "records" / "soak.json").unlink()
    doc = fixture_root / "docs" / "benchmarks.md"
    doc.write_text(doc.read_text().replace("sick_training -->", "sick_trainin -->"))
    capsys.readouterr()
    assert tables.main(["--root", str(fixture_root), "--check"]) == 1
    err = capsys.readouterr().err
    assert "table soak: record" in err and "soak.json is missing" in err
    assert "unknown table 'sick_trainin'" in err
    assert "table sick_training is missing (no markers)" in err
    assert tables.main(["--root", str(fixture_root)]) == 1          # nothing to write from


def test_the_readme_table_is_generated_only_where_its_markers_are(fixture_root):
    readme = fixture_root / "README.md"
    readme.write_text("# R\n\nno table here\n")
    dynet = _record(summary=[
        {"workload": "treelstm 128/128", "key": "eager", "train": 9.0},
        {"workload": "treelstm 128/128", "key": "gdb-cell-depth:imperative", "train": 360.0,
         "train_x_eager": 40.0},
        {"workload": "treelstm 128/128", "key": "dynet-1", "train": 1400.0}])
    _write(fixture_root / "docs" / "records" / "dynet_race.json", dynet)
    assert tables.main(["--root", str(fixture_root)]) == 0
    assert readme.read_text() == "# R\n\nno table here\n"
    readme.write_text("# R\n\n<!-- table: readme_performance -->\n<!-- end table -->\n")
    assert tables.main(["--root", str(fixture_root), "--check"]) == 1
    assert tables.main(["--root", str(fixture_root)]) == 0
    text = readme.read_text()
    assert "record [sick_training](docs/records/sick_training.json)" in text
    assert "record [dynet_race](docs/records/dynet_race.json)" in text
    assert "| SICK Child-Sum Tree-LSTM, cell-written (trees/s) | 50 | 1,000 (20.0x) | 2,000 | - |" \
        in text
    assert "| SST Tree-LSTM 128/128, cell-written (sentences/s) | 9 | 360 (40.0x) | - | 1,400 |" \
        in text


def test_every_table_names_records_and_a_known_file():
    for name, table in tables.TABLES.items():
        assert table.records and table.doc in tables.DOCS + (None,), name
    assert tables.required_tables("README.md") == []


def test_the_docs_tables_match_the_committed_records():
    done = subprocess.run([sys.executable, str(SCRIPTS / "tables.py"), "--check"],
                          capture_output=True, text=True, timeout=120, cwd=str(REPO_ROOT))
    assert done.returncode == 0, done.stderr
    for name in ("sick_training", "user_models", "plan_steps", "dynet_race"):
        assert (REPO_ROOT / "docs" / "records" / (name + ".json")).is_file(), name


def test_refresh_script_runs_every_recorded_benchmark():
    text = (SCRIPTS / "refresh_records.sh").read_text()
    records = {r for table in tables.TABLES.values() for r in table.records}
    for name in records:
        assert "[%s]=" % name in text, name
    assert os.access(SCRIPTS / "refresh_records.sh", os.X_OK)


def test_plan_steps_names_a_case_that_fails_instead_of_stopping():
    import plan_steps
    err = RuntimeError("running failed: Traceback\n  File x\nMXNetError: expected [16,8]\n")
    assert plan_steps.failure_text(err) == "RuntimeError (MXNetError: expected [16,8])"
    assert plan_steps.failure_text(ValueError("x" * 500)).endswith("...")
    assert len(plan_steps.failure_text(ValueError("x" * 500))) == 160


def test_quick_settings_are_applied_and_named_above_the_table():
    import argparse
    args = argparse.Namespace(quick=True, batches=30)
    assert benchlib.apply_quick(args, {"batches": 2}) == {"batches": 2} and args.batches == 2
    args = argparse.Namespace(quick=False, batches=30)
    assert benchlib.apply_quick(args, {"batches": 2}) == {} and args.batches == 30
    record = {"date": "2026-01-02T03:04:05+00:00", "command": "python s.py --quick",
              "commit": "abc", "machine": {"load_average": [1.25, 1.0, 1.0]},
              "settings": {"quick": {"round_batches": 1}}, "dirty": True}
    line = tables.source_line("x", record, "records/x.json")
    assert line.startswith("Measured on 2026-01-02 by `python s.py --quick` (commit `abc`;")
    assert "load average 1.2 at the start); record [x](records/x.json)." in line
    assert "which sets `--round-batches 1`" in line and "not committed" in line
    record["settings"], record["dirty"] = {"quick": {}}, False
    assert "Quick" not in tables.source_line("x", record, "x.json")


def test_sick_words_get_one_id_per_lower_cased_token():
    from examples.sick_data import SickPair, parse_parents
    two = [2, 0]
    pairs = [SickPair(["A", "dog"], ["a", "cat"], parse_parents(two), parse_parents(two), 3.0),
             SickPair(["The", "Dog"], ["dog"], parse_parents(two), parse_parents([0]), 1.0)]
    assert benchlib.number_sick_words(pairs) == 4
    words = [sorted((n.index, n.word) for n in tree.postorder())
             for pair in pairs for tree in (pair.a_tree, pair.b_tree)]
    assert words == [[(0, 0), (1, 1)], [(0, 0), (1, 2)], [(0, 3), (1, 1)], [(0, 1)]]
