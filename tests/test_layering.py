"""Layering: experiments and scripts use the trainer's public API only; the module graph of
rlpost/, scripts/ and experiments/ keeps its floors and has no import circle."""

import ast
import pathlib
import re
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PRIVATE = re.compile(r"\b(trainer|tr|ref)\._[a-z]\w*")
PACKAGES = ("rlpost", "scripts", "experiments")


def test_no_private_trainer_access_outside_rlpost_train():
  hits = []
  for sub in ("experiments", "scripts", "rlpost"):
    for path in (ROOT / sub).rglob("*.py"):
      if path.parent.name == "train" and path.parent.parent.name == "rlpost":
        continue
      for i, line in enumerate(path.read_text().splitlines(), 1):
        if PRIVATE.search(line):
          hits.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
  assert not hits, "\n".join(hits)


# --------------------------------------------------------------------------------------------
# The import graph
# --------------------------------------------------------------------------------------------

def modules(root: pathlib.Path, packages=PACKAGES) -> dict[str, pathlib.Path]:
  """Dotted module name -> file, for every .py file under ``root/<package>`` (a package's
  ``__init__.py`` is the package itself)."""
  out = {}
  for package in packages:
    for path in sorted((root / package).rglob("*.py")):
      parts = list(path.relative_to(root).with_suffix("").parts)
      if parts[-1] == "__init__":
        parts.pop()
      out[".".join(parts)] = path
  return out


def _resolve(name: str, known) -> str | None:
  """The longest prefix of dotted ``name`` that is a known module (None: outside the graph)."""
  while name and name not in known:
    name = name.rpartition(".")[0]
  return name or None


def _pattern(node: ast.JoinedStr) -> re.Pattern:
  """An f-string module name as a regex: each formatted field matches any non-empty text."""
  parts = [re.escape(v.value) if isinstance(v, ast.Constant) else ".+" for v in node.values]
  return re.compile("".join(parts))


def imports(name: str, path: pathlib.Path, known) -> set[str]:
  """The modules of ``known`` that module ``name`` imports, at any depth of its code.

  ``import a.b`` and ``from a import b`` (``b`` a submodule) are edges to ``a.b`` alone, not to
  package ``a``; ``from a.b import x`` (``x`` not a submodule) is an edge to ``a.b``.
  ``importlib.import_module`` (or a bare ``import_module``) with a literal name is an edge to
  it, with an f-string an edge to every known module the f-string can spell.
  """
  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  targets = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      targets.update(_resolve(a.name, known) for a in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
        base = ".".join(up + ([base] if base else []))
      for a in node.names:
        sub = f"{base}.{a.name}"
        targets.add(sub if sub in known else _resolve(base, known))
    elif isinstance(node, ast.Call) and node.args:
      func = node.func
      called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
      if called != "import_module":
        continue
      arg = node.args[0]
      if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        targets.add(_resolve(arg.value, known))
      elif isinstance(arg, ast.JoinedStr):
        pattern = _pattern(arg)
        targets.update(m for m in known if pattern.fullmatch(m))
  return targets - {None, name}


def import_graph(root: pathlib.Path = ROOT, packages=PACKAGES) -> dict[str, set[str]]:
  """module -> the modules it imports, over every module of ``packages`` under ``root``."""
  known = modules(root, packages)
  return {name: imports(name, path, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[frozenset]:
  """The import circles of ``graph``: its strongly connected components of more than one
  module (Tarjan's algorithm, iterative)."""
  index, low, on_stack, stack, found = {}, {}, set(), [], []
  for start in sorted(graph):
    if start in index:
      continue
    work = [(start, iter(sorted(graph.get(start, ()))))]
    index[start] = low[start] = len(index)
    stack.append(start)
    on_stack.add(start)
    while work:
      v, children = work[-1]
      w = next(children, None)
      if w is not None:
        if w not in index:
          index[w] = low[w] = len(index)
          stack.append(w)
          on_stack.add(w)
          work.append((w, iter(sorted(graph.get(w, ())))))
        elif w in on_stack:
          low[v] = min(low[v], index[w])
        continue
      work.pop()
      if work:
        low[work[-1][0]] = min(low[work[-1][0]], low[v])
      if low[v] == index[v]:
        component = set()
        while True:
          w = stack.pop()
          on_stack.discard(w)
          component.add(w)
          if w == v:
            break
        if len(component) > 1:
          found.append(frozenset(component))
  return found


@pytest.fixture(scope="module")
def graph():
  return import_graph()


def _write(root: pathlib.Path, files: dict[str, str]) -> None:
  for rel, text in files.items():
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def test_checker_finds_a_cycle(tmp_path):
  _write(tmp_path, {
      "pkg/__init__.py": "from pkg import a\n",
      "pkg/a.py": "from pkg import b\n",
      "pkg/b.py": "def f():\n  import pkg.a\n",
      "pkg/c.py": "import importlib\nimportlib.import_module(f'pkg.sub.{1}')\n",
      "pkg/sub/__init__.py": "",
      "pkg/sub/d.py": "from importlib import import_module\nimport_module('pkg.c')\n",
      "pkg/sub/e.py": "from ..a import x\nfrom . import d\n",
  })
  g = import_graph(tmp_path, ("pkg",))
  assert g["pkg"] == {"pkg.a"} and g["pkg.a"] == {"pkg.b"} and g["pkg.b"] == {"pkg.a"}
  assert g["pkg.c"] == {"pkg.sub.d", "pkg.sub.e"} and g["pkg.sub.d"] == {"pkg.c"}
  assert g["pkg.sub.e"] == {"pkg.a", "pkg.sub.d"}
  assert sorted(map(sorted, cycles(g))) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.sub.d", "pkg.sub.e"]]
  assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_graph_sees_lazy_and_dynamic_imports(graph):
  assert "rlpost.models.transformer" in graph["rlpost.models.packing"]
  assert "rlpost.models.hf" in graph["rlpost.models.policy"]  # a function-level import
  assert "experiments.mc_grpo.full" in graph["scripts.launch"]  # an f-string import_module


# Floors: objectives and tasks never import models, models never import them.
FLOORS = [("rlpost.objectives", "rlpost.models"), ("rlpost.tasks", "rlpost.models"),
          ("rlpost.models", "rlpost.objectives"), ("rlpost.models", "rlpost.tasks")]


def _within(module: str, package: str) -> bool:
  return module == package or module.startswith(package + ".")


@pytest.mark.parametrize("importer, imported", FLOORS)
def test_floors(graph, importer, imported):
  hits = sorted(f"{m} -> {t}" for m, deps in graph.items() if _within(m, importer)
                for t in deps if _within(t, imported))
  assert not hits, "\n".join(hits)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(graph, package):
  found = {c for c in cycles(graph) if any(_within(m, package) for m in c)}
  assert not found, "import circles:\n" + "\n".join(" <-> ".join(sorted(c)) for c in found)


def _unspelled_imports(path: pathlib.Path) -> list[int]:
  """Lines of ``path`` calling ``import_module`` on a name the call does not spell (neither a
  literal nor an f-string): an edge the graph cannot see."""
  lines = []
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Call) and node.args:
      func = node.func
      called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
      if called == "import_module" and not isinstance(node.args[0], (ast.Constant, ast.JoinedStr)):
        lines.append(node.lineno)
  return lines


def test_library_imports_spell_their_modules(tmp_path):
  _write(tmp_path, {"a.py": "import importlib\nfor m in 'xy':\n  importlib.import_module(m)\n"})
  assert _unspelled_imports(tmp_path / "a.py") == [3]
  hits = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "rlpost").rglob("*.py"))
          for n in _unspelled_imports(p)]
  assert not hits, "import_module on a computed name:\n" + "\n".join(hits)


def test_tasks_catalog_is_the_top_of_the_tasks_package(graph):
  builtin = {"rlpost.tasks.arithmetic", "rlpost.tasks.countdown", "rlpost.tasks.math_data"}
  assert builtin <= graph["rlpost.tasks.catalog"]
  below = [m for m in graph if _within(m, "rlpost.tasks") and m != "rlpost.tasks.catalog"]
  assert not [m for m in below if "rlpost.tasks.catalog" in graph[m]]
