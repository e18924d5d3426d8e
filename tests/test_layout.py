"""The package's shape: small modules, imports only in one direction."""
import ast
import os

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "gluon_dynbatch")
MODULES = sorted(name[:-3] for name in os.listdir(PACKAGE) if name.endswith(".py"))
MAX_LINES = 600


def _imports(package, name, modules):
    """The modules of ``package`` that module ``name`` imports (anywhere in it)."""
    with open(os.path.join(package, name + ".py")) as handle:
        tree = ast.parse(handle.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
    return found & set(modules)


def _cycle(package, modules):
    """An import cycle among ``modules`` as a list of names, or None."""
    graph = {name: _imports(package, name, modules) for name in modules}
    state = {}

    def visit(name, path):
        if state.get(name) == "done":
            return None
        if state.get(name) == "open":
            return path[path.index(name):] + [name]
        state[name] = "open"
        for other in sorted(graph[name]):
            found = visit(other, path + [name])
            if found:
                return found
        state[name] = "done"
        return None
    for name in modules:
        found = visit(name, [])
        if found:
            return found
    return None


@pytest.mark.parametrize("name", MODULES)
def test_no_module_is_long(name):
    with open(os.path.join(PACKAGE, name + ".py")) as handle:
        lines = sum(1 for _ in handle)
    assert lines <= MAX_LINES, "%s.py has %d lines" % (name, lines)


def test_imports_have_no_cycle():
    assert _cycle(PACKAGE, MODULES) is None
    # The check sees the package's imports: its entry imports the stages.
    assert {"block", "scope"} <= _imports(PACKAGE, "__init__", MODULES)


def test_the_cycle_check_finds_cycles(tmp_path):
    (tmp_path / "a.py").write_text("from . import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from .c import x\n")
    (tmp_path / "c.py").write_text("from .a import y\n")
    assert _cycle(str(tmp_path), ["a", "b", "c"]) == ["a", "b", "c", "a"]
