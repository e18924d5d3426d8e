"""What a parameter server runs for :mod:`.server_state`.

A server executes this file when it unpickles a command (``runpy``), while
MXNet is still being imported in that process: so it imports nothing of
gluon_dynbatch, and MXNet only inside functions.  What must outlive one
command (the tracked optimizer, its live states) is kept in a registry
module in ``sys.modules``.
"""
import os
import pickle
import sys
import types

_REGISTRY_NAME = "_gluon_dynbatch_server_state"


def _registry():
    """This process's registry (a namespace kept in ``sys.modules``)."""
    return sys.modules.setdefault(_REGISTRY_NAME,
                                  types.ModuleType(_REGISTRY_NAME)).__dict__


def on_server(action, *args):
    """Run a command; return the optimizer the server installs."""
    if action == "track":
        optimizer, restore = args
        return track(optimizer, restore)
    if action == "save":
        save(args[0])
        return _registry()["optimizer"]
    raise ValueError(f"unknown server command {action!r}")


def track(optimizer, restore):
    """Keep every state ``optimizer`` creates, starting from the states
    saved in the files ``restore``."""
    restored, counts = load(restore)
    live = {}
    create = optimizer.create_state_multi_precision

    def create_state(index, weight):
        key = (index, tuple(weight.shape))
        if key not in live:
            saved = restored.pop(key, None)
            live[key] = (create(index, weight) if saved is None
                         else to_ndarray(saved, weight.context))
        return live[key]

    optimizer.create_state_multi_precision = create_state
    if counts is not None:
        optimizer.num_update = counts["num_update"]
        optimizer._index_update_count.update(  # noqa: SLF001
            counts["index_update_count"])
    _registry().update(optimizer=optimizer, live=live)
    return optimizer


def save(prefix):
    """Write this server's states to ``<prefix>.server<k>.states``
    (temporary file, fsync, rename), ``k`` its smallest key."""
    registry = _registry()
    live = registry.get("live")
    if not live:
        return
    optimizer = registry["optimizer"]
    data = {"states": {key: to_numpy(state) for key, state in live.items()},
            "num_update": optimizer.num_update,
            "index_update_count": dict(
                optimizer._index_update_count)}  # noqa: SLF001
    first = min(str(index) for index, _ in live)
    path = f"{prefix}.server{first}.states"
    temp = f"{path}.{os.getpid()}.tmp"
    with open(temp, "wb") as handle:
        pickle.dump(data, handle, protocol=pickle.HIGHEST_PROTOCOL)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)


def load(paths):
    """States and update counts saved in ``paths`` (every server's)."""
    if not paths:
        return {}, None
    states, counts = {}, {"num_update": 0, "index_update_count": {}}
    for path in paths:
        with open(path, "rb") as handle:
            data = pickle.load(handle)
        states.update(data["states"])
        counts["num_update"] = max(counts["num_update"], data["num_update"])
        counts["index_update_count"].update(data["index_update_count"])
    return states, counts


def to_numpy(state):
    """A state (NDArray, tuple of them, None) as numpy arrays."""
    if isinstance(state, (list, tuple)):
        return type(state)(to_numpy(s) for s in state)
    return state.asnumpy() if hasattr(state, "asnumpy") else state


def to_ndarray(state, ctx):
    """The inverse of :func:`to_numpy`, on ``ctx``."""
    from mxnet.ndarray import array
    if isinstance(state, (list, tuple)):
        return type(state)(to_ndarray(s, ctx) for s in state)
    if state is None or not hasattr(state, "shape"):
        return state
    return array(state, ctx=ctx, dtype=state.dtype)
