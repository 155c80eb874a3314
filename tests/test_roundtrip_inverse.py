"""The inverse-solver speed experiment (``experiments/roundtrip/inverse.py``): the three estimates
on a stepper with a known inverse, and a toy-size run end to end with its re-judge."""

import json
import os
import shutil

import numpy as np
import pytest

from experiments import docsync
from experiments.roundtrip import inverse as inv
from rlpost.dynamics import rollout as rollout_lib
from scripts import reproduce

VERDICTS = {"reproduced", "not reproduced", "inconclusive"}


def _drift(x, direction):
  return x + 0.1 * direction  # F^d(x) = x + 0.1 d; its exact inverse steps back


def test_solve_on_a_stepper_with_a_known_inverse():
  """The backward rollout of an exactly invertible stepper recovers x_0; the optimisation moves
  from x_d toward it, its error falling with the steps; persistence is the start's error."""
  stepper = rollout_lib.as_stepper(_drift, spatial_dims=1, num_fields=1)
  rng = np.random.default_rng(0)
  x0 = rng.normal(size=(3, 8, 1)).astype(np.float32) + 2.0
  truth = np.stack([x0 + 0.1 * t for t in range(4)], axis=1)  # [N, T, S, F]
  got = inv.solve(stepper, truth, depth=2, steps=[1, 3, 10, 30], lr=0.01)
  assert got["backward"].shape == (3,) and got["optimised"].shape == (4, 3)
  np.testing.assert_allclose(got["backward"], 0.0, atol=1e-6)
  expected = np.linalg.norm(0.2 * np.ones((8, 1))) / np.linalg.norm(x0, axis=(1, 2))
  np.testing.assert_allclose(got["persistence"], expected, rtol=1e-5)
  opt = got["optimised"].mean(1)
  assert np.all(np.diff(opt) < 0) and opt[0] < got["persistence"].mean()  # it moved, and down
  assert got["t_backward"] > 0 and got["t_step"] > 0


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("roundtrip_inverse")
  module, readme = docsync.paths(inv.EXPERIMENT)
  docs = open(module).read(), open(readme).read()
  reproduce.main(["roundtrip_inverse", "--quick", "--out", str(out), "--no-progress"])
  assert (open(module).read(), open(readme).read()) == docs  # a quick run leaves the docs alone
  return out


def test_quick_run_and_rejudge(quick_run, tmp_path):
  out = quick_run
  res = json.loads((out / "results.json").read_text())
  cfg = res["config"]
  per_seed = res["data"]["per_seed"]
  assert len(per_seed) == cfg["seeds"] == 2
  for s in per_seed:
    assert [d["depth"] for d in s["per_depth"]] == cfg["depths"]
    for d in s["per_depth"]:
      assert np.shape(d["optimised"]) == (len(cfg["lrs"]), len(cfg["steps"]))
      assert np.all(np.isfinite(d["optimised"])) and d["backward"] > 0
      for per_lr in d["optimised"]:
        assert per_lr[-1] != d["persistence"]  # the optimisation moved x off x_d
  (claim,) = res["summary"]["claims"]
  assert claim["claim"]["id"] == "inverse_fast" and claim["verdict"] in VERDICTS
  assert claim["n"][0] == 2
  table = (out / "table.md").read_text()
  assert "## Paper claims" in table and "## Per depth" in table
  assert os.path.getsize(out / "inverse_convergence.png") > 0
  shutil.copy(out / "results.json", tmp_path / "results.json")
  reproduce.main(["roundtrip_inverse", "--rejudge", "--out", str(tmp_path)])
  assert (tmp_path / "table.md").read_text() == table


def test_metrics_take_the_best_learning_rate_and_the_worst_depth():
  config = {"steps": [1, 30], "budget": 30}
  s = {"per_depth": [  # two learning rates per depth: [error after 1 step, after 30]
      {"backward": 0.01, "optimised": [[0.5, 0.3], [0.4, 0.1]], "t_step": 0.2, "t_backward": 0.01},
      {"backward": 0.1, "optimised": [[0.6, 0.2], [0.5, 0.4]], "t_step": 0.4, "t_backward": 0.02}]}
  m = inv.seed_metrics(config, s)
  assert m["best_lr"] == [1, 0] and m["best"] == [[0.4, 0.1], [0.6, 0.2]]
  assert m["log_ratio_worst"] == pytest.approx(np.log(2.0))  # depth 2: 0.2 / 0.1
  assert m["wall_ratio"] == pytest.approx([600.0, 600.0])


def test_committed_results_rejudge_to_the_committed_table(tmp_path):
  """results/roundtrip_inverse's per-seed numbers re-judge to its committed table."""
  from experiments import harness

  committed = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "results", "roundtrip_inverse")
  shutil.copy(os.path.join(committed, "results.json"), tmp_path / "results.json")
  harness.rejudge(inv.EXPERIMENT, str(tmp_path))
  with open(os.path.join(committed, "table.md")) as f:
    assert (tmp_path / "table.md").read_text() == f.read()
  res = json.loads((tmp_path / "results.json").read_text())
  assert res["config"]["seeds"] == len(res["data"]["per_seed"]) == inv.MIN_SEEDS
