"""Keep each experiment's README in step with the numbers its last full run produced.

One mechanism for every table on ``experiments/harness.py``: the README holds ``table.md``
(without its title) between the markers ``<!-- results:begin NAME -->`` and
``<!-- results:end NAME -->``. The module docstrings carry no numbers; each says where they are.

``scripts/reproduce.py NAME`` rewrites the README's section after a full run into the default
output directory (and after ``--rejudge``); ``scripts/reproduce.py NAME --sync-docs`` rewrites it
from the files already there. ``tests/experiments/test_docsync.py`` fails when they drift, so no
number in a README is typed by hand.
"""

from __future__ import annotations

import importlib
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README_BEGIN = "<!-- results:begin {name} -->"
README_END = "<!-- results:end {name} -->"


def _table(name: str, results_dir: str | None) -> tuple[str, str]:
  path = os.path.join(results_dir or os.path.join(ROOT, "results", name), "table.md")
  with open(path) as f:
    return path, f.read()


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
  new = text[:start] + readme_section(name, results_dir) + text[stop:]
  if new != text:
    with open(path, "w") as f:
      f.write(new)
  return new != text


def sync_all(exp, results_dir: str | None = None) -> dict[str, bool]:
  """Rewrite ``exp``'s README section; {path: changed}."""
  _, readme = paths(exp)
  return {readme: sync_readme(readme, exp.name, results_dir)}
