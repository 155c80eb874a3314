"""The EMA risk-bound simulation (experiments/averaging/ema_risk.py): the closed-form risk, the
exact bias-variance decomposition, the exact expectations, the averaging recursions by hand, and
the --quick run's outputs through scripts/reproduce.py (its generated docs:
tests/experiments/test_docsync.py)."""

import dataclasses
import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from experiments import harness
from experiments.averaging import ema_risk as M
from rlpost import averaging
from scripts import reproduce

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tiny_problem(d=4, steps=20, evals=4):
  """A small problem with the module's spectrum and step size and a short horizon."""
  p = M.problem(dict(M.get_config(quick=True), d=d, evals=evals))
  return dataclasses.replace(p, steps=steps, eval_steps=np.arange(evals + 1) * (steps // evals),
                             tail_start=steps // 2, decays=(0.9, 0.7, 0.5))


def test_closed_form_risk_matches_monte_carlo():
  rng = np.random.default_rng(0)
  lam = np.array([1.0, 0.5, 0.25])
  w_star, w, sigma, n = np.ones(3), np.array([0.3, -1.2, 2.0]), 0.7, 400_000
  x = rng.standard_normal((n, 3)) * np.sqrt(lam)
  y = x @ w_star + sigma * rng.standard_normal(n)
  loss = 0.5 * (y - x @ w) ** 2 - 0.5 * (y - x @ w_star) ** 2  # R(w) - R(w*) per sample
  exact = float(M.band_risks(jnp.asarray(w - w_star), jnp.asarray(lam), jnp.ones((3, 1)))[0])
  assert exact == pytest.approx(0.5 * np.sum(lam * (w - w_star) ** 2))
  assert abs(loss.mean() - exact) < 4 * loss.std() / np.sqrt(n)


def test_bias_plus_variance_is_the_full_error():
  p = tiny_problem(d=6, steps=40)
  risks, gap = M.simulate(p, np.arange(8))
  assert risks.dtype == np.float64 and risks.shape == (8, 5, len(p.arms), 3, 3)
  assert np.all(gap < 1e-12)
  # the parts are not trivial: both moved, and the total is not either part alone
  bias, var, total = (risks[:, -1, 0, part].sum(-1) for part in range(3))
  assert np.all(var > 0) and np.all(bias < risks[:, 0, 0, 0].sum(-1))
  assert not np.allclose(total, var) and not np.allclose(total, bias)


def test_expected_risks_match_the_seed_means():
  p = tiny_problem(d=4, steps=20)
  risks, _ = M.simulate(p, np.arange(20_000))
  exact = M.oracle(p)  # [E+1, A, 2, K]
  mean = risks[..., :2, :].mean(0)
  se = risks[..., :2, :].std(0, ddof=1) / np.sqrt(risks.shape[0])
  np.testing.assert_allclose(mean[0], exact[0], rtol=1e-12)  # t = 0 is deterministic
  z = (mean[1:] - exact[1:]) / se[1:]
  assert np.max(np.abs(z)) < 5, np.max(np.abs(z))
  # the parts' expected risks are what the seed means estimate, not their sum with a cross term
  assert np.all(exact[1:, :, 1] > 0)


def test_averaging_recursions_by_hand():
  e = [np.array([[-1.0, 2.0]]), np.array([[0.5, 1.0]]), np.array([[2.0, -1.0]]),
       np.array([[1.0, 3.0]])]  # errors e_0..e_3 of one row
  beta, tail_start = 0.6, 2
  m = jnp.broadcast_to(jnp.asarray(e[0]), (3, 1, 2))
  for t in (1, 2, 3):
    c = M.average_coefficients(jnp.asarray(t), (beta,), tail_start)
    m = M.update_averages(m, jnp.asarray(e[t]), c)
  ema = beta**3 * e[0] + (1 - beta) * (beta**2 * e[1] + beta * e[2] + e[3])
  np.testing.assert_allclose(m[0], ema, rtol=1e-6)
  np.testing.assert_allclose(m[1], (e[0] + e[1] + e[2] + e[3]) / 4, rtol=1e-6)
  np.testing.assert_allclose(m[2], (e[2] + e[3]) / 2, rtol=1e-6)
  # the same as rlpost.averaging's EMA started at the initial parameters and SWA from step 2
  for tx, row in ((averaging.ema(beta, debias=False), 0), (averaging.swa(start=tail_start), 2)):
    state = tx.init(jnp.asarray(e[0]))
    for t in (1, 2, 3):
      state = tx.update(jnp.asarray(e[t]), state)
    np.testing.assert_allclose(tx.result(state, jnp.asarray(e[3])), m[row], rtol=1e-6)


def test_sgd_step_is_the_sgd_update_on_the_error():
  w_star, w = np.array([1.0, -0.5, 2.0]), np.array([0.2, 0.1, -0.3])
  x, xi, eta = np.array([0.7, -1.1, 0.4]), 0.3, 0.05
  y = x @ w_star + xi
  w_next = w + eta * (y - x @ w) * x
  rows = jnp.asarray(np.stack([w - w_star, w - w_star]))
  out = M.sgd_step(rows, jnp.asarray(x), jnp.asarray(xi), eta, jnp.asarray([0.0, 1.0]))
  np.testing.assert_allclose(out[1], w_next - w_star, rtol=1e-6)
  np.testing.assert_allclose(out[0], w - w_star - eta * (x @ (w - w_star)) * x, rtol=1e-6)


def test_quick_run_writes_the_declared_outputs(tmp_path, capsys):
  out = tmp_path / "ema_risk"
  report = reproduce.main(["ema_risk", "--quick", "--out", str(out), "--no-progress"])
  res = json.loads((out / "results.json").read_text())
  assert {"experiment", "command", "config", "machine", "seconds", "unit_seconds", "units",
          "data", "summary"} <= set(res)
  assert res["experiment"] == "ema_risk" and res["units_run"] == ["simulation"]
  assert res["command"] == "python scripts/reproduce.py ema_risk --quick"
  data = res["data"]
  assert {"problem", "seed_ids", "pilot_seed_ids", "power", "per_seed", "curves",
          "oracle_curves", "decomposition_gap", "seconds"} <= set(data)
  n = len(data["seed_ids"])
  assert n >= 8 and n == data["power"]["seeds"] >= data["power"]["seeds_needed"]
  assert not set(data["seed_ids"]) & set(data["pilot_seed_ids"])
  p = M.problem(res["config"])
  ids = [c.id for c in M.claims(p)]
  assert [r["claim"]["id"] for r in res["summary"]["claims"]] == ids
  assert set(data["power"]["claims"]) == set(ids)
  for r in res["summary"]["claims"]:
    assert r["verdict"] in M.VERDICTS and r["n"][0] == n
    assert {"diff", "lo", "hi", "p", "p_holm", "p_permutation", "mde", "exact_diff"} <= set(r)
  for key, shape in (("final_bias", (n, len(p.arms), 3)), ("variance_all", (n, len(p.arms))),
                     ("log_slope", (n, len(p.arms), 3)), ("loglog_slope", (n, len(p.arms), 3))):
    assert np.asarray(data["per_seed"][key]).shape == shape
  assert np.asarray(data["curves"]["mean"]).shape == (p.evals + 1, len(p.arms), 3, 3)
  assert np.asarray(data["oracle_curves"]).shape == (p.evals + 1, len(p.arms), 2, 3)
  table = (out / "table.md").read_text()
  assert table.startswith("# EMA risk bounds for SGD")
  for row in ("| seeds |", "| steps |", "| d |", "| spectrum |", "| step size |", "| decays |",
              "| primary metrics |", "| wall time |", "| min. detectable effect |", "| verdict |"):
    assert row in table
  assert report["summary"] == res["summary"]
  # a rerun simulates nothing; re-judging gives the same table without simulating
  again = reproduce.main(["ema_risk", "--quick", "--out", str(out), "--no-progress"])
  assert again["units_run"] == [] and again["summary"] == res["summary"]
  reproduce.main(["ema_risk", "--rejudge", "--out", str(out)])
  assert (out / "table.md").read_text() == table
  # the former entry point runs the same
  capsys.readouterr()
  M.main(["--quick", "--out", str(out), "--no-progress"])
  assert "python scripts/reproduce.py ema_risk" in capsys.readouterr().err
  assert (out / "table.md").read_text() == table


def test_replication_reruns_the_committed_table_at_fresh_seed_ids(tmp_path, capsys):
  out = tmp_path / "ema_risk"
  res = reproduce.main(["ema_risk", "--quick", "--out", str(out), "--no-progress"])
  committed = (out / "results.json").read_bytes()
  n = len(res["data"]["seed_ids"])

  def replicate(*args):
    return reproduce.main(["ema_risk", "--replicate", "--out", str(out), "--no-progress", *args])

  rep = replicate("--seed-offset", "500")
  assert (out / "results.json").read_bytes() == committed  # what it reads is kept
  new = json.loads((out / "replication" / "results.json").read_text())
  assert new["data"]["seed_ids"] == list(range(500, 500 + n))
  assert new["config"] == dict(res["config"], seeds=n, seed_offset=500)
  ids = [r["claim"]["id"] for r in res["summary"]["claims"]]
  assert [r["id"] for r in rep["rows"]] == ids
  moved = [r for r in rep["rows"] if r["committed"]["diff"] != r["new"]["diff"]]
  assert len(moved) == len(ids)  # fresh sample streams: every estimate differs
  for r in rep["rows"]:
    assert r["change"] is not None and 0 <= r["change"]["p"] <= 1
  text = (out / "replication.md").read_text()
  assert text in capsys.readouterr().out
  assert f"{n} fresh seeds (from 500; the committed table used {n} seeds from 0)" in text
  assert "compares sample streams (seeds) only" in text and "Changes significant at" in text
  assert "Wall time: " in text and " s (pilot, main run and exact expectations" in text
  # re-judging the replication rewrites the same markdown without simulating
  replicate("--rejudge")
  assert (out / "replication.md").read_text() == text
  # another seed set goes beside the committed replication; the same one rewrites it
  other = replicate("--seed-offset", "900", "--seeds", "4")
  assert other["markdown"] == str(out / "replication-900x4" / "replication.md")
  assert (out / "replication.md").read_text() == text
  assert (out / "replication-900x4" / "results.json").exists()
  again = replicate("--seed-offset", "500")
  assert again["markdown"] == str(out / "replication.md")
  assert again["report"]["units_run"] == []  # from the replication's cache
  with pytest.raises(SystemExit) as e:
    reproduce.main(["ema_risk", "--out", str(out), "--seed-offset", "500"])
  assert e.value.code == 2
  # ids the table used (main or pilot) are refused before any simulation
  for offset in (0, M.PILOT_SEED_BASE - 1):
    with pytest.raises(ValueError, match=f"--seed-offset {offset}: seed ids .* overlap"):
      replicate("--seed-offset", str(offset))
  with pytest.raises(FileNotFoundError, match="no committed"):
    reproduce.main(["ema_risk", "--replicate", "--out", str(tmp_path / "none")])


def test_quick_run_moved(tmp_path):
  """Precondition of every comparison: SGD left w_0, and the arms differ."""
  config = M.get_config(quick=True)
  p = M.problem(config)
  risks, _ = M.simulate(p, np.arange(4))
  initial = risks[:, 0, 0, 2].sum(-1)
  final = risks[:, -1, :, 2].sum(-1)  # [S, A] total risk at T
  assert np.allclose(initial, 0.5 * p.lam.sum())
  assert np.all(final < 0.5 * initial[:, None])
  assert np.all(np.abs(final[:, 1] - final[:, 0]) > 1e-3 * final[:, 0])  # EMA is not w_T


def test_committed_results_rejudge_to_the_committed_tables(tmp_path):
  """results/ema_risk/results.json alone regenerates table.md, and with replication/results.json
  the replication.md (no simulation)."""
  src = os.path.join(ROOT, "results", "ema_risk")
  out = tmp_path / "ema_risk"
  shutil.copytree(src, out, ignore=shutil.ignore_patterns("cache"))
  harness.rejudge(M.EXPERIMENT, str(out))
  M.replicate(str(out), rejudge=True)
  for name in ("table.md", "replication.md"):
    with open(os.path.join(src, name)) as f:
      assert (out / name).read_text() == f.read(), name
