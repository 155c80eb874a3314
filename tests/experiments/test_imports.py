"""No import circle among the experiments' modules: a table's runner, its full-size configs and
the shared layers import each other one way only."""

import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _modules() -> dict[str, str]:
  """{dotted name: file} of every module under experiments/."""
  out = {}
  for d, _, files in os.walk(os.path.join(ROOT, "experiments")):
    for f in files:
      if f.endswith(".py"):
        rel = os.path.relpath(os.path.join(d, f), ROOT)[:-3].split(os.sep)
        out[".".join(rel[:-1] if rel[-1] == "__init__" else rel)] = os.path.join(d, f)
  return out


def _edges(name: str, path: str, modules) -> set[str]:
  """The modules of ``modules`` that ``path`` names in an import statement (a module, or the
  module a name is imported from) or in ``importlib.import_module`` (a literal, or an f-string
  standing for every module it can spell). A package's ``__init__`` that runs because a module
  inside it is imported is not an edge of the importer."""
  package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
  out = set()
  for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
    if isinstance(node, ast.Import):
      out |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(parts + ([node.module] if node.module else []))
      subs = {f"{base}.{a.name}" for a in node.names} & set(modules)
      out |= subs if len(subs) == len(node.names) else subs | {base}
    elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module"
          and node.args):
      arg = node.args[0]
      if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        out.add(arg.value)
      elif isinstance(arg, ast.JoinedStr):
        pattern = "".join(re.escape(v.value) if isinstance(v, ast.Constant) else "[^.]+"
                          for v in arg.values)
        out |= {m for m in modules if re.fullmatch(pattern, m)}
  return {m for m in out if m in modules and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        found.append(sorted(comp))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


def test_no_import_circle_among_experiments():
  modules = _modules()
  graph = {name: _edges(name, path, modules) for name, path in modules.items()}
  # the checker sees the edges this layout is known to have
  assert "experiments.mc_grpo.full" in graph["experiments.mc_grpo"]
  assert "experiments.mc_grpo.arms" in graph["experiments.mc_grpo.full"]
  assert "experiments.rl_table" in graph["experiments.ace"]
  assert _cycles(graph) == []


def test_the_checker_finds_circles():
  assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
  assert _cycles({"a": {"b"}, "b": set()}) == []
