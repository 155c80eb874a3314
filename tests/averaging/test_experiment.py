"""The averaging experiment runs end to end at toy size (``scripts/reproduce.py averaging --quick``)."""

import json
import os

from experiments import averaging as exp
from scripts import reproduce


def test_reproduce_averaging_quick(tmp_path):
  with open(exp.README) as f:
    readme = f.read()
  out = tmp_path / "avg"
  reproduce.main(["averaging", "--quick", "--out", str(out), "--no-progress"])
  for name in ("table.md", "results.json", "curves.png", "t1_gain_vs_lr.png", "t2_gain_vs_nu.png",
               "t4_mwa.png"):
    assert os.path.getsize(out / name) > 0, name
  res = json.loads((out / "results.json").read_text())
  assert res["meta"]["mode"] == "quick"
  assert set(res["tables"]) == {"t1", "t2", "t3", "t4"}
  assert {c["verdict"] for c in res["claims"]} <= {"reproduced", "not reproduced", "inconclusive"}
  assert len(res["claims"]) >= 6
  table = (out / "table.md").read_text()
  for t in ("T1.", "T2.", "T3.", "T4."):
    assert t in table
  # The runs learn: every raw run ends below the uniform predictor's excess loss.
  import numpy as np
  evals = np.asarray(res["evals"])
  assert np.all(evals[:, -1, 0] < evals[:, 0, 0])
  with open(exp.README) as f:
    assert f.read() == readme  # a quick run never rewrites the README's results


def test_t5_rl_quick_runs(tmp_path):
  """The RL-checkpoint averaging table (T5) runs end to end at toy size and writes its files."""
  import argparse

  from experiments.averaging import t5_rl

  out = t5_rl.run(argparse.Namespace(quick=True, seeds=1, out=str(tmp_path), no_progress=True))
  assert set(out["table"]) == {"raw", "lawa", "ema"}
  assert {c["verdict"] for c in out["claims"]} <= {"reproduced", "not reproduced", "inconclusive"}
  for name in ("table.md", "results.json", "pass1_curves.png"):
    assert (tmp_path / name).exists()
  curves = out["per_seed"][0]["curves"]
  assert curves["raw"][0] == curves["lawa"][0] == [2, 4, 6]
