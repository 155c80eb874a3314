"""The RL tables' shared helpers on hand values: training-metric means and their table, where an
advantage-mass curve peaks, the --prefix rule, the SFT start a gated summary finds, and the two
SFT-policy analyses of ``experiments/rl_seeds.py`` on a fake policy whose samples are known."""

from types import SimpleNamespace
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import claims as C
from experiments import report, rl_seeds, rl_table, runs


def test_step_means_and_their_table():
  results = {"a": {"train": {"x": [[1.0, 3.0], [5.0, 7.0]], "y": [[0.5, 0.5], [1.5, 1.5]]}},
             "b": {"train": {"x": [[2.0, 2.0]]}}, "c": {"train": {"z": [[9.0]]}}}
  means = rl_table.step_means(results, ("x", "y", "w"))
  assert means == {"a": {"x": 4.0, "y": 1.0}, "b": {"x": 2.0}}  # c logs none of them
  cols = {"x": ("the x", ".1f"), "y": ("the y", ".2f"), "w": ("never logged", ".3f")}
  assert rl_table.step_means_table(means, cols) == [
      "| arm | the x | the y |", "| --- | --- | --- |", "| a | 4.0 | 1.00 |", "| b | 2.0 | nan |"]


def test_mass_peak():
  curve = {"accuracy": [0.0, 0.25, 0.5, 0.75, 1.0], "m": [0.0, 1.5, 2.0, 1.5, 0.0]}
  assert rl_table.mass_peak(curve, "m", 0.5, 0.25) == (0.5, "holds")
  assert rl_table.mass_peak(dict(curve, m=[0.0, 3.0, 2.0, 1.5, 0.0]), "m", 0.5, 0.2) == (
      0.25, "fails")
  nan = float("nan")
  assert rl_table.mass_peak(dict(curve, m=[nan, nan, 2.0, 1.0, nan]), "m", 0.5, 0.25) == (
      0.5, "inconclusive")  # two levels observed


def test_check_prefix():
  rl_table.check_prefix("t", "")
  rl_table.check_prefix("t", "math-", ("math-", "gsm8k-"))
  with pytest.raises(runs.RunsError, match="t --full: the table has one set of arms, no --prefix"):
    rl_table.check_prefix("t", "x-")
  with pytest.raises(runs.RunsError, match="--prefix must be 'math-' or 'gsm8k-' .*got ''"):
    rl_table.check_prefix("t", "", ("math-", "gsm8k-"))


def test_fmt_fraction():
  assert report.fmt_fraction({"fraction": 0.1, "lo": -0.25, "hi": 0.364, "method": "m"}) == (
      "+0.10 [-0.25, +0.36] (m)")


def _arm(start, lasts, seconds=1.0):
  """An arm of two seeds whose step-0 pass@1 is ``start`` and whose later evaluations are
  ``lasts`` (per seed)."""
  evals = [{"step": 0, "per_seed": [{"pass@1": start}] * 2}]
  evals += [{"step": i + 1, "per_seed": [{"pass@1": v} for v in seed_vals]}
            for i, seed_vals in enumerate(zip(*lasts))]
  return {"evals": evals, "seeds": [0, 1], "seconds": seconds}


def test_gated_finds_the_start_of_its_first_arm():
  results = {"a": _arm(0.2, [[0.3, 0.4], [0.5, 0.6]]), "b": _arm(0.2, [[0.3, 0.3], [0.3, 0.3]])}
  gate = [C.Claim("a_learns", "a gains", "gain", ("a",), family="testbed")]
  prim, s = rl_table.gated(results, ("a", "b"), gate, "pass@1", 2, "t")
  assert list(s)[0] == "start_pass@1" and s["start_pass@1"] == pytest.approx(0.2)
  np.testing.assert_allclose(prim["a"], [0.35, 0.55])
  assert s["gains"]["a"]["mean"] == pytest.approx(0.25)
  _, given = rl_table.gated(results, ("a", "b"), gate, "pass@1", 2, "t", 0.1)
  assert "start_pass@1" not in given and given["gains"]["b"]["mean"] == pytest.approx(0.2)
  merged = rl_table.merge_subtables({"verdicts": {"x": 1}, "arm_seconds": {}, "sub": given,
                                     "none": None}, ("sub", "none"))
  assert merged["verdicts"] == {"x": 1, "a_learns": given["verdicts"]["a_learns"]}


class Rollouts(NamedTuple):
  tokens: jax.Array
  mask: jax.Array
  rewards: jax.Array
  correct: jax.Array


def _fake_trainer(rewards):
  """A policy whose row i of every sampled chunk has token i and reward ``rewards[i]`` (correct
  where the reward is 1)."""
  r = jnp.asarray(rewards, jnp.float32)

  def sample(params, idx, key):
    pos = jnp.arange(idx.shape[0]) % r.shape[0]
    return Rollouts(pos[:, None].astype(jnp.int32), jnp.ones((idx.shape[0], 1), bool), r[pos],
                    r[pos] == 1.0)

  return SimpleNamespace(sample=sample, ref_params={})


def test_advantage_mass_by_hand():
  # prompt 0: rewards 1 1 0 0 (accuracy 0.5); prompt 1: 1 0 0 0 (accuracy 0.25)
  tr = _fake_trainer([1, 1, 0, 0, 1, 0, 0, 0])
  out = rl_seeds.advantage_mass(tr, {"dr_grpo": {"max_length": 1}, "grpo": {}}, 2, 4)
  assert out["accuracy"] == [0.0, 0.25, 0.5, 0.75, 1.0] and out["groups"] == [0, 1, 1, 0, 0]
  # A = r - mean: the sum of |A| over a group of accuracy a is 2 N a (1 - a)
  np.testing.assert_allclose(out["dr_grpo"], [np.nan, 1.5, 2.0, np.nan, np.nan], rtol=1e-6)
  # A = (r - mean) / std, the unbiased std: 0.5 at a = 0.25 (1.5 / 0.5 + 3 x 0.25 / 0.5 = 3),
  # sqrt(1 / 3) at a = 0.5 (4 x 0.5 sqrt(3) = 2 sqrt(3))
  np.testing.assert_allclose(out["grpo"][1:3], [3.0, 2 * np.sqrt(3)], rtol=1e-4)


def test_fresh_group_sign_flips_by_hand():
  # one prompt: every sample's reward is its row's, 1 0 0 0, so the reference baseline is 0.25
  tr = _fake_trainer([1, 0, 0, 0])
  rewards = {"k": lambda tokens, mask, idx: np.asarray([1.0, 0, 0, 0])[np.asarray(tokens)[:, 0]]}
  out = rl_seeds.fresh_group_sign_flips(tr, {"mean": ("grpo", {}, 0)}, (2, 4), rewards,
                                        prompts=1, reference=4, pool=4)
  # G=2: groups (1, 0) and (0, 0): A = +1, -1, 0, 0 against r - b = +.75, -.25, -.25, -.25
  g2 = out["k"]["mean"][2]
  assert (g2["opposite"], g2["zeroed"], g2["correct"], g2["count"]) == (0.0, 0.5, 0.5, 4)
  # G=4: one group, A = r - mean over the std: every sign agrees with r - b
  g4 = out["k"]["mean"][4]
  assert (g4["opposite"], g4["zeroed"], g4["correct"], g4["count"]) == (0.0, 0.0, 1.0, 4)


@pytest.mark.parametrize("name", ["mc_grpo", "dars", "ace"])
def test_committed_results_rejudge_to_the_committed_table(tmp_path, name):
  """Each RL table's committed results.json re-judges to its committed table.md (the table's
  renderer and the shared layer give the committed text from the per-seed numbers)."""
  import importlib
  import pathlib
  import shutil

  from experiments import harness

  committed = pathlib.Path(__file__).resolve().parents[2] / "results" / name
  shutil.copy(committed / "results.json", tmp_path / "results.json")
  harness.rejudge(importlib.import_module(f"experiments.{name}").EXPERIMENT, str(tmp_path))
  assert (tmp_path / "table.md").read_text() == (committed / "table.md").read_text()
