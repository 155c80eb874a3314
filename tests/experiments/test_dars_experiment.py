"""The DARS experiment: arms allocate equal rollouts, and ``--quick`` runs end to end."""

import json
import os

import pytest

from experiments import dars
from scripts import reproduce


def test_arms_have_equal_rollouts():
  sz = dars.Sizes()
  spec = dars.arms(sz)
  base = {"steps": sz.steps}

  def rollouts(kw):
    cfg = dict(base, **kw)
    return cfg["steps"] * (cfg["num_prompts"] * cfg["group_size"] + cfg.get("dars_budget", 0))

  totals = {name: rollouts(kw) for name, kw in spec.items() if name != f"grpo-n{sz.n}"}
  assert len(set(totals.values())) == 1, totals  # naive N, DARS and DARS-B at equal rollouts
  assert spec["dars-b"]["num_minibatches"] == 1 and spec["dars-b"]["num_iterations"] == 2


@pytest.mark.slow
def test_reproduce_dars_quick(tmp_path):
  out = tmp_path / "dars"
  reproduce.main(["dars", "--quick", "--out", str(out), "--no-progress"])
  for name in ("table.md", "results.json", "passk.png", "cumulative_advantage.png"):
    assert os.path.getsize(out / name) > 0, name
  res = json.loads((out / "results.json").read_text())
  s = res["summary"]
  assert set(s["verdicts"].values()) <= {"reproduced", "not reproduced", "inconclusive"}
  assert set(s["rescued"]) == {"dars-et", "dars-hw", "dars-b"}
  assert sum(res["data"]["curve"]["groups"]) == res["config"]["curve_prompts"]
  assert all(arm["compilations"] == 1 for arm in res["data"]["arms"].values())
