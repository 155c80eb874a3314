"""Keep each experiment's docstring and README in step with the numbers its last full run produced.

An experiment module's docstring ends with a block, between ``BEGIN`` and ``END`` lines, that
is generated from ``results/<name>/table.md`` (itself rendered from ``results.json`` by the
experiment's code): the run line (command, seeds, steps, runtime) and the paper-claims table.
``scripts/reproduce.py NAME`` rewrites the block after a full run into the default output
directory; ``scripts/reproduce.py NAME --sync-docs`` rewrites it from the files already there.
The README's "## Results (copied from ...)" section, up to its "## Full size" section, is the
table itself (without its title), rewritten the same way. A test checks both against the
table, so no number in a docstring or README is typed by hand.
"""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN = "Results on this CPU (generated from results/{name}/table.md; do not edit by hand):"
END = "(end of generated results)"


def results_block(name: str, results_dir: str | None = None) -> str:
  """The docstring block for experiment ``name``: its run line and paper-claims table.

  Raises FileNotFoundError naming the table if the experiment has no full run on record, and
  ValueError if the table lacks a "## Paper claims" section.
  """
  path = os.path.join(results_dir or os.path.join(ROOT, "results", name), "table.md")
  with open(path) as f:
    text = f.read()
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


def module_path(name: str) -> str:
  return os.path.join(ROOT, "experiments", name, "__init__.py")


def sync(name: str, results_dir: str | None = None) -> bool:
  """Rewrite the block in ``experiments/<name>/__init__.py``; True if the file changed.

  The block goes at the end of the module docstring (replacing an existing block).
  """
  path = module_path(name)
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
  if new != source:
    with open(path, "w") as f:
      f.write(new)
  return new != source


RESULTS_HEADING = "## Results (copied from `results/{name}/table.md`)"
NEXT_HEADING = "## Full size (accelerators)"


def readme_section(name: str, results_dir: str | None = None) -> str:
  """The README's results section: the heading, then table.md without its title line."""
  path = os.path.join(results_dir or os.path.join(ROOT, "results", name), "table.md")
  with open(path) as f:
    body = f.read()
  if body.startswith("# "):
    body = body.split("\n", 1)[1] if "\n" in body else ""
  return RESULTS_HEADING.format(name=name) + "\n\n" + body.strip() + "\n\n"


def sync_readme(name: str, results_dir: str | None = None) -> bool:
  """Rewrite ``experiments/<name>/README.md``'s results section; True if the file changed.

  Raises ValueError if the README lacks the results heading or the following "Full size" one.
  """
  path = os.path.join(ROOT, "experiments", name, "README.md")
  with open(path) as f:
    text = f.read()
  head = RESULTS_HEADING.format(name=name)
  if head not in text or NEXT_HEADING not in text:
    raise ValueError(f"{path} needs a {head!r} section followed by {NEXT_HEADING!r}")
  start = text.index(head)
  stop = text.index(NEXT_HEADING, start)
  new = text[:start] + readme_section(name, results_dir) + text[stop:]
  if new != text:
    with open(path, "w") as f:
      f.write(new)
  return new != text
