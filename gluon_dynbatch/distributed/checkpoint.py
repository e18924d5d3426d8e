"""Checkpoints that no crash can leave half-written.

A checkpoint is a set of files in one directory and a manifest,
``checkpoint.json``, naming them.  Every file is written under a temporary
name, flushed to disk (``fsync``) and renamed into place; the manifest is
written last, the same way.  Renaming is atomic, so at any instant the
manifest on disk is the previous one or the new one, and the files it names
are complete.  Files only the previous manifest named are removed after the
new one is in place.

:func:`latest` reads the manifest back (the launcher names it when it
restarts a job); :func:`atomic_write` serves any other file that must never
be seen half-written (a summary, a figure).

For tests, ``GLUON_DYNBATCH_CHECKPOINT_HOOK=ACTION:PATTERN:N`` acts between
writing the ``N``-th temporary file whose final name matches ``PATTERN``
(``fnmatch``; default ``*``) and renaming it: ``kill`` ends the process
with SIGKILL, ``sleep=SECONDS`` pauses.  Without ``N`` it acts on every
such file.
"""
import fnmatch
import json
import logging
import os
import signal
import time
from pathlib import Path

LOG = logging.getLogger(__name__)

#: Name of the manifest in a checkpoint directory.
MANIFEST = "checkpoint.json"
#: Fault-injection hook, for tests (see the module docstring).
HOOK_ENV = "GLUON_DYNBATCH_CHECKPOINT_HOOK"
FORMAT = 1

_hook_counts = {}


class CheckpointError(RuntimeError):
    """A manifest is unreadable or names a file that is missing."""


def _fsync_dir(directory):
    """Flush a directory entry (a rename) to disk, where the OS allows."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _run_hook(name):
    """Act as ``GLUON_DYNBATCH_CHECKPOINT_HOOK`` says for file ``name``."""
    spec = os.environ.get(HOOK_ENV)
    if not spec:
        return
    action, _, rest = spec.partition(":")
    pattern, _, nth = rest.partition(":")
    if not fnmatch.fnmatch(name, pattern or "*"):
        return
    count = _hook_counts[pattern] = _hook_counts.get(pattern, 0) + 1
    if nth and count != int(nth):
        return
    if action == "kill":
        LOG.warning("%s: killing this process before renaming %s",
                    HOOK_ENV, name)
        os.kill(os.getpid(), signal.SIGKILL)
    elif action.startswith("sleep="):
        time.sleep(float(action.split("=", 1)[1]))


def atomic_write(path, write):
    """Write ``path`` through a temporary file and an atomic rename.

    Parameters
    ----------
    path : str or os.PathLike
        The final file.
    write : callable
        ``write(temp_path)`` writes the whole content to ``temp_path`` (a
        str, as MXNet's savers want one).

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    path = Path(path)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(str(temp))
        with open(temp, "rb+") as handle:
            os.fsync(handle.fileno())
        _run_hook(path.name)
        os.replace(temp, path)
    finally:
        if temp.exists():
            temp.unlink()
    _fsync_dir(path.parent)
    return path


def write_json(path, data):
    """Write ``data`` as JSON to ``path`` atomically."""
    def dump(temp):
        with open(temp, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1, default=str)
            handle.write("\n")
    return atomic_write(path, dump)


def read_manifest(directory):
    """The manifest of ``directory``, or None when it has none.

    Raises
    ------
    CheckpointError
        The manifest is unreadable.
    """
    path = Path(directory) / MANIFEST
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        manifest = json.loads(text)
    except ValueError as err:
        raise CheckpointError(f"{path}: not a checkpoint manifest ({err})") \
            from None
    if not isinstance(manifest, dict) or "files" not in manifest:
        raise CheckpointError(f"{path}: not a checkpoint manifest")
    return manifest


def latest(directory):
    """The last complete checkpoint of ``directory``, or None.

    Returns
    -------
    dict or None
        The manifest, its ``files`` made absolute paths.

    Raises
    ------
    CheckpointError
        The manifest is unreadable or names a file that is missing.
    """
    manifest = read_manifest(directory)
    if manifest is None:
        return None
    files = {}
    for key, name in manifest["files"].items():
        path = Path(directory) / name
        if not path.is_file():
            raise CheckpointError(f"{Path(directory) / MANIFEST} names "
                                  f"{name}, which is missing")
        files[key] = path
    return {**manifest, "files": files}


def commit(directory, files, state):
    """Write a checkpoint: its files, then its manifest, then clean up.

    Parameters
    ----------
    directory : str or os.PathLike
    files : dict
        ``key -> (file name, write)``, each written with
        :func:`atomic_write`; ``write`` may be None for a file already in
        ``directory`` that this checkpoint keeps.
    state : dict
        JSON-serialisable content of the manifest besides the files.

    Returns
    -------
    pathlib.Path
        The manifest.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    previous = read_manifest(directory)
    for name, write in files.values():
        if write is not None:
            atomic_write(directory / name, write)
    names = {key: name for key, (name, _) in files.items()}
    manifest = write_json(directory / MANIFEST,
                          {"format": FORMAT, "files": names, **state})
    kept = set(names.values())
    for name in (previous or {}).get("files", {}).values():
        if name not in kept:
            try:
                (directory / name).unlink()
            except FileNotFoundError:
                pass
    return manifest


def describe(manifest):
    """One line naming a checkpoint, for logs."""
    if manifest is None:
        return "no checkpoint"
    where = ", ".join(f"{key} {manifest[key]}"
                      for key in ("epoch", "batch", "step")
                      if key in manifest)
    return f"checkpoint of {where}" if where else "checkpoint"
