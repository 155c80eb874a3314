"""Small-sample statistics against scipy.stats, hand cases and vectorised coverage simulations."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats as sps

from rlpost.eval import stats

SEEDS_A = np.array([0.61, 0.58, 0.66, 0.63, 0.55])
SEEDS_B = np.array([0.52, 0.57, 0.49, 0.60, 0.54, 0.50])


def _mean_diff(a, b, axis=-1):
  return np.mean(a, axis=axis) - np.mean(b, axis=axis)


# ----------------------------------------------------------------------------- scipy agreement


@pytest.mark.parametrize("level", [0.9, 0.95, 0.99])
def test_t_intervals_match_scipy(level):
  m, lo, hi = stats.mean_interval(SEEDS_A, level)
  ci = sps.ttest_1samp(SEEDS_A, 0.0).confidence_interval(level)
  np.testing.assert_allclose([m, lo, hi], [SEEDS_A.mean(), ci.low, ci.high], rtol=0, atol=1e-8)

  d, lo, hi = stats.diff_interval(SEEDS_A, SEEDS_B, level)
  ci = sps.ttest_ind(SEEDS_A, SEEDS_B, equal_var=False).confidence_interval(level)
  np.testing.assert_allclose([d, lo, hi], [SEEDS_A.mean() - SEEDS_B.mean(), ci.low, ci.high],
                             atol=1e-8)

  b = SEEDS_B[:5]
  d, lo, hi = stats.diff_interval(SEEDS_A, b, level, paired=True, method="t")
  ci = sps.ttest_rel(SEEDS_A, b).confidence_interval(level)
  np.testing.assert_allclose([d, lo, hi], [np.mean(SEEDS_A - b), ci.low, ci.high], atol=1e-8)


@pytest.mark.parametrize("alternative", ["two-sided", "greater", "less"])
def test_t_test_matches_scipy(alternative):
  p = stats.t_test(SEEDS_A, SEEDS_B, alternative=alternative)
  ref = sps.ttest_ind(SEEDS_A, SEEDS_B, equal_var=False, alternative=alternative).pvalue
  np.testing.assert_allclose(p, ref, atol=1e-8)
  p = stats.t_test(SEEDS_A, SEEDS_B[:5], paired=True, alternative=alternative)
  np.testing.assert_allclose(p, sps.ttest_rel(SEEDS_A, SEEDS_B[:5], alternative=alternative).pvalue,
                             atol=1e-8)


def test_bca_matches_scipy_same_seed():
  def scipy_ci(data, statistic, paired=False, method="BCa"):
    ci = sps.bootstrap(data, statistic, n_resamples=2999, paired=paired, method=method,
                       rng=np.random.default_rng(7)).confidence_interval
    return [ci.low, ci.high]

  _, lo, hi = stats.mean_interval(SEEDS_A, method="bca", n_resamples=2999, seed=7)
  np.testing.assert_allclose([lo, hi], scipy_ci((SEEDS_A,), np.mean), atol=1e-8)
  _, lo, hi = stats.mean_interval(SEEDS_A, method="percentile", n_resamples=2999, seed=7)
  np.testing.assert_allclose([lo, hi], scipy_ci((SEEDS_A,), np.mean, method="percentile"),
                             atol=1e-8)
  for paired, b in ((False, SEEDS_B), (True, SEEDS_B[:5])):
    d, lo, hi = stats.diff_interval(SEEDS_A, b, paired=paired, method="bca", n_resamples=2999,
                                    seed=7)
    assert d == pytest.approx(SEEDS_A.mean() - b.mean())
    np.testing.assert_allclose([lo, hi], scipy_ci((SEEDS_A, b), _mean_diff, paired), atol=1e-8)
    assert lo < d < hi


@pytest.mark.parametrize("paired", [False, True])
@pytest.mark.parametrize("alternative", ["two-sided", "greater", "less"])
def test_permutation_matches_scipy(paired, alternative):
  # Unpaired C(11, 5) = 462 and paired 2^5 = 32 relabelings: exact; 100 resamples: Monte Carlo.
  b = SEEDS_B[:5] if paired else SEEDS_B
  for n_resamples in (10000, 100):
    p = stats.permutation_test(SEEDS_A, b, paired, alternative, n_resamples=n_resamples, seed=3)
    ref = sps.permutation_test((SEEDS_A, b), _mean_diff, vectorized=True, n_resamples=n_resamples,
                               permutation_type="samples" if paired else "independent",
                               alternative=alternative, rng=np.random.default_rng(3)).pvalue
    np.testing.assert_allclose(p, ref, atol=1e-8)


# ----------------------------------------------------------------------------- hand cases


def test_exact_permutation_by_hand():
  # C(6, 3) = 20 splits; only the observed split (diff -3) is as extreme on the low side.
  assert stats.permutation_test([1, 2, 3], [4, 5, 6]) == pytest.approx(2 / 20)
  assert stats.permutation_test([1, 2, 3], [4, 5, 6], alternative="less") == pytest.approx(1 / 20)
  assert stats.permutation_test([1, 2, 3], [4, 5, 6], alternative="greater") == pytest.approx(1)

  # Unpaired by enumeration of all C(9, 4) = 126 splits, one-sided.
  a, b = SEEDS_A[:4], SEEDS_B[:5]
  pooled, obs = np.concatenate([a, b]), a.mean() - b.mean()
  diffs = []
  for idx in itertools.combinations(range(9), 4):
    mask = np.zeros(9, bool)
    mask[list(idx)] = True
    diffs.append(pooled[mask].mean() - pooled[~mask].mean())
  ref = np.mean(np.array(diffs) >= obs - 1e-12)
  assert stats.permutation_test(a, b, alternative="greater") == pytest.approx(ref)

  # Paired by enumeration of all 2^5 sign flips of the differences.
  d = SEEDS_A - SEEDS_B[:5]
  flips = np.array(list(itertools.product([1.0, -1.0], repeat=5)))
  ref = np.mean((flips * d).mean(axis=1) >= d.mean() - 1e-12)
  p = stats.permutation_test(SEEDS_A, SEEDS_B[:5], paired=True, alternative="greater")
  assert p == pytest.approx(ref)


def test_holm_by_hand():
  np.testing.assert_allclose(stats.holm([0.01, 0.04, 0.03]), [0.03, 0.06, 0.06])
  # Step-down multipliers m, m-1, ..., the running maximum, and the cap at 1.
  np.testing.assert_allclose(stats.holm([0.5, 0.01, 0.2, 0.02]), [0.5, 0.04, 0.4, 0.06])
  np.testing.assert_allclose(stats.holm([0.03, 0.001, 0.04]), [0.06, 0.003, 0.06])
  np.testing.assert_allclose(stats.holm([0.9, 0.8]), [1.0, 1.0])
  np.testing.assert_allclose(stats.holm([0.02]), [0.02])
  with pytest.raises(ValueError, match=r"pvalues must lie in \[0, 1\]"):
    stats.holm([0.1, 1.2])


def test_tost_by_hand_and_against_one_sided_scipy_tests():
  rng = np.random.default_rng(0)
  a = 0.50 + 0.002 * rng.standard_normal(6)
  b = 0.50 + 0.002 * rng.standard_normal(6)
  a, b = a - a.mean() + 0.5, b - b.mean() + 0.5  # identical means, tight spread
  p, lo, hi = stats.tost(a, b, margin=0.01)
  assert p < 0.05 and -0.01 < lo < 0 < hi < 0.01
  # Observed difference 0.02 against a margin of 0.01: far from equivalent.
  p, lo, hi = stats.tost(a + 0.02, b, margin=0.01)
  assert p > 0.5 and lo > 0.01

  # One-sided p-values are Welch / paired t-tests of the shifted null; the interval is the 90% one.
  margin = 0.05
  for paired, b in ((False, SEEDS_B), (True, SEEDS_B[:5])):
    test = sps.ttest_rel if paired else (lambda x, y, **k: sps.ttest_ind(x, y, equal_var=False,
                                                                         **k))
    p_minus = test(SEEDS_A, b - margin, alternative="greater").pvalue
    p_plus = test(SEEDS_A, b + margin, alternative="less").pvalue
    p, lo, hi = stats.tost(SEEDS_A, b, margin, paired=paired)
    np.testing.assert_allclose(p, max(p_minus, p_plus), atol=1e-8)
    ci = test(SEEDS_A, b).confidence_interval(0.90)
    np.testing.assert_allclose([lo, hi], [ci.low, ci.high], atol=1e-8)
  with pytest.raises(ValueError, match="margin must be finite and > 0"):
    stats.tost(SEEDS_A, SEEDS_B, margin=0.0)


def test_seeds_needed_and_min_detectable_effect():
  assert stats.seeds_needed(1.0, 1.0) == 17
  assert stats.seeds_needed(0.02, 0.02) == 17  # depends on effect / sd only
  # Exact power by hand from the noncentral t: below 0.8 at 16, above at 17.
  for n, above in ((16, False), (17, True)):
    df, nc = 2 * n - 2, np.sqrt(n / 2)
    crit = sps.t.ppf(0.975, df)
    power = sps.nct.sf(crit, df, nc) + sps.nct.cdf(-crit, df, nc)  # no nan at this nc
    assert (power >= 0.8) == above
  # And by simulation, independent of the noncentral t: power of pooled two-sample t-tests.
  rng = np.random.default_rng(0)
  for n, (lo, hi) in ((16, (0.76, 0.795)), (17, (0.80, 0.83))):
    x = rng.standard_normal((40000, 2, n))
    x[:, 0] += 1.0
    sp = np.sqrt((x[:, 0].var(-1, ddof=1) + x[:, 1].var(-1, ddof=1)) / 2)
    t = (x[:, 0].mean(-1) - x[:, 1].mean(-1)) / (sp * np.sqrt(2 / n))
    assert lo < np.mean(np.abs(t) > sps.t.ppf(0.975, 2 * n - 2)) < hi

  # Large n (many blocks): the exact answer exceeds the normal approximation by about z^2/4 ~ 1.
  n_z = 2 * (sps.norm.ppf(0.975) + sps.norm.ppf(0.8)) ** 2 / 0.05**2
  assert n_z < stats.seeds_needed(1.0, 0.05) <= n_z + 3
  ns = [stats.seeds_needed(1.0, e) for e in (0.25, 0.5, 1.0, 1.5, 2.0, 3.0)]
  assert ns == sorted(ns, reverse=True) and ns[-1] >= 2 and ns[0] > 200
  assert stats.seeds_needed(1.0, 1.0, power=0.9) > 17 and stats.seeds_needed(1.0, 1.0, 0.01) > 17

  for sd, effect in ((1.0, 1.0), (0.02, 0.03), (0.5, 0.1)):
    n = stats.seeds_needed(sd, effect)
    assert stats.min_detectable_effect(sd, n) <= effect < stats.min_detectable_effect(sd, n - 1)
  mdes = [stats.min_detectable_effect(1.0, n) for n in (2, 3, 5, 10, 40)]
  assert mdes == sorted(mdes, reverse=True)
  with pytest.raises(ValueError, match="sd must be finite and > 0"):
    stats.seeds_needed(0.0, 1.0)
  with pytest.raises(ValueError, match="effect must be finite and > 0"):
    stats.seeds_needed(1.0, -1.0)
  with pytest.raises(ValueError, match="n must be an integer >= 2"):
    stats.min_detectable_effect(1.0, 1)


def test_degenerate_samples():
  assert stats.mean_interval([2.0, 2.0, 2.0]) == (2.0, 2.0, 2.0)
  assert stats.mean_interval([2.0, 2.0, 2.0], method="bca") == (2.0, 2.0, 2.0)
  assert stats.diff_interval([2.0, 2.0], [1.0, 1.0, 1.0]) == (1.0, 1.0, 1.0)
  assert stats.diff_interval([2.0, 2.0], [1.0, 1.0], method="bca") == (1.0, 1.0, 1.0)
  assert stats.tost([2.0, 2.0], [2.0, 2.0], margin=0.1) == (0.0, 0.0, 0.0)


# ----------------------------------------------------------------------------- coverage


@pytest.mark.parametrize("n", [3, 4, 6, 10])
def test_t_interval_coverage(n):
  rng = np.random.default_rng(n)
  mu, sigma = 0.4, 0.05
  x = rng.normal(mu, sigma, (20000, n))
  m, se = x.mean(1), x.std(1, ddof=1) / np.sqrt(n)
  lo, hi = stats.t_interval(m, se, n - 1, 0.95)
  # The vectorised kernel is what mean_interval computes.
  for i in range(3):
    np.testing.assert_allclose(stats.mean_interval(x[i]), (m[i], lo[i], hi[i]), atol=1e-12)
  assert abs(np.mean((lo <= mu) & (mu <= hi)) - 0.95) < 0.015


@pytest.mark.parametrize("sd_a, sd_b", [(1.0, 3.0), (2.0, 1.0)])
def test_welch_coverage_unequal_variances(sd_a, sd_b):
  rng = np.random.default_rng(11)
  a = rng.normal(1.0, sd_a, (20000, 3))
  b = rng.normal(0.5, sd_b, (20000, 4))
  va, vb = a.var(1, ddof=1), b.var(1, ddof=1)
  d, se = a.mean(1) - b.mean(1), np.sqrt(va / 3 + vb / 4)
  lo, hi = stats.t_interval(d, se, stats.welch_df(va, 3, vb, 4), 0.95)
  for i in range(3):
    np.testing.assert_allclose(stats.diff_interval(a[i], b[i]), (d[i], lo[i], hi[i]), atol=1e-12)
  assert abs(np.mean((lo <= 0.5) & (0.5 <= hi)) - 0.95) < 0.015


def test_percentile_bootstrap_undercovers_at_three_seeds():
  rng = np.random.default_rng(0)
  reps, n, resamples = 2000, 3, 999
  x = rng.standard_normal((reps, n))
  idx = rng.integers(0, n, (reps, resamples, n))
  means = np.take_along_axis(x[:, None, :], idx, axis=2).mean(-1)
  lo, hi = np.quantile(means, [0.025, 0.975], axis=1)
  coverage = np.mean((lo <= 0) & (0 <= hi))
  assert 0.70 < coverage < 0.80  # theory: 1 - 2 (1/2)^3 = 0.75
  # The module's percentile interval at n = 3 is the seed range (resampled, not hard-coded).
  for i in range(3):
    _, plo, phi = stats.mean_interval(x[i], method="percentile")
    np.testing.assert_allclose([plo, phi], [x[i].min(), x[i].max()], atol=1e-12)


# ----------------------------------------------------------------------------- input errors


@pytest.mark.parametrize("bad, message", [
    ([0.1, np.nan, 0.3], "contains NaN or inf"),
    ([0.1, np.inf, 0.3], "contains NaN or inf"),
    ([], "is empty"),
    ([[0.1, 0.2], [0.3, 0.4]], "must be 1-D"),
    ([0.1], "needs at least 2 values"),
    (["x", "y"], "must be numeric"),
])
def test_bad_input_rejected_naming_argument(bad, message):
  with pytest.raises(ValueError, match=f"^x {message}"):
    stats.mean_interval(bad)
  with pytest.raises(ValueError, match=f"^a {message}"):
    stats.diff_interval(bad, SEEDS_B)
  with pytest.raises(ValueError, match=f"^b {message}"):
    stats.permutation_test(SEEDS_A, bad)
  with pytest.raises(ValueError, match=f"^b {message}"):
    stats.tost(SEEDS_A, bad, margin=0.1)
  with pytest.raises(ValueError, match=f"^b {message}"):
    stats.t_test(SEEDS_A, bad)
  if message != "needs at least 2 values":
    with pytest.raises(ValueError, match=f"^pvalues {message}"):
      stats.holm(bad)


def test_bad_options_rejected():
  with pytest.raises(ValueError, match="unknown method 'bootstrap'"):
    stats.mean_interval(SEEDS_A, method="bootstrap")
  with pytest.raises(ValueError, match="unknown method 'percentile'"):
    stats.diff_interval(SEEDS_A, SEEDS_B, method="percentile")
  with pytest.raises(ValueError, match="unknown alternative 'two_sided'"):
    stats.permutation_test(SEEDS_A, SEEDS_B, alternative="two_sided")
  with pytest.raises(ValueError, match="unknown alternative 'bigger'"):
    stats.t_test(SEEDS_A, SEEDS_B, alternative="bigger")
  with pytest.raises(ValueError, match="method='welch' is the unpaired interval"):
    stats.diff_interval(SEEDS_A, SEEDS_B[:5], paired=True)
  with pytest.raises(ValueError, match="method='t' is the paired interval"):
    stats.diff_interval(SEEDS_A, SEEDS_B, method="t")
  with pytest.raises(ValueError, match="differ in length: 5 vs 6"):
    stats.diff_interval(SEEDS_A, SEEDS_B, paired=True, method="t")
  with pytest.raises(ValueError, match="level must lie strictly between 0.0 and 1.0"):
    stats.mean_interval(SEEDS_A, level=95)
  with pytest.raises(ValueError, match="n_resamples must be an integer >= 1"):
    stats.permutation_test(SEEDS_A, SEEDS_B, n_resamples=0)


def test_classify_four_outcomes_by_hand():
  hi, lo = [1.0, 1.1, 0.9, 1.05], [0.0, 0.1, -0.1, 0.05]
  small = [0.004, 0.005, 0.006, 0.005, 0.0045, 0.0055]
  zero = [0.0, 0.0005, -0.0005, 0.0, 0.0002, -0.0002]
  near0 = [-0.002, 0.003, 0.0, 0.001, -0.001, 0.002]
  wide = [0.05, -0.04, 0.06, -0.03, 0.02, -0.01]
  assert stats.classify(hi, lo, 0.01) == "reproduced"
  assert stats.classify(small, zero, 0.01) == "trivial"
  assert stats.classify(small, zero, 0.0) == "reproduced"
  assert stats.classify(near0, zero, 0.01) == "not reproduced"
  assert stats.classify(wide, zero, 0.01) == "inconclusive"
  assert stats.classify(lo, hi, 0.01) == "not reproduced"
  assert stats.classify(zero, small, 0.01, alternative="less") == "trivial"
  # The Holm factor can take a claim from different-from-0 to inconclusive.
  p = stats.t_test(small, zero, alternative="greater")
  assert stats.classify(small, zero, 0.0, holm_factor=0.06 / p) == "inconclusive"
  assert stats.outcome(0.1, 0.2, 0.01) == "reproduced"
  assert stats.outcome(-0.3, -0.1, 0.99) == "not reproduced"


def test_diff_of_diffs_by_hand_and_against_welch():
  a1, b1 = np.array([1.0, 1.2, 0.9, 1.1]), np.array([0.1, 0.0, 0.2])
  a2, b2 = np.array([0.5, 0.7, 0.4, 0.6, 0.55]), np.array([0.0, 0.1, -0.1])
  dd, lo, hi, p = stats.diff_of_diffs(a1, b1, a2, b2)
  q = [np.var(x, ddof=1) / x.size for x in (a1, b1, a2, b2)]
  nu = sum(q) ** 2 / sum(qi ** 2 / (x.size - 1) for qi, x in zip(q, (a1, b1, a2, b2)))
  want = (a1.mean() - b1.mean()) - (a2.mean() - b2.mean())
  half = sps.t.ppf(0.975, nu) * np.sqrt(sum(q))
  assert dd == pytest.approx(want) and (lo, hi) == pytest.approx((want - half, want + half))
  assert p == pytest.approx(2 * sps.t.sf(abs(want) / np.sqrt(sum(q)), nu))
  # With constant b's (a one-sample claim's centre) it is Welch's test of a1 against a2.
  c = np.full(3, 0.5)
  _, _, _, p = stats.diff_of_diffs(a1, c, a2, c)
  assert p == pytest.approx(sps.ttest_ind(a1, a2, equal_var=False).pvalue)
  # Paired: Welch between the runs' per-seed differences.
  x1, y1, x2, y2 = a1, a1 - 0.5, a2[:4], a2[:4] - 0.1
  _, _, _, p = stats.diff_of_diffs(x1, y1, x2, y2, paired=True)
  assert p == 0.0  # no spread in either run's differences and a change of 0.4
  y2 = a2[:4] - np.array([0.1, 0.2, 0.0, 0.1])
  _, _, _, p = stats.diff_of_diffs(x1, x1 - [0.5, 0.4, 0.6, 0.5], x2, y2, paired=True)
  assert p == pytest.approx(sps.ttest_ind([0.5, 0.4, 0.6, 0.5], [0.1, 0.2, 0.0, 0.1],
                                                  equal_var=False).pvalue)
