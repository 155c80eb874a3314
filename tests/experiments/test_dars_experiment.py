"""The DARS experiment: the arms' sampled rollouts match where the design says so, the stage-2
budget never truncates, the 2x2 interaction, and ``--quick`` runs end to end."""

import json
import os

import numpy as np
import pytest

from experiments import harness, dars, rl_table
from experiments.dars import full as dars_full
from rlpost.train import config as config_lib
from rlpost.train import rl
from scripts import reproduce


def test_arm_names_say_their_allocation():
  # every arm runs the DARS objective; a plain-allocation arm is named plain-*, the rest dars-*
  # (a GRPO-recipe arm would be named grpo-*)
  for cfgs in (dars.arms(dars.design(False)), dars.arms(dars.design(True)), dars_full.FULL):
    for name, c in cfgs.items():
      want = ("plain-" if c["allocation"] == "plain" else "dars-") if c["recipe"] == "dars" \
          else c["recipe"] + "-"
      assert name.startswith(want), name
  assert set(dars.FULL_ARMS) <= set(dars_full.FULL)
  assert set(dars.FULL_ARMS.values()) == set(dars.arms(dars.design(False)))


def test_arms_sample_matched_rollouts_and_never_truncate():
  sz = dars.Design()
  cfgs = rl_table.arm_configs(dars.base_config(sz), dars.arms(sz))

  def sampled(name):
    c = config_lib.from_dict(rl.RLConfig, cfgs[name])
    return c.steps * c.allocation_plan().rows

  # the naive N samples what DARS samples; breadth keeps each arm's total; depth doubles it
  assert sampled("plain-n16") == sampled("dars-et") == sampled("dars-b")
  assert sampled("plain-b") == sampled("plain-n8") == sampled("dars-et") // 2
  for name in ("dars-et", "dars-b"):
    c = config_lib.from_dict(rl.RLConfig, cfgs[name])
    # the static budget is the schedule's largest demand: every prompt at n_max
    n_max = c.allocation_args["n_max"]
    assert c.allocation_plan().calls == (c.num_prompts * c.group_size,
                                         c.num_prompts * (n_max - c.group_size))
  b = cfgs["dars-b"]
  assert b["num_minibatches"] == 1 and b["num_iterations"] == 2 and b["num_prompts"] == 256
  assert cfgs["plain-b"]["steps"] == sz.steps // sz.breadth
  base = dars.base_config(sz)
  assert base["task_spec"] == dict(min_digits=2, max_digits=3, terms=2)
  assert "recipe_args" not in base and sz.from_power() == 8 == sz.seeds


def test_interaction_is_the_difference_of_differences():
  rng = np.random.default_rng(0)
  v = {a: rng.normal(m, 0.01, 8) for a, m in
       (("dars-b", 0.5), ("plain-b", 0.4), ("dars-et", 0.35), ("base", 0.3))}
  got = rl_table.interaction(v, "dars-b", "plain-b", "dars-et", "base")
  want = (v["dars-b"].mean() - v["plain-b"].mean()) - (v["dars-et"].mean() - v["base"].mean())
  assert got["mean"] == pytest.approx(want) and got["lo"] < want < got["hi"]
  # the interval width is that of four independent means (se sqrt(4 * 0.01^2 / 8) ~ 0.007)
  assert 0.01 < got["hi"] - got["lo"] < 0.05


@pytest.mark.slow
def test_reproduce_dars_quick(tmp_path):
  out = tmp_path / "dars"
  reproduce.main(["dars", "--quick", "--out", str(out), "--no-progress"])
  for name in ("table.md", "results.json", "passk.png", "cumulative_advantage.png"):
    assert os.path.getsize(out / name) > 0, name
  res = json.loads((out / "results.json").read_text())
  s = res["summary"]
  assert set(s["verdicts"].values()) <= {"reproduced", "not reproduced", "inconclusive",
                                     harness.NOT_JUDGED}
  assert set(s["stage2"]) == {"dars-et", "dars-b"}
  for r in s["stage2"].values():
    assert 0 <= r["dars_budget_used"] <= 1
  assert [c["claim"]["family"] for c in s["claims"]] == ["testbed"] + ["dars"] * 7
  assert set(s["interaction"]) == {"pass@1", "pass@4"}  # kmax: ks are 1, 4, 16, 64 up to 8
  assert sum(res["data"]["curve"]["groups"]) == res["config"]["curve_prompts"]
  assert all(arm["compilations"] == 1 for arm in res["data"]["arms"].values())
  table = (out / "table.md").read_text()
  assert "## Breadth x depth" in table and "rollouts are ever truncated" in table
