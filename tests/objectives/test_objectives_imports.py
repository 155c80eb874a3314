"""The module graph of rlpost.objectives has no import circle, and the loss-pair names are one
set of objects wherever they are imported from."""

import ast
import pathlib

import rlpost.objectives as O
from rlpost.objectives import base, parts

PKG = "rlpost.objectives"
SRC = pathlib.Path(O.__file__).parent


def _module_graph() -> dict:
  """module -> set of rlpost.objectives modules it imports (any level, lazy imports included;
  "__init__" is the package itself)."""
  modules = {p.stem for p in SRC.glob("*.py")}
  graph = {}
  for name in modules:
    deps = set()
    for node in ast.walk(ast.parse((SRC / f"{name}.py").read_text())):
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        assert node.level == 0, f"{name}: relative import"
        mod = node.module or ""
        if mod == PKG:  # `from rlpost.objectives import x`: a submodule, or a package name
          targets = [f"{PKG}.{a.name}" if a.name in modules else PKG for a in node.names]
        else:
          targets = [mod]
      else:
        continue
      for t in targets:
        if t == PKG:
          deps.add("__init__")
        elif t.startswith(PKG + "."):
          deps.add(t[len(PKG) + 1 :].split(".")[0])
    graph[name] = deps - {name}
  return graph


def _cycle(graph: dict):
  """A list of modules forming a cycle, or None (depth-first search)."""
  state, stack = {}, []

  def visit(n):
    state[n] = "open"
    stack.append(n)
    for m in sorted(graph.get(n, ())):
      if state.get(m) == "open":
        return stack[stack.index(m) :] + [m]
      if m not in state:
        found = visit(m)
        if found:
          return found
    stack.pop()
    state[n] = "done"
    return None

  for n in sorted(graph):
    if n not in state:
      found = visit(n)
      if found:
        return found
  return None


def test_cycle_detector_finds_a_cycle():
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_objectives_import_graph_is_acyclic():
  graph = _module_graph()
  assert {"parts", "base", "losses", "recipes"} <= set(graph)
  assert _cycle(graph) is None, f"import circle: {' -> '.join(_cycle(graph))}"
  assert graph["parts"] == set()  # the bottom module
  assert "base" not in graph["losses"] and "recipes" not in graph["base"]
  for name, deps in graph.items():
    if name != "__init__":
      assert "__init__" not in deps, f"{name} imports names from the package itself"


def test_loss_pair_names_are_reexported():
  for n in ("LossParts", "safe_divide", "finalize", "combine", "finalize_metrics"):
    assert getattr(O, n) is getattr(parts, n) is getattr(base, n), n
  from rlpost.objectives.base import LossParts  # noqa: F401  (the historical import path)

  assert LossParts is O.LossParts
