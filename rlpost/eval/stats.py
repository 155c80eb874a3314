"""Small-sample statistics for paper tables: intervals, tests, multiplicity, equivalence, seeds.

Pure numpy/scipy over 1-D arrays of per-seed values (float64). Every public function rejects NaN,
inf, empty, wrong-rank or too-short input with one ValueError naming the argument and the problem.
The protocol these implement is ``experiments/STATISTICS.md``; in short:

  Intervals. With 3-10 seeds the interval method decides the verdict, so it must keep its coverage
  at that n. For normal per-seed values the Student-t interval of a mean,
  ``mean +- t_{1-alpha/2, n-1} * s / sqrt(n)``, is exact at every n >= 2, and Welch's interval of
  a difference of two unpaired means, ``diff +- t_{1-alpha/2, nu} * sqrt(s_a^2/n_a + s_b^2/n_b)``
  with the Welch-Satterthwaite ``nu``, is close to exact without assuming equal variances (Welch
  1947). A bootstrap interval has only asymptotic coverage: the BCa bootstrap (Efron 1987) is
  kept for statistics that are not a mean (a ratio such as "fraction of the gap closed"); the
  percentile bootstrap is kept only to show that it undercovers. At n = 3 the 2.5% and 97.5%
  quantiles of the bootstrap means are the smallest and largest seed (a resample of three copies
  of the minimum has probability 1/27 > 2.5%), so its "95% interval" is the seed range, which
  covers the true mean with probability ``1 - 2 * (1/2)^3 = 75%`` (about 80-85% at n = 4). It must
  not be used for a verdict below 20 seeds.

  Tests. A permutation test of the difference in means (exact over all relabelings when they are
  few, else Monte Carlo with a fixed seed) stands beside every interval: it assumes only
  exchangeability under the null, not normality. Within a claim family (the claims of one paper)
  p-values are adjusted by Holm's step-down procedure (Holm 1979), which controls the
  family-wise error rate under any dependence.

  Equivalence. "Within a margin" claims use TOST (Schuirmann 1987): two one-sided tests of
  H0: diff <= -margin and H0: diff >= +margin; equivalence is shown when both reject, i.e. when the
  (1 - 2 alpha) interval of the difference lies inside (-margin, +margin).

  Seeds. ``seeds_needed`` gives the per-arm n at which a two-sided, two-sample t-test has the
  requested power for a pre-declared minimum effect and pilot SD (exact noncentral-t power);
  ``min_detectable_effect`` is its inverse, reported when a claim stays inconclusive.

Paired variants (a - b per seed) exist for designs where arms share seeds' randomness; the RL
arms draw different rollouts, so unpaired (Welch) comparisons are the default.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from scipy import optimize, stats

_ALTERNATIVES = ("two-sided", "greater", "less")

# ----------------------------------------------------------------------------- validation


def _sample(x, name: str, min_n: int = 2) -> np.ndarray:
  """``x`` as a 1-D float64 array of at least ``min_n`` finite values, else a ValueError."""
  try:
    arr = np.asarray(x, dtype=np.float64)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{name} must be numeric: {e}") from None
  if arr.ndim != 1:
    raise ValueError(f"{name} must be 1-D (one value per seed), got shape {arr.shape}")
  if arr.size == 0:
    raise ValueError(f"{name} is empty")
  bad = np.flatnonzero(~np.isfinite(arr))
  if bad.size:
    raise ValueError(f"{name} contains NaN or inf (first at index {bad[0]}: {arr[bad[0]]})")
  if arr.size < min_n:
    raise ValueError(f"{name} needs at least {min_n} values, got {arr.size}")
  return arr


def _fraction(value: float, name: str, low: float = 0.0, high: float = 1.0) -> float:
  """``value`` as a float strictly inside (low, high), else a ValueError."""
  v = float(value)
  if not low < v < high:
    raise ValueError(f"{name} must lie strictly between {low} and {high}, got {value}")
  return v


def _positive(value: float, name: str) -> float:
  v = float(value)
  if not (np.isfinite(v) and v > 0):
    raise ValueError(f"{name} must be finite and > 0, got {value}")
  return v


def _positive_int(value: int, name: str, minimum: int = 1) -> int:
  if isinstance(value, bool) or int(value) != value or value < minimum:
    raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
  return int(value)


def _choice(value: str, name: str, options: tuple[str, ...]) -> str:
  if value not in options:
    raise ValueError(f"unknown {name} {value!r}; expected one of {options}")
  return value


def _pair(a, b, paired: bool) -> tuple[np.ndarray, np.ndarray]:
  a, b = _sample(a, "a"), _sample(b, "b")
  if paired and a.size != b.size:
    raise ValueError(f"paired samples a and b differ in length: {a.size} vs {b.size}")
  return a, b


# ----------------------------------------------------------------------------- t kernels


def t_interval(estimate, se, df, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
  """Two-sided t interval ``estimate -+ t_{(1+level)/2, df} * se``, elementwise.

  Broadcasts over arrays (the vectorised kernel of the "t" and "welch" intervals, used as such by
  coverage simulations). se = 0 gives the point interval whatever df.
  """
  level = _fraction(level, "level")
  estimate, se = np.asarray(estimate, np.float64), np.asarray(se, np.float64)
  df = np.where(se == 0, 1.0, df)  # nu is 0/0 for two constant arms; the width is 0 anyway
  half = stats.t.ppf(0.5 + level / 2, df) * se
  return estimate - half, estimate + half


def welch_df(var_a, n_a, var_b, n_b) -> np.ndarray:
  """Welch-Satterthwaite degrees of freedom, elementwise over arrays:

  ``nu = (v_a/n_a + v_b/n_b)^2 / ((v_a/n_a)^2/(n_a-1) + (v_b/n_b)^2/(n_b-1))``

  with v the unbiased (ddof=1) variances; nan when both variances are 0.
  """
  qa = np.asarray(var_a, np.float64) / n_a
  qb = np.asarray(var_b, np.float64) / n_b
  with np.errstate(divide="ignore", invalid="ignore"):
    return (qa + qb) ** 2 / (qa**2 / (n_a - 1) + qb**2 / (n_b - 1))


def _welch(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
  """(mean(a) - mean(b), its standard error, Welch df)."""
  va, vb = np.var(a, ddof=1), np.var(b, ddof=1)
  se = float(np.sqrt(va / a.size + vb / b.size))
  return float(np.mean(a) - np.mean(b)), se, float(welch_df(va, a.size, vb, b.size))


def _one_sample(d: np.ndarray) -> tuple[float, float, float]:
  """(mean(d), s / sqrt(n), n - 1)."""
  return float(np.mean(d)), float(np.std(d, ddof=1) / np.sqrt(d.size)), float(d.size - 1)


def _diff_t(a: np.ndarray, b: np.ndarray, paired: bool) -> tuple[float, float, float]:
  """(diff, se, df): the paired t of a - b, or Welch's unpaired t."""
  return _one_sample(a - b) if paired else _welch(a, b)


def _t_p(t: float, df: float, alternative: str) -> float:
  """p-value of a t statistic; "greater" is the upper tail."""
  if alternative == "greater":
    return float(stats.t.sf(t, df))
  if alternative == "less":
    return float(stats.t.cdf(t, df))
  return float(np.minimum(1.0, 2 * stats.t.sf(abs(t), df)))


# ----------------------------------------------------------------------------- intervals


def _bootstrap(samples: tuple[np.ndarray, ...], statistic: Callable, level: float, method: str,
               paired: bool, n_resamples: int, seed: int) -> tuple[float, float]:
  res = stats.bootstrap(samples, statistic, n_resamples=n_resamples, paired=paired,
                        vectorized=True, axis=-1, confidence_level=level, method=method,
                        rng=np.random.default_rng(seed))
  return float(res.confidence_interval.low), float(res.confidence_interval.high)


def _mean(x, axis=-1):
  return np.mean(x, axis=axis)


def _mean_diff(a, b, axis=-1):
  return np.mean(a, axis=axis) - np.mean(b, axis=axis)


def mean_interval(x, level: float = 0.95, method: str = "t", *, n_resamples: int = 9999,
                  seed: int = 0) -> tuple[float, float, float]:
  """``(mean, lo, hi)``: a two-sided ``level`` confidence interval for the mean of ``x``.

  x: 1-D per-seed values, n >= 2. Methods:
    "t"           Student t, ``mean +- t_{(1+level)/2, n-1} * s / sqrt(n)`` (s with ddof=1); exact
                  coverage for normal data at every n. Equals
                  ``scipy.stats.ttest_1samp(x, 0).confidence_interval(level)``.
    "bca"         bias-corrected and accelerated bootstrap (Efron 1987) of the mean,
                  ``scipy.stats.bootstrap(method="BCa")`` with ``n_resamples`` resamples drawn
                  from ``np.random.default_rng(seed)``.
    "percentile"  percentile bootstrap, same resamples. Undercovers at small n (75% at n = 3,
                  where it is the seed range): never use it for a verdict below 20 seeds.
  Constant x gives the point interval (mean, mean, mean) under every method.
  """
  x = _sample(x, "x")
  level = _fraction(level, "level")
  method = _choice(method, "method", ("t", "bca", "percentile"))
  m = float(np.mean(x))
  if method == "t":
    _, se, df = _one_sample(x)
    lo, hi = t_interval(m, se, df, level)
    return m, float(lo), float(hi)
  n_resamples = _positive_int(n_resamples, "n_resamples")
  if np.ptp(x) == 0:  # every resample equals x: the bootstrap distribution is a point mass
    return m, m, m
  lo, hi = _bootstrap((x,), _mean, level, "BCa" if method == "bca" else "percentile",
                      False, n_resamples, seed)
  return m, lo, hi


def diff_interval(a, b, level: float = 0.95, paired: bool = False, method: str = "welch", *,
                  n_resamples: int = 9999, seed: int = 0) -> tuple[float, float, float]:
  """``(diff, lo, hi)``: a two-sided ``level`` interval for ``diff = mean(a) - mean(b)``.

  a, b: 1-D per-seed values of the two arms, each n >= 2. Methods:
    "welch"  unpaired (paired=False only): ``diff +- t_{(1+level)/2, nu} * sqrt(s_a^2/n_a +
             s_b^2/n_b)`` with the Welch-Satterthwaite ``nu`` (see ``welch_df``). Equals
             ``scipy.stats.ttest_ind(a, b, equal_var=False).confidence_interval(level)``.
    "t"      paired (paired=True only, equal lengths): the Student t interval of the per-seed
             differences a - b, as ``scipy.stats.ttest_rel(a, b).confidence_interval(level)``.
    "bca"    BCa bootstrap of the difference of means (``scipy.stats.bootstrap`` over both
             samples): paired=False resamples each arm independently, paired=True resamples
             seeds (pairs); ``n_resamples`` resamples from ``np.random.default_rng(seed)``.
  """
  method = _choice(method, "method", ("welch", "t", "bca"))
  if method == "welch" and paired:
    raise ValueError("method='welch' is the unpaired interval; use method='t' with paired=True")
  if method == "t" and not paired:
    raise ValueError("method='t' is the paired interval (needs paired=True); "
                     "use method='welch' for unpaired arms")
  a, b = _pair(a, b, paired)
  level = _fraction(level, "level")
  diff = float(np.mean(a) - np.mean(b))
  if method in ("welch", "t"):
    d, se, df = _diff_t(a, b, paired)
    lo, hi = t_interval(d, se, df, level)
    return d, float(lo), float(hi)
  n_resamples = _positive_int(n_resamples, "n_resamples")
  if (np.ptp(a - b) == 0) if paired else (np.ptp(a) == 0 and np.ptp(b) == 0):
    return diff, diff, diff  # every resample gives the same difference
  lo, hi = _bootstrap((a, b), _mean_diff, level, "BCa", paired, n_resamples, seed)
  return diff, lo, hi


# ----------------------------------------------------------------------------- tests


def t_test(a, b, paired: bool = False, alternative: str = "two-sided") -> float:
  """p-value of Welch's unpaired t-test (paired=False) or the paired t-test of a - b.

  ``t = diff / se`` with the se and df of ``diff_interval``'s "welch" / "t" methods; "greater"
  tests H1: mean(a) > mean(b). Equals ``scipy.stats.ttest_ind(a, b, equal_var=False)`` /
  ``ttest_rel(a, b)`` with the same ``alternative``. Zero spread gives p from t = +-inf (nan when
  also diff = 0).
  """
  alternative = _choice(alternative, "alternative", _ALTERNATIVES)
  a, b = _pair(a, b, paired)
  d, se, df = _diff_t(a, b, paired)
  if se == 0:
    df = 1.0
  with np.errstate(divide="ignore", invalid="ignore"):
    t = np.float64(d) / se
  return _t_p(float(t), df, alternative)


def permutation_test(a, b, paired: bool = False, alternative: str = "two-sided",
                     n_resamples: int = 10000, seed: int = 0) -> float:
  """p-value of the difference in means ``mean(a) - mean(b)`` by permutation.

  Unpaired: relabel the pooled seeds into arms of sizes (n_a, n_b), ``C(n_a + n_b, n_a)``
  distinct relabelings. Paired: swap a_i and b_i within pairs, i.e. flip the signs of the
  differences, ``2^n`` relabelings. The test is exact (every relabeling enumerated, the observed
  one included) when their number is <= ``n_resamples``, else Monte Carlo with ``n_resamples``
  relabelings from ``np.random.default_rng(seed)`` and ``p = (hits + 1) / (n_resamples + 1)``.
  "greater" tests H1: mean(a) > mean(b); "two-sided" is twice the smaller one-sided p, capped at
  1. This is ``scipy.stats.permutation_test`` with permutation_type "independent" / "samples".
  """
  alternative = _choice(alternative, "alternative", _ALTERNATIVES)
  a, b = _pair(a, b, paired)
  n_resamples = _positive_int(n_resamples, "n_resamples")
  res = stats.permutation_test((a, b), _mean_diff, vectorized=True, axis=-1,
                               permutation_type="samples" if paired else "independent",
                               n_resamples=n_resamples, alternative=alternative,
                               rng=np.random.default_rng(seed))
  return float(res.pvalue)


def holm(pvalues) -> np.ndarray:
  """Holm's step-down adjusted p-values (Holm 1979), in input order.

  With the m p-values sorted ascending, ``p_(1) <= ... <= p_(m)``:
  ``adj_(i) = min(1, max_{j <= i} (m - j + 1) * p_(j))``. Rejecting ``adj <= alpha`` controls the
  family-wise error rate at alpha under any dependence. Ties keep input order.
  """
  p = _sample(pvalues, "pvalues", min_n=1)
  if np.any((p < 0) | (p > 1)):
    raise ValueError(f"pvalues must lie in [0, 1], got {p}")
  m = p.size
  order = np.argsort(p, kind="stable")
  adj = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
  out = np.empty(m)
  out[order] = adj
  return out


def tost(a, b, margin: float, level: float = 0.95, paired: bool = False
         ) -> tuple[float, float, float]:
  """``(p_value, lo, hi)``: TOST equivalence of mean(a) and mean(b) within +-margin.

  With diff, se, df of Welch (paired=False) or the paired t of a - b (paired=True):
    H0-: diff <= -margin   p- = P(T_df >= (diff + margin) / se)
    H0+: diff >= +margin   p+ = P(T_df <= (diff - margin) / se)
  ``p_value = max(p-, p+)``; equivalence at alpha = 1 - level holds when p_value < alpha, i.e.
  when ``(lo, hi)``, the (1 - 2 alpha) two-sided t interval of diff (90% at level 0.95), lies
  inside (-margin, +margin). Each one-sided p equals ``scipy.stats.ttest_ind(a, b -+ margin,
  equal_var=False, alternative="greater" / "less")`` (``ttest_rel`` when paired).
  """
  a, b = _pair(a, b, paired)
  margin = _positive(margin, "margin")
  level = _fraction(level, "level", 0.5, 1.0)
  diff, se, df = _diff_t(a, b, paired)
  if se == 0:  # no spread: each one-sided test rejects exactly when diff is strictly inside
    p = 0.0 if -margin < diff < margin else 1.0
    return p, diff, diff
  p_lower = _t_p((diff + margin) / se, df, "greater")
  p_upper = _t_p((diff - margin) / se, df, "less")
  lo, hi = t_interval(diff, se, df, 1 - 2 * (1 - level))
  return max(p_lower, p_upper), float(lo), float(hi)


# ----------------------------------------------------------------------------- outcomes (v2)

OUTCOMES = ("reproduced", "trivial", "not reproduced", "inconclusive")


def outcome(lo: float, hi: float, p: float, p_equivalent: float = float("nan"),
            alpha: float = 0.05) -> str:
  """The outcome of a directional claim (protocol v2, experiments/STATISTICS.md point 4).

  ``lo, hi``: the two-sided (1 - alpha) interval of d, the difference beyond the threshold signed
  in the claimed direction; ``p``: the (Holm-adjusted) one-sided p of H0: d <= 0;
  ``p_equivalent``: the TOST p of |d| < SESOI (NaN without a SESOI). Different from 0 means
  ``p <= alpha`` (the one-sided test); equivalent to 0 means ``p_equivalent <= alpha``:

  * "reproduced": different and not equivalent;
  * "trivial": different and equivalent (real, too small to matter);
  * "not reproduced": equivalent and not different, or the interval wholly below 0;
  * "inconclusive": none of these.
  """
  different = p <= alpha
  equivalent = p_equivalent <= alpha  # False for NaN
  if different:
    return "trivial" if equivalent else "reproduced"
  if equivalent or hi < 0:
    return "not reproduced"
  return "inconclusive"


def classify(a, b, sesoi: float, *, alternative: str = "greater", paired: bool = False,
             level: float = 0.95, holm_factor: float = 1.0) -> str:
  """The v2 outcome of the claim "mean(a) - mean(b) is > 0" (``alternative="greater"``; "less"
  for < 0) from per-seed values: Welch (or paired t) interval and one-sided test, its p multiplied
  by ``holm_factor`` (the Holm step's factor in the claim's family, capped at 1), and TOST against
  +-``sesoi`` (``sesoi`` 0: no equivalence test, so no "trivial").
  """
  a, b = _pair(a, b, paired)
  alternative = _choice(alternative, "alternative", ("greater", "less"))
  level = _fraction(level, "level", 0.5, 1.0)
  if not sesoi >= 0:
    raise ValueError(f"sesoi must be >= 0, got {sesoi}")
  d, lo, hi = diff_interval(a, b, level=level, paired=paired, method="t" if paired else "welch")
  if alternative == "less":
    lo, hi = -hi, -lo
  p = min(1.0, t_test(a, b, paired=paired, alternative=alternative) * holm_factor)
  p_eq = tost(a, b, sesoi, level=level, paired=paired)[0] if sesoi > 0 else float("nan")
  return outcome(lo, hi, p, p_eq, 1.0 - level)


def diff_of_diffs(a1, b1, a2, b2, level: float = 0.95, paired: bool = False
                  ) -> tuple[float, float, float, float]:
  """``(dd, lo, hi, p)``: dd = (mean(a1) - mean(b1)) - (mean(a2) - mean(b2)), the change of one
  difference between two independent runs (a committed table and its replication), with its
  Welch-Satterthwaite t interval at ``level`` and two-sided p of H0: dd = 0.

  Unpaired: the four means are independent, se^2 = sum of v/n over the four samples and
  nu = (sum v/n)^2 / sum((v/n)^2 / (n - 1)) (terms of zero variance, e.g. a constant centre,
  drop out). Paired: the per-seed differences a_i - b_i of each run, Welch between the runs.
  """
  level = _fraction(level, "level")
  if paired:
    x1, y1 = _pair(a1, b1, True)
    x2, y2 = _pair(a2, b2, True)
    groups = [x1 - y1, x2 - y2]
    signs = [1.0, -1.0]
  else:
    groups = [_sample(x, name) for x, name in ((a1, "a1"), (b1, "b1"), (a2, "a2"), (b2, "b2"))]
    signs = [1.0, -1.0, -1.0, 1.0]
  dd = float(sum(s * np.mean(g) for s, g in zip(signs, groups)))
  q = np.array([np.var(g, ddof=1) / g.size for g in groups])
  dfs = np.array([g.size - 1 for g in groups], np.float64)
  se = float(np.sqrt(q.sum()))
  if se == 0:
    return dd, dd, dd, (1.0 if dd == 0 else 0.0)
  nu = float(q.sum() ** 2 / np.sum(q[q > 0] ** 2 / dfs[q > 0]))
  lo, hi = t_interval(dd, se, nu, level)
  return dd, float(lo), float(hi), _t_p(dd / se, nu, "two-sided")


# ----------------------------------------------------------------------------- power


def _power(n, d, alpha: float) -> np.ndarray:
  """Exact power of the two-sided, two-sample, equal-n t-test (pooled, df = 2n - 2) at
  standardised effect d = effect / sd, elementwise over n and d:

  ``P(|T| > t_{1-alpha/2, 2n-2})`` with ``T ~ nct(df=2n-2, nc=d * sqrt(n/2))``. The lower tail
  is taken as ``P(T' > t)`` with ``T' ~ nct(df, -nc)`` (symmetry), which scipy evaluates without
  the nan that ``nct.cdf(-t, df, nc)`` returns at large nc.
  """
  n = np.asarray(n, np.float64)
  df = 2 * n - 2
  crit = stats.t.ppf(1 - alpha / 2, df)
  nc = d * np.sqrt(n / 2)
  return stats.nct.sf(crit, df, nc) + stats.nct.sf(crit, df, -nc)


_MAX_SEEDS = 10**6


def seeds_needed(sd: float, effect: float, alpha: float = 0.05, power: float = 0.8) -> int:
  """Smallest n per arm at which a two-sided, two-sample t-test (equal n, alpha) detects a true
  difference ``effect`` between arms of seed SD ``sd`` with probability >= ``power``.

  Exact noncentral-t power (see ``_power``: ``T ~ nct(2n - 2, (effect / sd) * sqrt(n / 2))``,
  rejection ``|T| > t_{1-alpha/2, 2n-2}``), evaluated for n = 2, 3, ... upward (in vectorised
  blocks) until it reaches ``power``. sd = 1, effect = 1 gives 17, the textbook answer (the normal
  approximation ``2 (z_{1-alpha/2} + z_{power})^2 (sd / effect)^2`` gives 15.7). Raises when more
  than 10^6 seeds per arm would be needed.
  """
  sd, effect = _positive(sd, "sd"), _positive(effect, "effect")
  alpha, power = _fraction(alpha, "alpha"), _fraction(power, "power")
  d = effect / sd
  start, block = 2, 64
  while start <= _MAX_SEEDS:
    n = np.arange(start, min(start + block, _MAX_SEEDS + 1))
    hit = np.flatnonzero(_power(n, d, alpha) >= power)
    if hit.size:
      return int(n[hit[0]])
    start, block = start + block, 2 * block
  raise ValueError(f"effect / sd = {d:.3g} needs more than {_MAX_SEEDS} seeds per arm")


def min_detectable_effect(sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
  """Smallest true difference that a two-sided, two-sample t-test with n seeds per arm detects
  with probability ``power`` at ``alpha``: ``sd * d*`` where ``_power(n, d*) = power``.

  Power increases with d from alpha at d = 0, so d* is found by bracketing and Brent's method
  (xtol 1e-12). The inverse of ``seeds_needed``: ``min_detectable_effect(sd, n) <= effect <
  min_detectable_effect(sd, n - 1)`` where ``n = seeds_needed(sd, effect)``. power > alpha.
  """
  sd = _positive(sd, "sd")
  n = _positive_int(n, "n", minimum=2)
  alpha, power = _fraction(alpha, "alpha"), _fraction(power, "power")
  if power <= alpha:
    raise ValueError(f"power ({power}) must exceed alpha ({alpha})")

  def gap(d: float) -> float:
    return float(_power(n, d, alpha)) - power

  hi = 1.0
  while gap(hi) < 0:
    hi *= 2
  return sd * optimize.brentq(gap, 0.0, hi, xtol=1e-12, rtol=1e-14)
