"""Data-parallel training on MXNet's parameter server, on loopback.

First the launcher (``gluon_dynbatch.distributed.launch``) with small programs
that import nothing, then jobs of 2 workers and 1 server training the SICK
example's model: parity with one process, a worker killed mid-run, and the
example's ``--workers`` flag.  Every process a test starts carries a tag in its
environment; the tests look for tagged processes in /proc afterwards, and kill
any they find.
"""
import json
import os
import pickle
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import dist_worker  # noqa: E402
from examples import data_parallel  # noqa: E402
from examples import tree_lstm_sick as script  # noqa: E402
from examples.sick_data import random_corpus, write_split  # noqa: E402
from examples.sick_model import make_loss  # noqa: E402
from gluon_dynbatch.distributed import checkpoint, launch  # noqa: E402

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/environ").exists(),
    reason="finding leftover processes needs Linux's /proc")
needs_dist_kvstore = pytest.mark.skipif(
    not mx.runtime.Features().is_enabled("DIST_KVSTORE"),
    reason="this MXNet build has no distributed kvstore (DIST_KVSTORE)")

TAG = "GDB_TEST_JOB"
WORKER = str(Path(__file__).with_name("dist_worker.py"))
#: Deadline of a 4-process MXNet job here: starting takes 6-13 s on 2 cores.
JOB_DEADLINE = 150.0


def left_after_stop(tag, settle=5.0):
    """``tagged_processes(tag)`` once those SIGKILL reached have had ``settle``
    seconds to die: the launcher waits for the processes it started, not for
    what they started in turn (killed with their group, gone a moment later;
    on a loaded machine that moment can be after the launcher returns)."""
    end = time.monotonic() + settle
    left = tagged_processes(tag)
    while left and time.monotonic() < end:
        time.sleep(0.1)
        left = tagged_processes(tag)
    return left


def tagged_processes(tag):
    """Pids of live processes whose environment holds ``TAG=tag``."""
    entry = f"{TAG}={tag}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes()
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:  # gone, or not ours
            continue
        state = stat.rsplit(")", 1)[1].split()[0]
        if entry in environ.split(b"\0") and state != "Z":  # not a zombie
            found.append(int(name))
    return found


@pytest.fixture
def job_tag(monkeypatch):
    """Tag the processes this test starts; kill any left at the end."""
    tag = uuid.uuid4().hex
    monkeypatch.setenv(TAG, tag)
    yield tag
    for pid in tagged_processes(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_python(code, tmp_path, workers=2, servers=1, **kwargs):
    """Run ``python -c code`` as every node of a one-machine job."""
    kwargs.setdefault("deadline", 60.0)
    return launch.run_job([sys.executable, "-c", code],
                          launch.Cluster.local(workers, servers), workers,
                          servers, log_dir=tmp_path, echo=False, **kwargs)


# ---------------------------------------------------------------------------
# The launcher alone


def test_launcher_runs_every_role(tmp_path, job_tag):
    code = ("import os; print(*(os.environ[k] for k in ('DMLC_ROLE', "
            "'DMLC_PS_ROOT_URI', 'DMLC_PS_ROOT_PORT', 'DMLC_NUM_WORKER', "
            "'DMLC_NUM_SERVER', 'DMLC_NODE_HOST')))")
    assert run_python(code, tmp_path, workers=3, servers=2) == 0
    logs = {p.stem: p.read_text().split() for p in tmp_path.glob("*.log")}
    assert sorted(logs) == ["scheduler", "server0", "server1", "worker0",
                            "worker1", "worker2"]
    ports = {words[2] for words in logs.values()}
    assert len(ports) == 1 and int(ports.pop()) > 0
    for name, words in logs.items():
        assert name.startswith(words[0])
        assert words[1] == words[5] == "127.0.0.1"
        assert words[3:5] == ["3", "2"]
    assert left_after_stop(job_tag) == []


#: Every node leaves a grandchild behind in its process group; the first
#: worker to start fails, the other nodes wait.
FAILING_JOB = """
import os, subprocess, sys, time
subprocess.Popen(["sleep", "300"])
first = os.path.join(sys.argv[1], "first")
if os.environ["DMLC_ROLE"] == "worker":
    try:
        os.close(os.open(first, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        pass
    else:
        time.sleep(1)
        print("worker failing now", flush=True)
        sys.exit(3)
time.sleep(300)
"""


def test_launcher_ends_everything_when_one_fails(tmp_path, job_tag,
                                                 caplog):
    start = time.monotonic()
    code = launch.run_job(
        [sys.executable, "-c", FAILING_JOB, str(tmp_path)],
        launch.Cluster.local(2, 1), 2, 1, deadline=60.0, kill_grace=2.0,
        log_dir=tmp_path, echo=False)
    assert code == launch.EXIT_FAILED
    assert time.monotonic() - start < 30
    assert "exit code 3" in caplog.text
    assert "worker failing now" in caplog.text  # the tail of its log
    assert left_after_stop(job_tag) == []


def test_launcher_deadline_escalates_to_sigkill(tmp_path, job_tag, caplog):
    code = ("import signal, time; signal.signal(signal.SIGTERM, "
            "signal.SIG_IGN); print('waiting', flush=True); time.sleep(300)")
    start = time.monotonic()
    code = run_python(code, tmp_path, deadline=2.0, kill_grace=1.0)
    assert code == launch.EXIT_DEADLINE
    assert 2.0 <= time.monotonic() - start < 20
    assert "still running at the deadline" in caplog.text
    assert "did not stop on SIGTERM; killed" in caplog.text
    assert left_after_stop(job_tag) == []


def test_launcher_command_line():
    parser = launch.build_parser()
    for flag in ("--workers", "--servers", "--deadline", "--log-dir",
                 "--scheduler", "--host", "--num-workers", "--run-scheduler",
                 "--max-restarts", "--checkpoint-dir"):
        assert flag in parser.format_help()
    args = parser.parse_args(["--workers", "3", "--", "python", "x.py"])
    cluster, run_scheduler = launch.cluster_from_args(args, parser)
    assert args.command == ["python", "x.py"] and run_scheduler
    assert (cluster.root_host, cluster.host) == ("127.0.0.1", "127.0.0.1")
    assert (cluster.num_workers, cluster.num_servers) == (3, 1)
    assert cluster.root_port > 0

    args = parser.parse_args(
        ["--scheduler", "10.0.0.1:9091", "--host", "10.0.0.2",
         "--num-workers", "4", "--num-servers", "2", "--workers", "2",
         "python", "x.py", "--kvstore", "dist_sync"])
    cluster, run_scheduler = launch.cluster_from_args(args, parser)
    assert not run_scheduler
    assert args.command == ["python", "x.py", "--kvstore", "dist_sync"]
    assert cluster.environ("server") == {
        "DMLC_ROLE": "server", "DMLC_PS_ROOT_URI": "10.0.0.1",
        "DMLC_PS_ROOT_PORT": "9091", "DMLC_NUM_WORKER": "4",
        "DMLC_NUM_SERVER": "2", "DMLC_NODE_HOST": "10.0.0.2"}


#: The first worker of the first run writes a checkpoint manifest and
#: dies; every node of a restarted run records the checkpoint it was given
#: and succeeds.  (Nothing imports mxnet, which would run a node.)
RESTARTED_JOB = """
import json, os, sys, time
from pathlib import Path
out = Path(sys.argv[1])
role, restart = os.environ["DMLC_ROLE"], os.environ["GLUON_DYNBATCH_RESTART"]
if restart == "0":
    if role == "worker":
        try:
            os.close(os.open(out / "first", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            time.sleep(300)
        (out / "ckpt" / "checkpoint.json").write_text(json.dumps(
            {"files": {}, "epoch": 2, "step": 7}))
        sys.exit(5)
    time.sleep(300)
(out / f"{role}-{os.getpid()}").write_text(
    os.environ.get("GLUON_DYNBATCH_RESUME", "none"))
"""


def test_launcher_restarts_a_failed_job(tmp_path, job_tag, caplog):
    (tmp_path / "ckpt").mkdir()
    code = launch.run_job(
        [sys.executable, "-c", RESTARTED_JOB, str(tmp_path)],
        launch.Cluster.local(2, 1), 2, 1, deadline=60.0, kill_grace=2.0,
        log_dir=tmp_path / "logs", echo=False, max_restarts=2,
        checkpoint_dir=tmp_path / "ckpt")
    assert code == 0, caplog.text
    assert "exit code 5" in caplog.text and "restart 1 of 2" in caplog.text
    assert "from the checkpoint of epoch 2, step 7" in caplog.text
    assert "restart 2 of 2" not in caplog.text
    records = {p.name.split("-")[0]: p.read_text()
               for p in tmp_path.iterdir() if "-" in p.name}
    assert sorted(records) == ["scheduler", "server", "worker"]
    assert set(records.values()) == {str(tmp_path / "ckpt")}
    assert (tmp_path / "logs" / "restart1" / "worker1.log").is_file()
    assert left_after_stop(job_tag) == []


def test_launcher_gives_up_after_its_restarts(tmp_path, job_tag, caplog):
    code = launch.run_job(
        [sys.executable, "-c", "import sys, os; sys.exit("
         "3 if os.environ['DMLC_ROLE'] == 'worker' else 0)"],
        launch.Cluster.local(1, 1), 1, 1, deadline=60.0, kill_grace=2.0,
        log_dir=tmp_path, echo=False, max_restarts=1,
        checkpoint_dir=tmp_path / "none")
    assert code == launch.EXIT_FAILED
    assert "restart 1 of 1" in caplog.text and "from the start" in caplog.text
    assert caplog.text.count("exit code 3") == 2
    assert left_after_stop(job_tag) == []


@pytest.mark.parametrize("argv", [
    ["--workers", "2"],
    ["--scheduler", "10.0.0.1:9091", "--", "python", "x.py"],
    ["--scheduler", "10.0.0.1", "--host", "10.0.0.2", "--", "python"],
    ["--num-workers", "4", "--", "python", "x.py"],
    ["--workers", "0", "--", "python", "x.py"],
    ["--max-restarts", "-1", "--", "python", "x.py"],
    ["--scheduler", "10.0.0.1:9091", "--host", "10.0.0.2", "--max-restarts",
     "1", "--", "python", "x.py"],
])
def test_launcher_rejects_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as info:
        launch.main(argv)
    assert info.value.code == 2
    assert "error:" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# Sharding and gradient scale, in one process


def test_shards_make_the_global_batches():
    items = list(range(23))
    two = [list(data_parallel.shard_batches(
        items, 3, np.random.RandomState(1), FakeWorkers(rank, 2)))
        for rank in (0, 1)]
    whole = list(data_parallel.shard_batches(
        items, 6, np.random.RandomState(1), data_parallel.Workers()))
    assert len(two[0]) == len(two[1]) == len(whole) == 3  # 5 pairs dropped
    for part0, part1, batch in zip(two[0], two[1], whole):
        assert len(part0) == len(part1) == 3
        assert part0 + part1 == batch
    assert data_parallel.global_steps(23, 3, FakeWorkers(0, 2)) == 3
    # One process draws the same permutation and keeps every item.
    batches = list(script.iter_batches(items, 6, np.random.RandomState(1)))
    assert sum(batches, [])[:18] == sum(whole, [])


class FakeWorkers(data_parallel.Workers):
    """A worker of a ``dist_sync`` job, without the job."""

    def __init__(self, rank, count, kind="dist_sync"):
        super().__init__(kind, rank, count)


def test_workers_step_size_and_roles(monkeypatch):
    assert FakeWorkers(1, 4).step_size(25) == 100
    assert FakeWorkers(1, 4, "dist_async").step_size(25) == 25
    assert not FakeWorkers(1, 4).chief and FakeWorkers(0, 4).chief
    local = data_parallel.join("local")
    assert not local.distributed and local.chief and local.step_size(7) == 7
    monkeypatch.delenv("DMLC_ROLE", raising=False)
    with pytest.raises(data_parallel.LaunchError, match="gluon_dynbatch"):
        data_parallel.join("dist_sync")


# ---------------------------------------------------------------------------
# Jobs of 2 workers and 1 server


def job_logs(log_dir):
    return "\n".join(f"--- {p.name}\n{launch.log_tail(p)}"
                     for p in sorted(Path(log_dir).glob("*.log")))


def train_one_process(epochs):
    """The model of ``dist_worker`` trained on the global batches here."""
    pairs, table = dist_worker.corpus()
    model, trainer = dist_worker.build(table, data_parallel.Workers())
    initial = {k: v.data().asnumpy().copy()
               for k, v in model.collect_params().items()}
    global_batch = 2 * dist_worker.BATCH
    rng = np.random.RandomState(dist_worker.SEED)
    loss_fn = make_loss()
    for _ in range(epochs):
        for batch in data_parallel.shard_batches(pairs, global_batch, rng,
                                                 data_parallel.Workers()):
            script.train_step(model, trainer, loss_fn, batch, None,
                              dist_worker.L2)
    return model, initial


@needs_dist_kvstore
def test_two_workers_equal_one_process(tmp_path, job_tag):
    epochs = 2
    code = launch.run_job(
        [sys.executable, WORKER, str(tmp_path), str(epochs)],
        launch.Cluster.local(2, 1), 2, 1, deadline=JOB_DEADLINE,
        log_dir=tmp_path / "logs", echo=False)
    assert code == 0, job_logs(tmp_path / "logs")
    assert left_after_stop(job_tag) == []
    ranks = [mx.nd.load(str(tmp_path / f"rank{r}.params")) for r in (0, 1)]
    model, initial = train_one_process(epochs)
    model.save_parameters(str(tmp_path / "one.params"))
    one = mx.nd.load(str(tmp_path / "one.params"))
    assert sorted(ranks[0]) == sorted(ranks[1]) == sorted(one)
    for name in one:
        np.testing.assert_array_equal(ranks[0][name].asnumpy(),
                                      ranks[1][name].asnumpy(), err_msg=name)
        np.testing.assert_allclose(ranks[0][name].asnumpy(),
                                   one[name].asnumpy(), rtol=0, atol=1e-5,
                                   err_msg=name)
    moved = [np.abs(p.data().asnumpy() - initial[k]).max()
             for k, p in model.collect_params().items()]
    assert min(moved) > 1e-4, moved  # every parameter trained


@needs_dist_kvstore
def test_killed_worker_ends_the_job(tmp_path, job_tag):
    deadline = JOB_DEADLINE
    command = [sys.executable, "-m", "gluon_dynbatch.distributed.launch",
               "--workers", "2", "--deadline", str(deadline),
               "--kill-grace", "3", "--log-dir", str(tmp_path / "logs"),
               "--quiet", "--",
               sys.executable, WORKER, str(tmp_path), "0"]
    start = time.monotonic()
    proc = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        pid_files = [tmp_path / f"rank{r}.pid" for r in (0, 1)]
        while not all(p.exists() for p in pid_files):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() - start < deadline - 30, "no training"
            time.sleep(0.2)
        os.kill(int(pid_files[1].read_text()), signal.SIGKILL)
        killed = time.monotonic()
        _, err = proc.communicate(timeout=deadline)
        stopped = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == launch.EXIT_FAILED, err
    assert "killed by SIGKILL" in err and "worker" in err, err
    assert stopped < 20, stopped  # at once, not at the deadline
    assert time.monotonic() - start < deadline
    assert left_after_stop(job_tag) == []


@pytest.fixture(scope="module")
def job_sick(tmp_path_factory):
    """A small generated SICK: 16 training pairs."""
    root = tmp_path_factory.mktemp("sick")
    for split, n, seed in (("train", 16, 40), ("dev", 8, 41),
                           ("test", 8, 42)):
        write_split(random_corpus(n, seed=seed), root, split)
    return root


def job_flags(sick_dir, save_dir):
    """The example's flags for a job of 2 workers of 2 pairs (global
    batches of 4, 4 steps an epoch), 3 epochs, a checkpoint every step."""
    return ["--data-dir", str(sick_dir), "--save-dir", str(save_dir),
            "--epochs", "3", "--batch-size", "2", "--memory", "10",
            "--hidden", "6", "--glove", "random", "--log-interval", "1",
            "--checkpoint-every", "1", "--tune-embeddings", "--lr", "0.3",
            "--workers", "2", "--max-restarts", "1", "--deadline",
            str(JOB_DEADLINE)]


@pytest.fixture(scope="module")
def uninterrupted_job(job_sick, tmp_path_factory):
    """``script.main(... --workers 2)``: exit code, run directory and the
    processes it left behind."""
    save_dir = tmp_path_factory.mktemp("job") / "run"
    with pytest.MonkeyPatch.context() as patch:
        tag = uuid.uuid4().hex
        patch.setenv(TAG, tag)
        code = script.main(job_flags(job_sick, save_dir))
        left = left_after_stop(tag)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    return code, save_dir, left


@needs_dist_kvstore
def test_example_trains_with_two_workers(uninterrupted_job):
    code, save_dir, left = uninterrupted_job
    assert code == 0, job_logs(save_dir / "logs")
    assert left == []
    summary = json.loads((save_dir / "summary.json").read_text())
    assert (summary["kvstore"], summary["workers"]) == ("dist_sync", 2)
    assert summary["best_dev"]["epoch"] in (1, 2, 3)
    assert set(summary["test"]) == {"pearson", "spearman", "mse"}
    assert summary["train_pairs_per_s"] > 0
    assert summary["curves"][0]["train_loss"] and len(
        summary["curves"][0]["dev"]) == 3
    assert (save_dir / "best.params").is_file()
    assert (save_dir / "curves.png").is_file()
    # The server wrote its optimiser state (AdaGrad's history of every
    # parameter) into the checkpoint.
    files = checkpoint.latest(save_dir)["files"]
    assert sorted(files) == ["params", "server_states0"]
    with open(files["server_states0"], "rb") as handle:
        states = pickle.load(handle)["states"]
    params = mx.nd.load(str(files["params"]))
    assert sorted(int(np.prod(shape)) for _, shape in states) == sorted(
        v.size for v in params.values())  # a server's arrays are flat
    assert all(np.abs(v).max() > 0 for v in states.values())
    assert not (save_dir / "logs" / "restart1").exists()
    # Rank 0 reports; the other worker logs no INFO line.
    logs = [(save_dir / "logs" / f"worker{i}.log").read_text()
            for i in (0, 1)]
    assert sorted("rank 0 of 2" in log for log in logs) == [False, True]
    assert sum(" INFO " in log for log in logs) == 1
    assert sum("test (sick): pearson" in log for log in logs) == 1


def worker_pids(tag):
    """Pids of the live workers among the processes tagged ``tag``."""
    found = []
    for pid in tagged_processes(tag):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"DMLC_ROLE=worker" in environ:
            found.append(pid)
    return found


def wait_for_step(proc, save_dir, step):
    """Wait until the job in ``save_dir`` has checkpointed ``step``."""
    start = time.monotonic()
    while True:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - start < JOB_DEADLINE / 2, "no training"
        if (save_dir / "checkpoint.json").exists():
            if checkpoint.read_manifest(save_dir)["step"] >= step:
                return
        time.sleep(0.1)


@pytest.mark.slow  # two starts of a 4-process job: about 25 s here
@needs_dist_kvstore
def test_lost_worker_job_restarts_from_its_checkpoint(
        job_sick, uninterrupted_job, tmp_path, job_tag):
    save_dir = tmp_path / "run"
    # Each checkpoint pauses, so that the job is still training at the kill.
    env = {**os.environ, checkpoint.HOOK_ENV: "sleep=0.3:checkpoint.json"}
    proc = subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "examples" / "tree_lstm_sick.py"),
         *job_flags(job_sick, save_dir)], cwd=REPO_ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        wait_for_step(proc, save_dir, 3)
        os.kill(worker_pids(job_tag)[0], signal.SIGKILL)
        out, err = proc.communicate(timeout=JOB_DEADLINE)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err + job_logs(save_dir / "logs")
    assert "killed by SIGKILL" in err and "restart 1 of 1" in err, err
    assert "from the checkpoint of epoch" in err, err
    assert (save_dir / "logs" / "restart1" / "worker0.log").is_file()
    assert left_after_stop(job_tag) == []
    assert "test (sick): pearson" in out
    # The same job, never interrupted: the same parameters and figures.
    _, reference, _ = uninterrupted_job
    final = {name: mx.nd.load(str(checkpoint.latest(d)["files"]["params"]))
             for name, d in (("restarted", save_dir), ("once", reference))}
    for key, value in final["once"].items():
        np.testing.assert_allclose(final["restarted"][key].asnumpy(),
                                   value.asnumpy(), rtol=0, atol=1e-6,
                                   err_msg=key)
    job, once = (json.loads((d / "summary.json").read_text())
                 for d in (save_dir, reference))
    assert [d["epoch"] for d in job["curves"][0]["dev"]] == [1, 2, 3]
    for got, want in zip(job["curves"][0]["dev"], once["curves"][0]["dev"]):
        for key in ("pearson", "spearman", "mse"):
            assert got[key] == pytest.approx(want[key], abs=1e-6), key
    assert job["test"] == pytest.approx(once["test"], abs=1e-6)


def test_example_distributed_flags(tmp_path, capsys, monkeypatch):
    with pytest.raises(SystemExit):
        script.main(["--help"])
    text = capsys.readouterr().out
    for flag in ("--kvstore", "--workers", "--servers", "--deadline"):
        assert flag in text
    monkeypatch.delenv("DMLC_ROLE", raising=False)
    base = ["--data-dir", str(tmp_path / "none"), "--save-dir",
            str(tmp_path / "run")]
    assert script.main(base + ["--kvstore", "dist_sync"]) == 2
    assert "gluon_dynbatch.distributed.launch" in capsys.readouterr().err
    for extra in (["--compare", "2"], ["--ensemble", "2"]):
        assert script.main(base + ["--workers", "2", *extra]) == 2
        assert "--workers" in capsys.readouterr().err
    assert script.main(base + ["--workers", "2", "--servers", "0"]) == 2
    assert not (tmp_path / "run").exists()
