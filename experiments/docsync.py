"""Keep each experiment's docstring and README in step with the numbers its last full run produced.

One mechanism for every table on ``experiments/harness.py``:

* the experiment module's docstring ends with a block, between ``BEGIN`` and ``END`` lines,
  generated from ``results/<name>/table.md``: the run line (command, seeds, runtime) and the
  "## Paper claims" section;
* the README holds ``table.md`` (without its title) between the markers
  ``<!-- results:begin NAME -->`` and ``<!-- results:end NAME -->``.

``scripts/reproduce.py NAME`` rewrites both after a full run into the default output directory
(and after ``--rejudge``); ``scripts/reproduce.py NAME --sync-docs`` rewrites them from the files
already there. ``tests/experiments/test_docsync.py`` fails when they drift, so no number in a
docstring or README is typed by hand.
"""

from __future__ import annotations

import importlib
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN = "Results on this CPU (generated from results/{name}/table.md; do not edit by hand):"
END = "(end of generated results)"
README_BEGIN = "<!-- results:begin {name} -->"
README_END = "<!-- results:end {name} -->"


def _table(name: str, results_dir: str | None) -> tuple[str, str]:
  path = os.path.join(results_dir or os.path.join(ROOT, "results", name), "table.md")
  with open(path) as f:
    return path, f.read()


def results_block(name: str, results_dir: str | None = None) -> str:
  """The docstring block for experiment ``name``: its run line and paper-claims section.

  Raises FileNotFoundError naming the table if the experiment has no full run on record, and
  ValueError if the table lacks a "## Paper claims" section.
  """
  path, text = _table(name, results_dir)
  paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
  run_line = next((p for p in paragraphs if p.startswith("`python scripts/reproduce.py")), None)
  match = re.search(r"^## Paper claims[^\n]*\n(.*?)(?=^## |\Z)", text, re.S | re.M)
  if match is None:
    raise ValueError(f"{path} has no '## Paper claims' section")
  lines = [BEGIN.format(name=name), ""]
  if run_line:
    lines += [run_line, ""]
  lines += [match.group(0).strip(), "", END]
  return "\n".join(lines)


def readme_section(name: str, results_dir: str | None = None) -> str:
  """What the README holds between its markers: table.md without its title line."""
  _, body = _table(name, results_dir)
  if body.startswith("# "):
    body = body.split("\n", 1)[1] if "\n" in body else ""
  return (README_BEGIN.format(name=name) + "\n\n" + body.strip() + "\n\n"
          + README_END.format(name=name))


def paths(exp) -> tuple[str, str]:
  """(module file, README) of a ``harness.Experiment``: its ``module`` (dotted name) and its
  ``readme`` (default: the README.md beside the module)."""
  module = importlib.import_module(exp.module).__file__
  readme = exp.readme or os.path.join(os.path.dirname(module), "README.md")
  return module, readme


def _rewrite(path: str, new: str, old: str) -> bool:
  if new != old:
    with open(path, "w") as f:
      f.write(new)
  return new != old


def sync_docstring(path: str, name: str, results_dir: str | None = None) -> bool:
  """Rewrite the block at the end of ``path``'s module docstring; True if the file changed."""
  with open(path) as f:
    source = f.read()
  block = results_block(name, results_dir)
  begin = BEGIN.format(name=name)
  if begin in source:
    start = source.index(begin)
    stop = source.index(END, start) + len(END)
    new = source[:start] + block + source[stop:]
  else:
    close = source.index('"""', source.index('"""') + 3)  # end of the module docstring
    new = source[:close].rstrip("\n") + "\n\n" + block + "\n" + source[close:]
  return _rewrite(path, new, source)


def sync_readme(path: str, name: str, results_dir: str | None = None) -> bool:
  """Rewrite the README's generated section; True if the file changed.

  Raises ValueError naming the README if it lacks the markers.
  """
  with open(path) as f:
    text = f.read()
  begin, end = README_BEGIN.format(name=name), README_END.format(name=name)
  if begin not in text or end not in text:
    raise ValueError(f"{path} needs a generated section between {begin!r} and {end!r}")
  start = text.index(begin)
  stop = text.index(end, start) + len(end)
  return _rewrite(path, text[:start] + readme_section(name, results_dir) + text[stop:], text)


def sync_all(exp, results_dir: str | None = None) -> dict[str, bool]:
  """Rewrite ``exp``'s docstring block and README section; {path: changed}."""
  module, readme = paths(exp)
  return {module: sync_docstring(module, exp.name, results_dir),
          readme: sync_readme(readme, exp.name, results_dir)}
