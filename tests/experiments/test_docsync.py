"""Experiment docstrings and READMEs carry exactly the tables their last full run wrote."""

import importlib
import os
import sys

import pytest

from experiments import docsync

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import reproduce  # noqa: E402


@pytest.mark.parametrize("name", reproduce.DOC_SYNCED)
def test_docstring_block_matches_results_table(name):
  doc = importlib.import_module(f"experiments.{name}").__doc__
  block = docsync.results_block(name)
  assert block in doc, (f"experiments/{name}/__init__.py is out of date with "
                        f"results/{name}/table.md: run scripts/reproduce.py {name} --sync-docs")
  assert "| claim (paper) | ours" in block and "| verdict |" in block


@pytest.mark.parametrize("name", reproduce.DOC_SYNCED)
def test_readme_results_match_results_table(name):
  with open(os.path.join(ROOT, "experiments", name, "README.md")) as f:
    text = f.read()
  assert docsync.readme_section(name) in text, (
      f"experiments/{name}/README.md is out of date with results/{name}/table.md: run "
      f"scripts/reproduce.py {name} --sync-docs")


def test_sync_rewrites_only_the_block(tmp_path, monkeypatch):
  exp = tmp_path / "experiments" / "toy"
  exp.mkdir(parents=True)
  (exp / "__init__.py").write_text('"""Toy.\n\nText kept.\n"""\n\nX = 1\n')
  res = tmp_path / "results" / "toy"
  res.mkdir(parents=True)
  table = ("# Toy\n\n`python scripts/reproduce.py toy`: 2 seeds; 1.0 min.\n\n## Numbers\n\n| a |\n\n"
           "## Paper claims\n\n| claim (paper) | ours | verdict |\n| --- | --- | --- |\n"
           "| x | +0.1 [+0.0, +0.2] | reproduced |\n\nRules: r.\n\n## Later\n\nnot copied\n")
  (res / "table.md").write_text(table)
  monkeypatch.setattr(docsync, "ROOT", str(tmp_path))
  assert docsync.sync("toy")
  text = (exp / "__init__.py").read_text()
  assert "Text kept." in text and "X = 1" in text and "not copied" not in text
  assert "| x | +0.1 [+0.0, +0.2] | reproduced |" in text and "2 seeds; 1.0 min" in text
  assert not docsync.sync("toy")  # idempotent
  (res / "table.md").write_text(table.replace("+0.1", "+0.3"))
  assert docsync.sync("toy")
  text = (exp / "__init__.py").read_text()
  assert "+0.3 [" in text and "+0.1 [" not in text and text.count(docsync.END) == 1
  readme = exp / "README.md"
  readme.write_text("# Toy\n\nIntro.\n\n" + docsync.RESULTS_HEADING.format(name="toy") +
                    "\n\nold\n\n## Full size (accelerators)\n\nkept\n")
  assert docsync.sync_readme("toy")
  text = readme.read_text()
  assert "old" not in text and "+0.3 [" in text and "not copied" in text  # the whole table
  assert text.startswith("# Toy\n\nIntro.") and text.endswith("## Full size (accelerators)\n\nkept\n")
  assert not docsync.sync_readme("toy")
  (res / "table.md").write_text("# no claims\n")
  with pytest.raises(ValueError, match="Paper claims"):
    docsync.results_block("toy")
