"""experiments/portability.py: the committed table follows from its results.json, and the
variants it records moved where the README says they did."""

import json
import os

from experiments import portability

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "results", "portability")


def test_committed_table_renders_from_its_results():
  with open(os.path.join(OUT, "results.json")) as f:
    report = json.load(f)
  with open(os.path.join(OUT, "table.md")) as f:
    assert portability.render(report) == f.read()
  v = report["variants"]
  assert set(v) == set(portability.VARIANTS)
  # One code path twice: bitwise the same start and the same trained weights.
  assert v["default"]["sft_digest"] == v["default-again"]["sft_digest"]
  assert v["default"]["rl_digest"] == v["default-again"]["rl_digest"]
  # Another instruction set: another start, and RL weights that moved apart.
  assert v["avx2"]["sft_digest"] != v["default"]["sft_digest"]
  assert v["avx2"]["sft_max_abs_diff_vs_default"] > 0
  assert v["avx2"]["rl_digest"] != v["default"]["rl_digest"]
  # The default path's start is the pinned testbed.
  from experiments import testbeds
  assert v["default"]["sft_digest"] == testbeds.PINNED["b23-sft"]
