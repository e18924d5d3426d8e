"""The package's shape: one subpackage per stage, imports only from earlier stages.

The stages, in the order the data passes through them, are the subpackages
of ``STAGES``.  A module may import from its own stage and from earlier ones,
never from a later one; the modules every stage shares (``FOUNDATION``)
import no stage; the entry modules (``ENTRY``) wire the stages together and
may import any.  No import circle exists anywhere, in the package, the
scripts or the examples.
"""
import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "gluon_dynbatch")
STAGES = ("ir", "record", "rewrite", "templates", "rules", "plan", "run")
FOUNDATION = ("errors", "logs", "stats")
ENTRY = ("__init__", "block", "scope")
APART = ("distributed",)        # not part of the pipeline: imports no stage


def _modules(folder, prefix):
    """Dotted names of the Python modules under ``folder`` -> their file paths."""
    found = {}
    for where, _dirs, files in os.walk(folder):
        if "__pycache__" in where:
            continue
        rel = os.path.relpath(where, folder)
        parts = [] if rel == "." else rel.split(os.sep)
        for name in files:
            if name.endswith((".py", ".pyx")):
                stem = name.rsplit(".", 1)[0]
                dotted = ".".join([prefix] + parts + ([] if stem == "__init__" else [stem]))
                found[dotted] = os.path.join(where, name)
    return found


def _imports(dotted, path, known, is_package):
    """The modules of ``known`` that module ``dotted`` imports (anywhere in it)."""
    with open(path) as handle:
        source = handle.read()
    if path.endswith(".pyx"):                   # Cython: its Python imports only
        source = "\n".join(line for line in source.splitlines()
                           if re.match(r"(import [\w.]+|from [\w.]+ import )", line))
    tree = ast.parse(source)
    package = dotted if is_package else dotted.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                root = ".".join(base + ([node.module] if node.module else []))
            else:
                root = node.module or ""
            subs = ["%s.%s" % (root, alias.name) for alias in node.names]
            # ``from . import mod`` imports the module, not what the package imports.
            names = subs if all(sub in known for sub in subs) else [root] + subs
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != dotted:
                found.add(name)
    return found


def _graph(folder, prefix):
    modules = _modules(folder, prefix)
    return {name: _imports(name, path, modules, path.endswith("__init__.py"))
            for name, path in modules.items()}


def _place(module):
    """(stage index or None, kind) of a module of the package."""
    parts = module.split(".")
    first = parts[1] if len(parts) > 1 else "__init__"
    if first in STAGES:
        return STAGES.index(first), "stage"
    if first in FOUNDATION:
        return -1, "foundation"
    if first in APART:
        return None, "apart"
    return None, "entry"


def _violations(graph):
    """``(importer, imported)`` pairs that go against the stages' order."""
    bad = []
    for module, imported in graph.items():
        mine, kind = _place(module)
        for other in imported:
            theirs, other_kind = _place(other)
            if kind == "entry":
                continue
            if kind == "apart":
                if other_kind not in ("apart", "foundation"):
                    bad.append((module, other))
            elif other_kind in ("entry", "apart") or theirs > mine:
                bad.append((module, other))
    return sorted(bad)


def _cycle(graph):
    """An import circle of ``graph`` (module -> imported modules) as a list, or None.

    A package's ``__init__`` counts as importing what it imports; importing a
    module of a package does not import the package's other modules.
    """
    state = {}

    def visit(name, path):
        if state.get(name) == "done":
            return None
        if state.get(name) == "open":
            return path[path.index(name):] + [name]
        state[name] = "open"
        for other in sorted(graph.get(name, ())):
            found = visit(other, path + [name])
            if found:
                return found
        state[name] = "done"
        return None
    for name in sorted(graph):
        found = visit(name, [])
        if found:
            return found
    return None


def test_the_package_is_one_subpackage_per_stage():
    folders = sorted(name for name in os.listdir(PACKAGE)
                     if os.path.isfile(os.path.join(PACKAGE, name, "__init__.py")))
    assert folders == sorted(STAGES + APART)
    tops = sorted(name[:-3] for name in os.listdir(PACKAGE) if name.endswith(".py"))
    assert tops == sorted(FOUNDATION + ENTRY)


@pytest.mark.parametrize("stage", STAGES + APART)
def test_each_stage_says_what_enters_and_leaves_it(stage):
    with open(os.path.join(PACKAGE, stage, "__init__.py")) as handle:
        doc = ast.get_docstring(ast.parse(handle.read())) or ""
    assert "Enters:" in doc and "Leaves:" in doc, stage


def test_no_stage_imports_a_later_one():
    assert _violations(_graph(PACKAGE, "gluon_dynbatch")) == []


def test_no_import_circles_in_the_package_scripts_or_examples():
    for folder, prefix in ((PACKAGE, "gluon_dynbatch"), (os.path.join(ROOT, "scripts"), "scripts"),
                           (os.path.join(ROOT, "examples"), "examples")):
        graph = _graph(folder, prefix)
        if prefix != "gluon_dynbatch":      # scripts import each other by bare name
            names = {name.rpartition(".")[2]: name for name in graph}
            for name, path in _modules(folder, prefix).items():
                with open(path) as handle:
                    tree = ast.parse(handle.read())
                for node in ast.walk(tree):
                    if isinstance(node, ast.Import):
                        graph[name] |= {names[a.name] for a in node.names if a.name in names}
                    elif isinstance(node, ast.ImportFrom) and not node.level \
                            and node.module in names:
                        graph[name].add(names[node.module])
        assert _cycle(graph) is None, folder


def test_the_checks_find_what_they_look_for(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "ir").mkdir(parents=True)
    (pkg / "run").mkdir()
    (pkg / "__init__.py").write_text("from .run import go\n")
    (pkg / "ir" / "__init__.py").write_text("")
    (pkg / "run" / "__init__.py").write_text("")
    (pkg / "ir" / "a.py").write_text("def f():\n    from ..run import b\n")
    (pkg / "run" / "b.py").write_text("from ..ir.a import f\n")
    graph = _graph(str(pkg), "gluon_dynbatch")
    assert _violations(graph) == [("gluon_dynbatch.ir.a", "gluon_dynbatch.run.b")]
    assert _cycle(graph) == ["gluon_dynbatch.ir.a", "gluon_dynbatch.run.b",
                             "gluon_dynbatch.ir.a"]
