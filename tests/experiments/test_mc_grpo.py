"""The MC-GRPO experiment: vmapped seeds equal single runs, and ``--quick`` runs end to end."""

import json
import os

import jax
import numpy as np
import pytest

from experiments import mc_grpo, rl_seeds
from rlpost.train import rl
from scripts import reproduce


def test_vmapped_seeds_match_single_runs(tmp_path):
  sz = mc_grpo.sizes(quick=True)
  base = dict(mc_grpo.base_config(sz), data_dir=str(tmp_path / "data"),
              cache_dir=str(tmp_path / "cache"), graded_reward=True, sft_steps=60)
  cfg = mc_grpo.arm_config(base, 2, "median")
  tr = rl.make_train(cfg, log=lambda s: None)
  states = rl_seeds.stack_states(tr, [0, 1])
  step = rl_seeds.vmapped_step(tr, states)
  for _ in range(2):
    states, metrics = step(states)
  assert tr.num_traces == 1  # all seeds in one program, compiled once
  for i, seed in enumerate([0, 1]):
    single = tr.init_state()._replace(key=jax.random.key_data(jax.random.key(seed)))
    for _ in range(2):
      single, m = tr.step(single)
    assert float(m["reward"]) == float(metrics["reward"][i])  # same rollouts
    np.testing.assert_allclose(float(m["loss"]), float(metrics["loss"][i]), rtol=1e-4, atol=1e-7)
    for a, b in zip(jax.tree.leaves(single.params), jax.tree.leaves(rl_seeds.unstack(states, i).params)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_arm_configs():
  base = {"steps": 1}
  assert mc_grpo.arm_config(base, 4, "mean")["group_size"] == 4
  drop = mc_grpo.arm_config(base, 4, "mean_drop")
  assert drop["group_size"] == 5 and drop["recipe_args"] == {"baseline": "mean"}
  med = mc_grpo.arm_config(base, 4, "median", flip=0.2)
  assert med["recipe"] == "mc_grpo" and med["recipe_args"] == {"signflip_prob": 0.2}
  with pytest.raises(ValueError, match="unknown baseline"):
    mc_grpo.arm_config(base, 4, "mode")


@pytest.mark.slow
def test_reproduce_mc_grpo_quick(tmp_path):
  out = tmp_path / "mc"
  reproduce.main(["mc_grpo", "--quick", "--out", str(out), "--no-progress"])
  for name in ("table.md", "results.json", "accuracy_vs_g.png", "learning_curves.png",
               "sign_flips.png", "injected_flips.png"):
    assert os.path.getsize(out / name) > 0, name
  res = json.loads((out / "results.json").read_text())
  assert res["command"] == "python scripts/reproduce.py mc_grpo --quick"
  assert set(res["summary"]["verdicts"].values()) <= {"reproduced", "not reproduced", "inconclusive"}
  assert all(arm["compilations"] == 1 for arm in res["arms"].values())
  assert len(res["arms"]) == 3 * len(mc_grpo.sizes(True).group_sizes) + 1
  flips = res["sign_flips"]["binary"]
  assert all(v["opposite"] == 0.0 for d in flips.values() for v in d.values())  # 0/1 rewards
  table = (out / "table.md").read_text()
  assert "## Paper claims" in table and "median closes" in table
  # Resumable: a second run reuses every finished arm.
  cached = sorted(os.listdir(out / "cache"))
  reproduce.main(["mc_grpo", "--quick", "--out", str(out), "--no-progress"])
  assert sorted(os.listdir(out / "cache")) == cached
