"""The MC-GRPO experiment: vmapped seeds equal single runs, and ``--quick`` runs end to end."""

import json
import os

import jax
import numpy as np
import pytest

from experiments import harness, mc_grpo, rl_seeds, rl_table
from experiments.mc_grpo.arms import arm_config
from rlpost.train import rl
from scripts import reproduce
from rl_testutil import assert_moved, learning_config, max_update_gap


def test_vmapped_seeds_match_single_runs(tmp_path):
  """Seeds vmapped in one program against each seed run alone. These are different programs
  (batched kernels sum in another order), so the contract is a tolerance, checked on steps
  that moved: rewards within one rollout's reward, gradient norms to 1e-3 relative, and after
  two steps each seed's parameters within 1% of how far they moved."""
  sz = mc_grpo.design(quick=True)
  dirs = dict(data_dir=str(tmp_path / "data"), cache_dir=str(tmp_path / "cache"))
  fixture = learning_config(dirs)
  base = dict(mc_grpo.base_config(sz), **{k: fixture[k] for k in (
      "data_dir", "cache_dir", "sft_steps", "sft_lr", "num_prompts", "task_spec", "model")})
  cfg = arm_config(base, 2, "median")
  tr = rl.make_train(cfg, log=lambda s: None)
  rows = tr.cfg.num_prompts * tr.cfg.group_size
  states = rl_seeds.stack_states(tr, [0, 1])
  start = tr.init_state().params
  # Seeds differ only in their key: run_arm's one shared step-0 evaluation relies on it.
  jax.tree.map(lambda x: np.testing.assert_array_equal(x[0], x[1]), states.params)
  assert not np.array_equal(states.key[0], states.key[1])
  step = rl_seeds.vmapped_step(tr, states)
  vmapped = []
  for _ in range(2):
    states, metrics = step(states)
    vmapped.append(jax.device_get(metrics))
  assert tr.num_traces == 1  # all seeds in one program, compiled once
  for i, seed in enumerate([0, 1]):
    single = tr.init_state()._replace(key=jax.random.key_data(jax.random.key(seed)))
    for t in range(2):
      single, m = tr.step(single)
      m = jax.device_get(m)
      assert_moved(m, f"seed {seed} step {t + 1}")
      v = {k: x[i] for k, x in vmapped[t].items()}
      assert abs(float(m["reward"]) - float(v["reward"])) <= 1 / rows + 1e-7
      np.testing.assert_allclose(float(v["grad_norm"]), float(m["grad_norm"]), rtol=1e-3)
    gap, moved = max_update_gap(rl_seeds.unstack(states, i).params, single.params, start)
    assert moved > 0 and gap <= 1e-2 * moved, (seed, gap, moved)


def test_arm_configs():
  base = {"steps": 1}
  assert arm_config(base, 4, "mean") == dict(base, recipe="grpo", group_size=4,
                                                       recipe_args={})
  drop = arm_config(base, 4, "mean_drop")
  assert drop["group_size"] == 5 and drop["recipe_args"] == {"baseline": "mean"}
  rand = arm_config(base, 2, "mean_random", kl_coef=0.0)
  assert rand["group_size"] == 3 and rand["recipe_args"] == {"kl_coef": 0.0,
                                                             "baseline": "mean_random"}
  med = arm_config(base, 4, "median", kl_coef=0.0, rescale=True)
  assert med["recipe"] == "mc_grpo" and med["recipe_args"] == {"kl_coef": 0.0, "rescale": True}
  assert arm_config(base, 4, "median")["recipe_args"] == {}
  with pytest.raises(ValueError, match="unknown baseline"):
    arm_config(base, 4, "mode")
  with pytest.raises(ValueError, match="only run over the GRPO base"):
    arm_config(base, 2, "mean_drop", recipe="dapo")
  med = arm_config(base, 2, "median", kl_coef=0.0, rescale=True, recipe="dapo")
  assert med["recipe_args"] == {"kl_coef": 0.0, "base": "dapo", "rescale": True}
  sz = mc_grpo.Design()
  # the pre-declared design: the calibrated testbed with the graded reward, seeds from power
  cfg = mc_grpo.base_config(sz)
  assert cfg["graded_reward"] and cfg["num_prompts"] == 64 and cfg["lr"] == 1e-4
  assert cfg["task_spec"] == dict(min_digits=2, max_digits=3, terms=2) and cfg["steps"] == 100
  assert sz.from_power() == 8 == sz.seeds
  # the secondary table: the same testbed on the 0/1 reward
  assert sz.binary_secondary and not mc_grpo.base_config(sz, graded=False)["graded_reward"]
  assert {k: v for k, v in mc_grpo.base_config(sz, graded=False).items()
          if k != "graded_reward"} == {k: v for k, v in cfg.items() if k != "graded_reward"}
  assert list(mc_grpo.arm_names(sz)) == ["G8-mean", "G2-mean", "G2-median", "G2-mean_drop",
                                         "G2-mean_random"]


def test_gap_fraction_bca():
  rng = np.random.default_rng(0)
  low, mid, high = (rng.normal(m, 0.01, 8) for m in (0.30, 0.33, 0.34))
  g = rl_table.gap_fraction(low, mid, high)
  want = (mid.mean() - low.mean()) / (high.mean() - low.mean())
  assert g["fraction"] == pytest.approx(want)
  assert g["lo"] < g["fraction"] < g["hi"] and g["method"].startswith("BCa")


@pytest.mark.slow
def test_reproduce_mc_grpo_quick(tmp_path, monkeypatch):
  out = tmp_path / "mc"
  reproduce.main(["mc_grpo", "--quick", "--out", str(out), "--no-progress"])
  for name in ("table.md", "results.json", "learning_curves.png", "sign_flips.png"):
    assert os.path.getsize(out / name) > 0, name
  res = json.loads((out / "results.json").read_text())
  assert res["command"] == "python scripts/reproduce.py mc_grpo --quick"
  summary = res["summary"]
  sz = mc_grpo.design(True)
  assert set(summary["verdicts"]) == {c.id for c in mc_grpo.claims(sz)} | {
      c.id for c in mc_grpo.claims(sz, mc_grpo.BINARY)} | {
      c.id for c in mc_grpo.base_claims(sz)} | {"median_fewer_sign_flips"}
  assert set(summary["verdicts"].values()) <= {"reproduced", "not reproduced", "inconclusive",
                                           harness.NOT_JUDGED}
  assert [c["claim"]["family"] for c in summary["claims"]] == ["testbed"] * 2 + ["mc_grpo"] * 4
  assert summary["claims"][2]["claim"]["direction"] == "equivalent"
  # the gate's one-sample claims are judged against the SFT start
  assert all(c["claim"]["center"] == summary["start_pass@1"] for c in summary["claims"][:2])
  assert summary["rates"]["method"].startswith("two-proportion z-test")
  assert all(arm["compilations"] == 1 for arm in res["data"]["arms"].values())
  assert list(res["data"]["arms"]) == (list(mc_grpo.arm_names(sz))
                                       + list(mc_grpo.arm_names(sz, mc_grpo.BINARY))
                                       + list(mc_grpo.base_arm_names(sz)))
  # over other bases: the base's own recipe for the mean, mc_grpo over it for the median
  arms = res["data"]["arms"]
  assert arms["dapo-G2-mean"]["config"]["recipe"] == "dapo"
  assert arms["dr_grpo-G2-median"]["config"]["recipe_args"]["base"] == "dr_grpo"
  assert [c["claim"]["family"] for c in summary["bases"]["claims"]] == (
      ["testbed"] * 2 + ["mc_grpo_bases"] * 2)
  # the secondary table: the same arms on the 0/1 reward, its own gate and family
  assert not any(a["config"]["graded_reward"] for n, a in res["data"]["arms"].items()
                 if n.startswith(mc_grpo.BINARY))
  assert [c["claim"]["family"] for c in summary["binary"]["claims"]] == (
      ["testbed"] * 2 + ["mc_grpo_01"] * 4)
  for kind, per in res["data"]["sign_flips"].items():
    for bl, d in per.items():
      for v in d.values():
        if kind == "graded":  # graded rewards differ from the reference: rollouts to count
          assert v["count"] > 0
        if v["count"]:
          assert v["opposite"] + v["zeroed"] + v["correct"] == pytest.approx(1)
        if kind == "binary" and bl in ("mean", "median"):  # 0/1 rewards: never the wrong sign
          assert v["opposite"] == 0.0
  table = (out / "table.md").read_text()
  assert "## Paper claims" in table and "comes within 1%" in table and "Gate" in table
  assert "### Secondary table: the same claims on the 0/1 reward" in table
  assert "### Over other bases" in table
  # Resumable: a second run reuses every finished arm and trains nothing.
  cached = sorted(os.listdir(out / "cache"))

  def no_training(*args, **kwargs):
    raise AssertionError("a finished arm was trained again")

  monkeypatch.setattr(rl, "make_train", no_training)
  reproduce.main(["mc_grpo", "--quick", "--out", str(out), "--no-progress"])
  assert sorted(os.listdir(out / "cache")) == cached
  again = json.loads((out / "results.json").read_text())
  assert again["data"]["arms"] == res["data"]["arms"]
  # Re-judging the written results (no training) reproduces them.
  written = {name: (out / name).read_text() for name in ("table.md", "results.json")}
  reproduce.main(["mc_grpo", "--rejudge", "--out", str(out), "--no-progress"])
  assert {name: (out / name).read_text() for name in written} == written
