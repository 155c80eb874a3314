"""Experiment READMEs carry exactly the tables their last full run wrote; docstrings carry none."""

import importlib
import os

import pytest

from experiments import docsync
from scripts import reproduce

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))



@pytest.mark.parametrize("name", sorted(reproduce.EXPERIMENTS))
def test_every_table_is_on_the_harness(name):
  exp = importlib.import_module(reproduce.EXPERIMENTS[name]).EXPERIMENT
  assert exp.name == name and exp.module == reproduce.EXPERIMENTS[name]


@pytest.mark.parametrize("name", sorted(reproduce.EXPERIMENTS))
def test_docs_match_results_table(name):
  exp = importlib.import_module(reproduce.EXPERIMENTS[name]).EXPERIMENT
  module, readme = docsync.paths(exp)
  section = docsync.readme_section(name)
  assert "| claim (paper) |" in section and "| verdict |" in section
  with open(readme) as f:
    assert section in f.read(), (
        f"{readme} is out of date with results/{name}/table.md: run scripts/reproduce.py {name} "
        "--sync-docs")
  # the numbers live in the README only; the docstring says where they are
  doc = importlib.import_module(exp.module).__doc__
  assert "| claim (paper) | ours" not in doc and f"results/{name}" in doc, module


def test_sync_rewrites_only_the_generated_parts(tmp_path, monkeypatch):
  exp = tmp_path / "experiments" / "toy"
  exp.mkdir(parents=True)
  res = tmp_path / "results" / "toy"
  res.mkdir(parents=True)
  table = ("# Toy\n\n`python scripts/reproduce.py toy`: 2 seeds; 1.0 min.\n\n"
           "## Numbers\n\n| a |\n\n## Paper claims\n\n| claim (paper) | ours | verdict |\n"
           "| --- | --- | --- |\n"
           "| x | +0.1 [+0.0, +0.2] | reproduced |\n\nRules: r.\n\n## Later\n\nafter the claims\n")
  (res / "table.md").write_text(table.replace("+0.1", "+0.3"))
  monkeypatch.setattr(docsync, "ROOT", str(tmp_path))
  readme = exp / "README.md"
  begin, end = docsync.README_BEGIN.format(name="toy"), docsync.README_END.format(name="toy")
  readme.write_text(f"# Toy\n\nIntro.\n\n{begin}\nold\n{end}\n\n## Full size\n\nkept\n")
  assert docsync.sync_readme(str(readme), "toy")
  text = readme.read_text()
  assert "old" not in text and "+0.3 [" in text and "after the claims" in text  # the whole table
  assert "# Toy\n\n`python" not in text  # without its title
  assert text.startswith("# Toy\n\nIntro.") and text.endswith(f"{end}\n\n## Full size\n\nkept\n")
  assert not docsync.sync_readme(str(readme), "toy")
  readme.write_text("# Toy without markers\n")
  with pytest.raises(ValueError, match="README.md needs a generated section"):
    docsync.sync_readme(str(readme), "toy")
