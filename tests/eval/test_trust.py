"""Trust metrics against hand values and scipy / scikit-learn references."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps
from sklearn.linear_model import LinearRegression
from sklearn.metrics import roc_auc_score

from rlpost.eval import trust


def test_relative_l2_by_hand():
  ref = np.array([[3.0, 4.0], [1.0, 0.0]])
  pred = np.array([[3.0, 4.0 + 5.0], [1.0, 1.0]])
  np.testing.assert_allclose(trust.relative_l2(pred, ref, axes=1), [1.0, 1.0])
  np.testing.assert_allclose(trust.relative_l2(pred, ref), np.sqrt(26.0) / np.sqrt(26.0))
  # States [B, X, F]: pooled over space and fields, and per field.
  ref = np.zeros((1, 2, 2))
  ref[0, :, 0] = [3.0, 4.0]  # norm 5
  ref[0, :, 1] = [0.0, 1.0]  # norm 1
  pred = ref.copy()
  pred[0, 0, 1] = 2.0  # error 2 in field 1
  pooled, per = trust.field_errors(pred, ref, spatial_dims=1)
  np.testing.assert_allclose(per, [[0.0, 2.0]])
  np.testing.assert_allclose(pooled, [2.0 / np.sqrt(26.0)])
  assert trust.relative_l2(np.ones(2), np.zeros(2)) == np.inf
  with pytest.raises(ValueError, match="shapes differ"):
    trust.field_errors(pred, ref[..., :1], 1)


def test_rollout_error_shapes_2d():
  truth = np.random.default_rng(0).normal(size=(3, 5, 4, 4, 2))
  pooled, per = trust.rollout_error(truth * 1.5, truth, spatial_dims=2)
  assert pooled.shape == (3, 5) and per.shape == (3, 5, 2)
  np.testing.assert_allclose(pooled, 0.5)
  np.testing.assert_allclose(per, 0.5)


@pytest.mark.parametrize("seed", range(5))
def test_rankdata_and_spearman_match_scipy_with_ties(seed):
  rng = np.random.default_rng(seed)
  x = rng.integers(0, 6, size=40).astype(float)  # many ties
  y = x + rng.integers(0, 4, size=40)
  np.testing.assert_allclose(trust.rankdata(x), sps.rankdata(x))
  assert trust.spearman(x, y) == pytest.approx(sps.spearmanr(x, y).statistic, abs=1e-12)
  z = rng.normal(size=40)
  assert trust.spearman(z, y) == pytest.approx(sps.spearmanr(z, y).statistic, abs=1e-12)


def test_spearman_edge_cases():
  assert np.isnan(trust.spearman(np.ones(5), np.arange(5.0)))
  assert trust.spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
  with pytest.raises(ValueError, match="NaN"):
    trust.spearman([1.0, np.nan], [1.0, 2.0])
  with pytest.raises(ValueError, match="elements"):
    trust.spearman([1.0, 2.0], [1.0])


def test_fixed_depth_and_within_trajectory_spearman():
  rng = np.random.default_rng(1)
  c = rng.normal(size=(6, 10))
  e = c + rng.normal(size=(6, 10))
  per_depth = trust.fixed_depth_spearman(c, e)
  np.testing.assert_allclose(per_depth, [sps.spearmanr(c[:, k], e[:, k]).statistic
                                         for k in range(10)], atol=1e-12)
  mean, std, per = trust.within_trajectory_spearman(c, e)
  ref = np.array([sps.spearmanr(c[i], e[i]).statistic for i in range(6)])
  np.testing.assert_allclose(per, ref, atol=1e-12)
  assert mean == pytest.approx(ref.mean()) and std == pytest.approx(ref.std())
  _, std1, _ = trust.within_trajectory_spearman(c, e, ddof=1)
  assert std1 == pytest.approx(ref.std(ddof=1))
  # A trajectory with constant errors has no ranking: left out, not counted as 0.
  e[2] = 1.0
  mean, _, per = trust.within_trajectory_spearman(c, e)
  assert np.isnan(per[2]) and mean == pytest.approx(np.nanmean(per))


@pytest.mark.parametrize("seed", range(5))
def test_auroc_matches_sklearn_with_ties(seed):
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 2, size=50)
  labels[:2] = [0, 1]
  scores = rng.integers(0, 5, size=50) + labels  # integer scores: ties across classes
  assert trust.auroc(scores, labels) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
  cont = rng.normal(size=50) + labels
  assert trust.auroc(cont, labels.astype(bool)) == pytest.approx(roc_auc_score(labels, cont))


def test_auroc_edge_cases():
  assert trust.auroc([0.1, 0.2, 0.9, 1.0], [0, 0, 1, 1]) == 1.0
  assert trust.auroc([0.9, 1.0, 0.1, 0.2], [0, 0, 1, 1]) == 0.0  # an inverted score
  assert trust.auroc([1.0, 1.0, 1.0], [0, 1, 1]) == 0.5
  with pytest.raises(ValueError, match="both classes"):
    trust.auroc([1.0, 2.0], [1, 1])
  with pytest.raises(ValueError, match="labels"):
    trust.auroc([1.0, 2.0], [0, 2])


def _lognormal_rollouts(n, rng, coef=(-2.0, 0.8, 0.05), sigma=0.13):
  depth = rng.choice([1, 2, 4, 8, 16], size=n)
  log_c = rng.normal(-2.0, 0.7, size=n) + 0.05 * depth
  log_e = coef[0] + coef[1] * log_c + coef[2] * depth + sigma * rng.normal(size=n)
  return np.exp(log_c), np.exp(log_e), depth


def test_calibrator_recovers_coefficients_and_nominal_coverage():
  rng = np.random.default_rng(0)
  c, e, depth = _lognormal_rollouts(4000, rng)
  cal = trust.Calibrator.fit(c, e, depth)
  np.testing.assert_allclose(cal.coef, [-2.0, 0.8, 0.05], atol=0.02)
  assert cal.sigma == pytest.approx(0.13, rel=0.05)
  # Reference: ordinary least squares of scikit-learn on the same design.
  x = np.column_stack([np.log(c), depth])
  ref = LinearRegression().fit(x, np.log(e))
  np.testing.assert_allclose(cal.coef, [ref.intercept_, *ref.coef_], atol=1e-9)
  # Held-out rollouts from the same law: nominal coverage and the paper-style width factors.
  c2, e2, d2 = _lognormal_rollouts(4000, rng)
  assert cal.coverage(c2, e2, d2, trust.LEVEL_1SIGMA) == pytest.approx(0.6827, abs=0.025)
  assert cal.coverage(c2, e2, d2, 0.95) == pytest.approx(0.95, abs=0.015)
  lo, hi, factor = cal.interval(c2, d2, trust.LEVEL_1SIGMA)
  np.testing.assert_allclose(factor, np.exp(cal.sigma))
  np.testing.assert_allclose(hi / lo, np.exp(2 * cal.sigma))
  assert np.exp(0.13) == pytest.approx(1.14, abs=0.005)  # the paper's 68% factor at sigma 0.13
  np.testing.assert_allclose(cal.interval(c2, d2, 0.95).factor, np.exp(1.959964 * cal.sigma),
                             rtol=1e-6)
  # NLL of a correct Gaussian model: 0.5 log(2 pi sigma^2) + 1/2.
  expect = 0.5 * np.log(2 * np.pi * 0.13 ** 2) + 0.5
  assert cal.nll(c2, e2, d2) == pytest.approx(expect, abs=0.05)
  # The depth-only baselines explain less and pay for it in held-out NLL.
  for kind in ("depth", "depth_onehot"):
    base = trust.Calibrator.fit(None, e, depth, kind=kind)
    assert base.nll(None, e2, d2) > cal.nll(c2, e2, d2) + 0.5
    assert base.coverage(None, e2, d2, 0.95) == pytest.approx(0.95, abs=0.02)
  both = trust.Calibrator.fit(c, e, depth, kind="c_depth_onehot")
  assert both.nll(c2, e2, d2) == pytest.approx(cal.nll(c2, e2, d2), abs=0.02)


def test_calibrator_variants_and_errors():
  rng = np.random.default_rng(1)
  depth = np.repeat([1, 4, 16], 2000)
  sig = np.where(depth == 1, 0.1, np.where(depth == 4, 0.2, 0.4))
  log_e = 0.3 * np.log(depth) - 3.0 + sig * rng.normal(size=depth.size)
  cal = trust.Calibrator.fit(None, np.exp(log_e), depth, kind="depth", depth_transform="log",
                             sigma_by_depth=True)
  np.testing.assert_allclose(cal.coef, [-3.0, 0.3], atol=0.02)
  np.testing.assert_allclose(cal.sigma_levels, [0.1, 0.2, 0.4], rtol=0.06)
  assert cal.depth_levels == (1, 4, 16)
  lo, hi, factor = cal.interval(None, [1, 16], 0.95)
  np.testing.assert_allclose(np.log(factor), 1.959964 * np.asarray(cal.sigma_levels)[[0, 2]],
                             rtol=1e-6)
  with pytest.raises(ValueError, match="not seen"):
    cal.interval(None, [2], 0.95)
  onehot = trust.Calibrator.fit(None, np.exp(log_e), depth, kind="depth_onehot")
  with pytest.raises(ValueError, match="not seen"):
    onehot.predict(None, [8])
  with pytest.raises(ValueError, match="needs the round-trip"):
    trust.Calibrator.fit(None, np.exp(log_e), depth)
  with pytest.raises(ValueError, match="positive"):
    trust.Calibrator.fit(np.zeros(depth.size), np.exp(log_e), depth)
  with pytest.raises(ValueError, match="kind"):
    trust.Calibrator.fit(None, np.exp(log_e), depth, kind="quantile")
  with pytest.raises(ValueError, match="level"):
    trust.z_for_level(1.0)


def test_selective_error_reduction_by_hand():
  errors = np.array([1.0, 2.0, 3.0, 4.0, 10.0])
  # The oracle keeps the four smallest errors: 1 - 2.5 / 4.
  assert trust.selective_error_reduction(errors, errors, 0.8) == pytest.approx(0.375)
  assert trust.selective_risk(errors, errors, 0.8) == pytest.approx(2.5)
  # An uninformative (constant) score keeps everything in expectation: no reduction.
  assert trust.selective_error_reduction(errors, np.zeros(5), 0.8) == pytest.approx(0.0)
  # The worst score abstains on the wrong rollout and makes things worse.
  assert trust.selective_error_reduction(errors, -errors, 0.8) < 0
  # A tie at the boundary is shared: scores [0, 0, 0, 1, 1] keep 3 + half of the tied pair.
  scores = np.array([0.0, 0.0, 0.0, 1.0, 1.0])
  kept = (1.0 + 2.0 + 3.0 + 0.5 * (4.0 + 10.0)) / 4.0
  assert trust.selective_risk(errors, scores, 0.8) == pytest.approx(kept)
  # Order of the inputs does not matter.
  perm = np.array([3, 0, 4, 2, 1])
  assert trust.selective_risk(errors[perm], scores[perm], 0.8) == pytest.approx(kept)
  with pytest.raises(ValueError, match="coverage"):
    trust.selective_risk(errors, scores, 0.0)


def test_risk_coverage_curve():
  rng = np.random.default_rng(0)
  errors = rng.exponential(size=30)
  cov, risk = trust.risk_coverage_curve(errors, errors)
  assert cov.shape == risk.shape == (30,)
  assert risk[-1] == pytest.approx(errors.mean())
  assert risk[0] == pytest.approx(errors.min())
  assert np.all(np.diff(risk) >= -1e-12)  # the oracle's risk grows with coverage
  cov, risk = trust.risk_coverage_curve(errors, errors, [0.5, 1.0])
  np.testing.assert_allclose(cov, [0.5, 1.0])


def test_dispersion_by_hand():
  # Two samples of two rollouts [M=2, B=2, X=2]: deviations of +-1 in one cell.
  samples = np.array([[[1.0, 0.0], [2.0, 2.0]], [[3.0, 0.0], [2.0, 2.0]]])
  raw, rel = trust.dispersion(samples)
  np.testing.assert_allclose(raw, [1.0, 0.0])
  np.testing.assert_allclose(rel, [1.0 / 2.0, 0.0])  # ensemble mean [2, 0] has norm 2
  raw_all, _ = trust.dispersion(samples, axes=(0, 1))
  np.testing.assert_allclose(raw_all, 1.0)
  with pytest.raises(ValueError, match="M >= 2"):
    trust.dispersion(samples[:1])
