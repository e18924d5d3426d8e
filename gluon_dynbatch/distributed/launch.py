"""Start a job on MXNet's parameter server (the ps-lite ``dist_*`` kvstore).

One machine: a scheduler, ``--servers`` servers and ``--workers`` workers on
127.0.0.1, on a free port::

    python -m gluon_dynbatch.distributed.launch --workers 2 -- \\
        python examples/tree_lstm_sick.py --kvstore dist_sync

Every process runs the same command; MXNet tells them apart by the
environment variables set here (``DMLC_ROLE`` and the rest).  For a server
or the scheduler, ``import mxnet`` runs the node and exits; a worker runs the
script, which creates its kvstore with ``mx.kv.create("dist_sync")``.

Several machines: run the launcher on each, pointing all of them at one
scheduler with ``--scheduler HOST:PORT``, giving the totals with
``--num-workers`` and ``--num-servers``, this machine's address with
``--host``, and ``--run-scheduler`` on the machine at ``HOST``.

Nothing in ps-lite exits by itself when a node dies: the others wait for it
forever.  So the launcher watches its processes, each in its own process
group.  As soon as one fails, or the ``--deadline`` passes, it ends every
group it started (SIGTERM, then SIGKILL after ``--kill-grace`` seconds),
prints the tail of the failing node's log and exits non-zero.

With ``--max-restarts N`` (one machine), a job that loses a process is
started again, every process anew on a new port, up to N times, within the
same deadline.  When ``--checkpoint-dir DIR`` holds a complete checkpoint
written during this job (:mod:`gluon_dynbatch.distributed.checkpoint`), the
new processes find ``GLUON_DYNBATCH_RESUME=DIR`` in their environment and
resume from it; the log names what died and the checkpoint used.  Every
process sees the restart count in ``GLUON_DYNBATCH_RESTART``.  A restart's
logs go to ``LOG_DIR/restart<k>/``.
"""
import argparse
import dataclasses
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from gluon_dynbatch.distributed import checkpoint

LOG = logging.getLogger(__name__)

#: Exit code when the deadline passes (as ``timeout(1)``).
EXIT_DEADLINE = 124
#: Exit code when a node fails or the launcher is interrupted.
EXIT_FAILED = 1
#: Lines of a log shown when its node fails.
TAIL_LINES = 25
LOOPBACK = "127.0.0.1"
#: Set in the processes of a restarted job: the checkpoint directory to
#: resume from.
RESUME_ENV = "GLUON_DYNBATCH_RESUME"
#: Set in every process of a job: how many times it was restarted.
RESTART_ENV = "GLUON_DYNBATCH_RESTART"
POLL_SECONDS = 0.1


@dataclass
class Cluster:
    """Where the scheduler listens and how many nodes the whole job has.

    Parameters
    ----------
    root_host : str
        Address of the scheduler (``DMLC_PS_ROOT_URI``).
    root_port : int
        Its port (``DMLC_PS_ROOT_PORT``).
    num_workers, num_servers : int
        Workers and servers of the whole job, on every machine.
    host : str
        Address this machine's nodes bind to and announce
        (``DMLC_NODE_HOST``).
    """

    root_host: str
    root_port: int
    num_workers: int
    num_servers: int
    host: str = LOOPBACK

    @classmethod
    def local(cls, num_workers, num_servers, host=LOOPBACK):
        """A job on this machine alone, on ``host`` and a free port."""
        return cls(host, free_port(host), num_workers, num_servers, host)

    def environ(self, role):
        """The ``DMLC_*`` variables of a node of ``role``."""
        return {"DMLC_ROLE": role,
                "DMLC_PS_ROOT_URI": self.root_host,
                "DMLC_PS_ROOT_PORT": str(self.root_port),
                "DMLC_NUM_WORKER": str(self.num_workers),
                "DMLC_NUM_SERVER": str(self.num_servers),
                "DMLC_NODE_HOST": self.host}


@dataclass
class Node:
    """One process started by the launcher, and its log."""

    name: str
    role: str
    process: subprocess.Popen
    log_path: Path
    pumps: list = field(default_factory=list)   # threads copying output
    log: object = None                           # the log file they write

    @property
    def returncode(self):
        """The exit code, or None while the process runs."""
        return self.process.poll()


class Interrupted(Exception):
    """The launcher received SIGINT, SIGTERM or SIGHUP."""


def free_port(host=LOOPBACK):
    """A TCP port on ``host`` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _writer(stream):
    """A function writing bytes to ``stream``, binary or text."""
    binary = getattr(stream, "buffer", None)
    if binary is not None:
        return binary.write, binary.flush
    return (lambda chunk: stream.write(chunk.decode("utf-8", "replace")),
            stream.flush)


def _pump(source, sinks, lock):
    """Copy bytes from ``source`` to every ``(write, flush)`` of ``sinks``
    until EOF."""
    with source:
        while True:
            chunk = os.read(source.fileno(), 65536)
            if not chunk:
                return
            with lock:
                for write, flush in sinks:
                    try:
                        write(chunk)
                        flush()
                    except (OSError, ValueError):  # a closed terminal
                        pass


def start_node(command, name, role, env, log_dir, echo):
    """Start ``command`` as node ``name`` in a process group of its own.

    Its output goes to ``log_dir/name.log``; a worker's stdout and stderr
    are also copied to the launcher's when ``echo`` is true.

    Returns
    -------
    Node
    """
    log_path = Path(log_dir) / f"{name}.log"
    log = open(log_path, "wb")
    if not echo:
        process = subprocess.Popen(command, env=env, stdout=log,
                                   stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL,
                                   start_new_session=True)
        log.close()  # the child holds its own descriptor
        return Node(name, role, process, log_path)
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL,
                               start_new_session=True)
    lock = threading.Lock()
    node = Node(name, role, process, log_path, log=log)
    for source, out in ((process.stdout, sys.stdout),
                        (process.stderr, sys.stderr)):
        sinks = [(log.write, log.flush), _writer(out)]
        pump = threading.Thread(target=_pump, args=(source, sinks, lock),
                                name=f"launch-{name}", daemon=True)
        pump.start()
        node.pumps.append(pump)
    return node


def signal_group(node, signum):
    """Send ``signum`` to the process group of ``node``; False if gone."""
    try:
        os.killpg(node.process.pid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def stop_all(nodes, grace):
    """Stop the process groups of ``nodes``: SIGTERM, then SIGKILL.

    Groups are signalled even when their first process has exited, so that
    nothing it started stays behind.  Waits for every process.
    """
    for node in nodes:
        signal_group(node, signal.SIGTERM)
    end = time.monotonic() + grace
    while time.monotonic() < end and any(n.returncode is None
                                         for n in nodes):
        time.sleep(POLL_SECONDS)
    for node in nodes:
        if signal_group(node, signal.SIGKILL) and node.returncode is None:
            LOG.warning("%s (pid %d) did not stop on SIGTERM; killed",
                        node.name, node.process.pid)
    for node in nodes:
        node.process.wait()
    close_pumps(nodes)


def close_pumps(nodes, timeout=2.0):
    """Wait for the output copiers of ``nodes`` and close their logs."""
    for node in nodes:
        for pump in node.pumps:
            pump.join(timeout)
        if node.log is not None:
            node.log.close()
        node.pumps, node.log = [], None


def log_tail(path, lines=TAIL_LINES):
    """The last ``lines`` lines of a log (progress-bar redraws split)."""
    try:
        text = Path(path).read_bytes().decode("utf-8", "replace")
    except OSError as err:
        return f"(cannot read {path}: {err})"
    rows = [row for row in text.replace("\r", "\n").split("\n")
            if row.strip()]
    return "\n".join(rows[-lines:])


def describe_exit(code):
    """``exit code 3`` or ``killed by SIGKILL``."""
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def report(node, why):
    """Log why the job failed, with the tail of ``node``'s log."""
    LOG.error("%s (pid %d) %s; its log %s ends:\n%s", node.name,
              node.process.pid, why, node.log_path, log_tail(node.log_path))


def watch(nodes, deadline, shutdown_grace):
    """Wait until every node is done, one fails or the deadline passes.

    Returns
    -------
    tuple of (Node or None, str or None, int)
        ``(None, None, 0)`` when every process exited with 0.  Otherwise the
        node to blame, why, and the launcher's exit code: a node that exits
        non-zero fails the job (:data:`EXIT_FAILED`); at the deadline a node
        still running is blamed, a worker if any (:data:`EXIT_DEADLINE`).
        When every worker is done but servers or the scheduler outlive them
        by ``shutdown_grace`` seconds, the job still succeeds (they are
        stopped).
    """
    start = time.monotonic()
    workers = [n for n in nodes if n.role == "worker"]
    workers_done = None
    while True:
        for node in nodes:
            code = node.returncode
            if code not in (None, 0):
                return node, describe_exit(code), EXIT_FAILED
        running = [n for n in nodes if n.returncode is None]
        if not running:
            return None, None, 0
        now = time.monotonic()
        if now - start > deadline:
            late = [n for n in running if n.role == "worker"] or running
            return (late[0], f"still running at the deadline "
                    f"({deadline:g} s)", EXIT_DEADLINE)
        if workers and workers_done is None and all(
                n.returncode == 0 for n in workers):
            workers_done = now
        if workers_done is not None and now - workers_done > shutdown_grace:
            LOG.warning("every worker finished; stopping %s, still running",
                        ", ".join(n.name for n in running))
            return None, None, 0
        time.sleep(POLL_SECONDS)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _raise_interrupted(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


def _set_signal_handlers(handler):
    """Set ``handler`` for :data:`STOP_SIGNALS`; return the ones replaced.

    Does nothing outside the main thread, where Python cannot set them.
    """
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {signum: signal.signal(signum, handler)
            for signum in STOP_SIGNALS}


def _restore_signal_handlers(saved):
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def node_names(workers, servers, run_scheduler):
    """``(name, role)`` of the processes to start on this machine."""
    names = [("scheduler", "scheduler")] if run_scheduler else []
    names += [(f"server{i}", "server") for i in range(servers)]
    names += [(f"worker{i}", "worker") for i in range(workers)]
    return names


def run_job(command, cluster, workers, servers, run_scheduler=True,
            deadline=3600.0, log_dir=None, kill_grace=5.0, echo=True,
            shutdown_grace=30.0, max_restarts=0, checkpoint_dir=None):
    """Start this machine's nodes of a job, watch them, stop them all.

    Parameters
    ----------
    command : list of str
        The program every node runs (``[sys.executable, "train.py", ...]``).
    cluster : Cluster
        The scheduler's address and the job's totals.
    workers, servers : int
        Workers and servers to start on this machine.
    run_scheduler : bool, optional
        Start the scheduler here (on exactly one machine of the job).
    deadline : float, optional
        Seconds after which every process is stopped and the job fails.
    log_dir : str or os.PathLike, optional
        Where ``scheduler.log``, ``server<i>.log`` and ``worker<i>.log``
        go; default a new temporary directory.
    kill_grace : float, optional
        Seconds between SIGTERM and SIGKILL when stopping.
    echo : bool, optional
        Copy the workers' output to this process's stdout and stderr.
    shutdown_grace : float, optional
        Seconds servers and the scheduler may outlive the last worker.
    max_restarts : int, optional
        Times to start the job again when one of its processes fails (not
        at the deadline, nor when the launcher is interrupted).  Only for a
        job wholly on this machine (``run_scheduler`` and
        ``cluster.num_workers == workers``).
    checkpoint_dir : str or os.PathLike, optional
        Where the job writes its checkpoints; a restart resumes from the
        last complete one written since the job started.

    Returns
    -------
    int
        0 when every process succeeded; :data:`EXIT_FAILED` when one
        failed (after the last restart) or the launcher was interrupted;
        :data:`EXIT_DEADLINE` when the deadline passed.
    """
    if max_restarts and not (run_scheduler and
                             cluster.num_workers == workers and
                             cluster.num_servers == servers):
        raise ValueError("max_restarts restarts a job that runs wholly on "
                         "this machine")
    if log_dir is None:
        log_dir = tempfile.mkdtemp(prefix="gluon_dynbatch-launch-")
    started, restarts, extra_env = time.time(), 0, {RESTART_ENV: "0"}
    end = time.monotonic() + deadline
    while True:
        attempt_dir = Path(log_dir) / (f"restart{restarts}" if restarts
                                       else "")
        failed, why, code = run_attempt(
            command, cluster, workers, servers, run_scheduler,
            end - time.monotonic(), attempt_dir, kill_grace, echo,
            shutdown_grace, extra_env)
        if failed is None or code != EXIT_FAILED or restarts >= \
                max_restarts:
            if failed is not None:
                report(failed, why)
            return code
        restarts += 1
        extra_env = restart_env(failed, why, restarts, max_restarts,
                                checkpoint_dir, started)
        cluster = dataclasses.replace(cluster,
                                      root_port=free_port(cluster.host))


def restart_env(failed, why, restarts, max_restarts, checkpoint_dir,
                since):
    """Log the failure and the checkpoint a restart resumes from; return
    the environment the restarted processes get."""
    manifest = None
    if checkpoint_dir is not None:
        try:
            manifest = checkpoint.latest(checkpoint_dir)
        except checkpoint.CheckpointError as err:
            LOG.error("%s; the job starts over", err)
        path = Path(checkpoint_dir) / checkpoint.MANIFEST
        if manifest is not None and path.stat().st_mtime < since:
            manifest = None  # an earlier job's
    if manifest is None:
        source = "from the start (no complete checkpoint of this job)"
    else:
        source = (f"from the {checkpoint.describe(manifest)} in "
                  f"{Path(checkpoint_dir) / checkpoint.MANIFEST}")
    LOG.error("%s (pid %d) %s; its log %s ends:\n%s", failed.name,
              failed.process.pid, why, failed.log_path,
              log_tail(failed.log_path))
    LOG.warning("restart %d of %d: every process stopped; starting the "
                "job again %s", restarts, max_restarts, source)
    env = {RESTART_ENV: str(restarts)}
    if manifest is not None:
        env[RESUME_ENV] = str(Path(checkpoint_dir))
    return env


def run_attempt(command, cluster, workers, servers, run_scheduler,
                deadline, log_dir, kill_grace, echo, shutdown_grace,
                extra_env):
    """Start the nodes once, watch them, stop them all.

    Returns
    -------
    tuple of (Node or None, str or None, int)
        As :func:`watch`; ``(None, None, EXIT_FAILED)`` when interrupted or
        a process could not start.
    """
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    LOG.info("scheduler %s:%d, %d worker(s) and %d server(s) in all; "
             "here %d worker(s), %d server(s)%s; logs in %s",
             cluster.root_host, cluster.root_port, cluster.num_workers,
             cluster.num_servers, workers, servers,
             " and the scheduler" if run_scheduler else "", log_dir)
    env = {**os.environ, **extra_env}
    env.setdefault("PYTHONUNBUFFERED", "1")
    nodes = []
    failed, why, code = None, None, EXIT_FAILED
    saved = _set_signal_handlers(_raise_interrupted)
    try:
        for name, role in node_names(workers, servers, run_scheduler):
            nodes.append(start_node(
                command, name, role, {**env, **cluster.environ(role)},
                log_dir, echo and role == "worker"))
        failed, why, code = watch(nodes, max(deadline, 0.0), shutdown_grace)
    except Interrupted as err:
        LOG.error("interrupted by %s; stopping every process", err)
    except OSError as err:
        LOG.error("cannot start %s: %s", command[0], err)
    finally:
        _set_signal_handlers(signal.SIG_IGN)  # stopping is not interrupted
        try:
            stop_all(nodes, kill_grace)
        finally:
            _restore_signal_handlers(saved)
    return failed, why, code


def build_parser():
    """Return the parser of ``python -m gluon_dynbatch.distributed.launch``.

    Returns
    -------
    argparse.ArgumentParser
    """
    parser = argparse.ArgumentParser(
        prog="python -m gluon_dynbatch.distributed.launch",
        description="Run COMMAND as the scheduler, servers and workers of "
                    "an MXNet parameter-server job (kvstore dist_sync or "
                    "dist_async). Without --scheduler, the whole job runs "
                    "on this machine, on 127.0.0.1 and a free port.",
        epilog="Several machines: on each, give --scheduler HOST:PORT, "
               "--num-workers, --num-servers and --host (this machine's "
               "address); add --run-scheduler on the machine HOST.")
    add = parser.add_argument
    add("--workers", type=int, default=1,
        help="worker processes on this machine (default: %(default)s)")
    add("--servers", type=int, default=1,
        help="server processes on this machine (default: %(default)s)")
    add("--deadline", type=float, default=3600.0, metavar="SECONDS",
        help="stop everything and fail after this long "
             "(default: %(default)g)")
    add("--log-dir", default=None,
        help="where each process's log goes (default: a new temporary "
             "directory)")
    add("--kill-grace", type=float, default=5.0, metavar="SECONDS",
        help="wait between SIGTERM and SIGKILL (default: %(default)g)")
    add("--quiet", action="store_true",
        help="do not copy the workers' output here; logs only")
    add("--max-restarts", type=int, default=0, metavar="N",
        help="when a process of the job dies, stop every process and "
             "start the job again, up to N times (one machine only; "
             "default: %(default)s)")
    add("--checkpoint-dir", default=None, metavar="DIR",
        help="where the job writes its checkpoints (checkpoint.json): a "
             "restart resumes from the last complete one, passed to the "
             "processes as " + RESUME_ENV + "=DIR")
    add("--scheduler", default=None, metavar="HOST:PORT",
        help="address of the job's scheduler, for a job on several "
             "machines (default: start one here on 127.0.0.1)")
    add("--run-scheduler", action="store_true",
        help="with --scheduler: start the scheduler on this machine")
    add("--num-workers", type=int, default=None,
        help="workers of the whole job (default: --workers)")
    add("--num-servers", type=int, default=None,
        help="servers of the whole job (default: --servers)")
    add("--host", default=None,
        help="address of this machine that the other nodes reach "
             "(DMLC_NODE_HOST; default 127.0.0.1, needed with "
             "--scheduler)")
    add("command", nargs=argparse.REMAINDER,
        help="the program to run, after --")
    return parser


def cluster_from_args(args, parser):
    """Check the arguments; return the :class:`Cluster` and whether this
    machine runs the scheduler."""
    command = args.command[1:] if args.command[:1] == ["--"] else \
        args.command
    if not command:
        parser.error("no command given (put it after --)")
    args.command = command
    if args.workers < 0 or args.servers < 0:
        parser.error("--workers and --servers must not be negative")
    total_w = args.workers if args.num_workers is None else args.num_workers
    total_s = args.servers if args.num_servers is None else args.num_servers
    if total_w < 1 or total_s < 1 or total_w < args.workers or \
            total_s < args.servers:
        parser.error("a job needs at least one worker and one server, and "
                     "--num-workers/--num-servers count every machine's")
    if args.max_restarts < 0:
        parser.error("--max-restarts must not be negative")
    if args.scheduler is None:
        if args.run_scheduler or (total_w, total_s) != (args.workers,
                                                        args.servers):
            parser.error("--run-scheduler, --num-workers and --num-servers "
                         "go with --scheduler HOST:PORT")
        return Cluster.local(total_w, total_s, args.host or LOOPBACK), True
    root, _, port = args.scheduler.rpartition(":")
    if not root or not port.isdigit():
        parser.error(f"--scheduler wants HOST:PORT, not {args.scheduler!r}")
    if args.host is None:
        parser.error("--scheduler needs --host, this machine's address")
    if args.max_restarts:
        parser.error("--max-restarts restarts a job on one machine; each "
                     "launcher of a job on several machines sees only its "
                     "own processes")
    return (Cluster(root, int(port), total_w, total_s, args.host),
            args.run_scheduler)


def main(argv=None):
    """Command-line entry point; returns the exit code of :func:`run_job`."""
    parser = build_parser()
    args = parser.parse_args(argv)
    cluster, run_scheduler = cluster_from_args(args, parser)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO,
                            format="launch: %(message)s")
    return run_job(args.command, cluster, args.workers, args.servers,
                   run_scheduler=run_scheduler, deadline=args.deadline,
                   log_dir=args.log_dir, kill_grace=args.kill_grace,
                   echo=not args.quiet, max_restarts=args.max_restarts,
                   checkpoint_dir=args.checkpoint_dir)


if __name__ == "__main__":
    sys.exit(main())
