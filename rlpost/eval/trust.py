"""Trust metrics for rollouts: errors, round-trip discrepancy, rankings, calibration, abstention.

Pure numpy (float64 internally). Definitions follow the round-trip consistency paper as read from
its abstract ("Round-trip consistency: bidirectional diffusion models can predict their own
rollout errors"); each choice is stated where it is made.

Vocabulary:
  E_i  rollout error at depth i: relative L2 of the forward rollout to the truth.
  C_i  round-trip discrepancy at depth i: relative L2 of (forward i, then backward i) to the start.
  Scores rank rollouts: a higher score means a worse (more erroneous, less trustworthy) rollout.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import NamedTuple, Sequence

import numpy as np

# ----------------------------------------------------------------------------- errors


def _axes(axes: int | Sequence[int] | None) -> int | tuple[int, ...] | None:
  return axes if axes is None or isinstance(axes, int) else tuple(axes)


def relative_l2(pred: np.ndarray, ref: np.ndarray, axes: int | Sequence[int] | None = None
                ) -> np.ndarray:
  """||pred - ref|| / ||ref||, the L2 norms taken over ``axes`` (None: every axis).

  pred and ref broadcast; the result has the remaining axes, float64. A zero reference norm gives
  inf (or nan when pred equals it); no epsilon is added.
  """
  pred = np.asarray(pred, np.float64)
  ref = np.asarray(ref, np.float64)
  ax = _axes(axes)
  num = np.sqrt(np.sum(np.square(pred - ref), axis=ax))
  den = np.sqrt(np.sum(np.square(ref), axis=ax))
  with np.errstate(divide="ignore", invalid="ignore"):
    return num / den


def field_errors(pred: np.ndarray, ref: np.ndarray, spatial_dims: int
                 ) -> tuple[np.ndarray, np.ndarray]:
  """Relative L2 of states [..., *S, F]: (pooled over space and fields [...],
  per field over space [..., F]).

  Pooling is over the raw fields, so fields of larger magnitude weigh more; pass standardised
  arrays for a scale-free pooled variant.
  """
  pred, ref = np.asarray(pred), np.asarray(ref)
  if pred.shape != ref.shape:
    raise ValueError(f"shapes differ: {pred.shape} vs {ref.shape}")
  if pred.ndim < spatial_dims + 1:
    raise ValueError(f"states need {spatial_dims} spatial axes and a field axis, got shape {pred.shape}")
  spatial = tuple(range(pred.ndim - 1 - spatial_dims, pred.ndim - 1))
  return relative_l2(pred, ref, spatial + (pred.ndim - 1,)), relative_l2(pred, ref, spatial)


def rollout_error(path: np.ndarray, truth: np.ndarray, spatial_dims: int
                  ) -> tuple[np.ndarray, np.ndarray]:
  """E_i of rollouts path [B, D+1, *S, F] against truth of the same shape:
  (pooled [B, D+1], per field [B, D+1, F]). Column 0 compares the start states (0 when equal)."""
  return field_errors(path, truth, spatial_dims)


def round_trip_discrepancy(returned: np.ndarray, start: np.ndarray,
                           axes: int | Sequence[int] | None) -> np.ndarray:
  """C = ||returned - start|| / ||start|| over ``axes``.

  The latent and decoded variants differ only in the arrays passed: the diffusion-space states
  (``Path.z``) or the physical fields (``Path.x``), for the latter pooled (space and field axes)
  or per field (space axes only).
  """
  return relative_l2(returned, start, axes)


# ----------------------------------------------------------------------------- rankings


def rankdata(x: np.ndarray) -> np.ndarray:
  """1-based ranks of a 1D array with ties given their average rank (float64)."""
  x = np.asarray(x)
  if x.ndim != 1:
    raise ValueError(f"rankdata expects a 1D array, got shape {x.shape}")
  order = np.argsort(x, kind="mergesort")
  xs = x[order]
  # Start of each run of equal values in sorted order.
  new = np.concatenate([[True], xs[1:] != xs[:-1]]) if len(xs) else np.zeros(0, bool)
  group = np.cumsum(new) - 1
  starts = np.flatnonzero(new)
  counts = np.diff(np.concatenate([starts, [len(xs)]]))
  avg = starts + (counts + 1) / 2.0  # mean of 1-based positions start+1 .. start+count
  ranks = np.empty(len(x), np.float64)
  ranks[order] = avg[group]
  return ranks


def _check_pair(x: np.ndarray, y: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
  x = np.asarray(x, np.float64).ravel()
  y = np.asarray(y, np.float64).ravel()
  if x.shape != y.shape:
    raise ValueError(f"{name}: inputs have {x.size} and {y.size} elements")
  if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
    raise ValueError(f"{name}: inputs contain NaN or inf")
  return x, y


def spearman(x: np.ndarray, y: np.ndarray) -> float:
  """Spearman rank correlation: Pearson correlation of average ranks (ties handled as scipy).

  nan when either input is constant or has fewer than 2 elements.
  """
  x, y = _check_pair(x, y, "spearman")
  if x.size < 2:
    return float("nan")
  rx, ry = rankdata(x), rankdata(y)
  rx -= rx.mean()
  ry -= ry.mean()
  den = np.sqrt(np.sum(rx * rx) * np.sum(ry * ry))
  return float(np.sum(rx * ry) / den) if den > 0 else float("nan")


def fixed_depth_spearman(c: np.ndarray, e: np.ndarray) -> np.ndarray:
  """Spearman(C_i, E_i) across rollouts at each depth: c, e [N, K] -> [K].

  This is the fixed-depth ranking; never pool over depths (a shared depth trend inflates it).
  """
  c, e = np.asarray(c), np.asarray(e)
  if c.shape != e.shape or c.ndim != 2:
    raise ValueError(f"c and e must both be [N, K], got {c.shape} and {e.shape}")
  return np.asarray([spearman(c[:, k], e[:, k]) for k in range(c.shape[1])])


def within_trajectory_spearman(c: np.ndarray, e: np.ndarray, *, ddof: int = 0
                               ) -> tuple[float, float, np.ndarray]:
  """Spearman across start times inside each trajectory at a fixed depth.

  Args:
    c, e: [trajectories, starts] scores and errors.
    ddof: delta degrees of freedom of the std over trajectories.

  Returns:
    (mean, std, per_traj [trajectories]); trajectories whose correlation is undefined (constant
    c or e) are nan in per_traj and left out of mean and std.
  """
  c, e = np.asarray(c), np.asarray(e)
  if c.shape != e.shape or c.ndim != 2:
    raise ValueError(f"c and e must both be [trajectories, starts], got {c.shape} and {e.shape}")
  per = np.asarray([spearman(c[i], e[i]) for i in range(c.shape[0])])
  ok = per[np.isfinite(per)]
  if ok.size == 0:
    return float("nan"), float("nan"), per
  std = float(np.std(ok, ddof=ddof)) if ok.size > ddof else float("nan")
  return float(np.mean(ok)), std, per


def auroc(scores: np.ndarray, labels: np.ndarray) -> float:
  """Area under the ROC curve of ``scores`` for binary ``labels`` (1 / True = positive).

  Mann-Whitney form with average ranks: AUROC = (sum of positive ranks - n1 (n1 + 1) / 2) /
  (n1 n0), i.e. P(score_pos > score_neg) + P(tie) / 2. Higher scores should mean positive
  (e.g. OOD). Below 0.5 the score ranks the classes the wrong way round.
  """
  scores, labels = _check_pair(scores, labels, "auroc")
  if not np.all((labels == 0) | (labels == 1)):
    raise ValueError("auroc: labels must be 0/1 or booleans")
  pos = labels == 1
  n1, n0 = int(pos.sum()), int((~pos).sum())
  if n1 == 0 or n0 == 0:
    raise ValueError(f"auroc needs both classes, got {n1} positives and {n0} negatives")
  ranks = rankdata(scores)
  return float((ranks[pos].sum() - n1 * (n1 + 1) / 2.0) / (n1 * n0))


# ----------------------------------------------------------------------------- calibration


def z_for_level(level: float) -> float:
  """Two-sided standard-normal quantile: the z with P(|N(0, 1)| <= z) = level."""
  if not 0.0 < level < 1.0:
    raise ValueError(f"level must lie in (0, 1), got {level!r}")
  return statistics.NormalDist().inv_cdf(0.5 + level / 2.0)


LEVEL_1SIGMA = 0.6826894921370859  # z = 1: the exp(+-sigma) interval
LEVEL_95 = 0.95  # z = 1.96

KINDS = ("c_depth", "depth", "depth_onehot", "c_depth_onehot")
DEPTH_TRANSFORMS = ("linear", "log")


class Interval(NamedTuple):
  """Predictive interval of E: lower, upper (same shape as the inputs) and the width factor
  exp(z sigma) (E lies within upper / median = median / lower = factor)."""

  lower: np.ndarray
  upper: np.ndarray
  factor: np.ndarray


@dataclasses.dataclass(frozen=True)
class Calibrator:
  """Log-linear error predictor with Gaussian residuals: log E ~ N(features . coef, sigma^2).

  Feature sets (``kind``):
    "c_depth":        [1, log C, depth]   (the paper's calibrator, as read from the abstract)
    "depth":          [1, depth]          (depth-only baseline)
    "depth_onehot":   one-hot depth       (depth-only, one mean per depth)
    "c_depth_onehot": [log C, one-hot depth]
  ``depth_transform="log"`` uses log(depth) instead of depth in the linear kinds.
  ``sigma`` is the residual std with n - p degrees of freedom; with ``sigma_by_depth=True`` the
  residual scale is estimated per depth instead (the same correction factor), which addresses a
  calibrator that is right overall but too wide at shallow and too narrow at deep depths.

  Fit with ``Calibrator.fit(c, e, depth, ...)`` on training rollouts, evaluate on held-out ones.
  """

  kind: str
  coef: np.ndarray
  sigma: float
  depth_transform: str = "linear"
  depth_levels: tuple[int, ...] = ()
  sigma_levels: tuple[float, ...] = ()  # per depth level when fit with sigma_by_depth

  @staticmethod
  def _inputs(c, e, depth, kind) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray]:
    depth = np.asarray(depth, np.float64).ravel()
    if np.any(~np.isfinite(depth)) or np.any(depth <= 0):
      raise ValueError("depths must be finite and positive")
    arrays = []
    for name, a in (("c", c), ("e", e)):
      if a is None:
        arrays.append(None)
        continue
      a = np.broadcast_to(np.asarray(a, np.float64), depth.shape) if np.ndim(a) == 0 else \
          np.asarray(a, np.float64).ravel()
      if a.shape != depth.shape:
        raise ValueError(f"{name} has {a.size} values but depth has {depth.size}")
      if np.any(~np.isfinite(a)) or np.any(a <= 0):
        raise ValueError(f"{name} must be finite and positive (its log is a regression variable)")
      arrays.append(a)
    if kind in ("c_depth", "c_depth_onehot") and arrays[0] is None:
      raise ValueError(f"calibrator kind {kind!r} needs the round-trip discrepancies c")
    return arrays[0], arrays[1], depth

  def _features(self, c, depth) -> np.ndarray:
    n = depth.shape[0]
    dfeat = np.log(depth) if self.depth_transform == "log" else depth
    if self.kind in ("depth_onehot", "c_depth_onehot"):
      levels = np.asarray(self.depth_levels, np.float64)
      unknown = ~np.isin(depth, levels)
      if np.any(unknown):
        raise ValueError(f"depth {depth[unknown][0]:g} was not seen when fitting "
                         f"(one-hot levels {self.depth_levels})")
      onehot = (depth[:, None] == levels[None, :]).astype(np.float64)
      return onehot if self.kind == "depth_onehot" else np.column_stack([np.log(c), onehot])
    if self.kind == "depth":
      return np.column_stack([np.ones(n), dfeat])
    return np.column_stack([np.ones(n), np.log(c), dfeat])

  @classmethod
  def fit(cls, c: np.ndarray | None, e: np.ndarray, depth: np.ndarray, *, kind: str = "c_depth",
          depth_transform: str = "linear", sigma_by_depth: bool = False) -> "Calibrator":
    """Least squares of log E on the features of ``kind``.

    Args:
      c: [n] round-trip discrepancies (> 0); may be None for depth-only kinds.
      e: [n] rollout errors (> 0).
      depth: [n] depths (> 0).
    """
    if kind not in KINDS:
      raise ValueError(f"calibrator kind must be one of {KINDS}, got {kind!r}")
    if depth_transform not in DEPTH_TRANSFORMS:
      raise ValueError(f"depth_transform must be one of {DEPTH_TRANSFORMS}, got {depth_transform!r}")
    if e is None:
      raise ValueError("fitting needs the errors e")
    c, e, depth = cls._inputs(c, e, depth, kind)
    levels = tuple(int(d) if float(d).is_integer() else float(d) for d in np.unique(depth))
    proto = cls(kind=kind, coef=np.zeros(0), sigma=1.0, depth_transform=depth_transform,
                depth_levels=levels)
    x = proto._features(c, depth)
    n, p = x.shape
    if n <= p:
      raise ValueError(f"calibrator with {p} coefficients needs more than {p} rollouts, got {n}")
    y = np.log(e)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ coef
    correction = n / (n - p)
    sigma = float(np.sqrt(np.sum(resid ** 2) / (n - p)))
    sigma_levels: tuple[float, ...] = ()
    if sigma_by_depth:
      sigma_levels = tuple(float(np.sqrt(np.mean(resid[depth == lv] ** 2) * correction))
                           for lv in levels)
    return dataclasses.replace(proto, coef=coef, sigma=sigma, sigma_levels=sigma_levels)

  def _sigma(self, depth: np.ndarray) -> np.ndarray:
    if not self.sigma_levels:
      return np.full(depth.shape, self.sigma)
    levels = np.asarray(self.depth_levels, np.float64)
    idx = np.searchsorted(levels, depth)
    idx = np.clip(idx, 0, len(levels) - 1)
    if np.any(levels[idx] != depth):
      raise ValueError(f"per-depth sigma: depths {sorted(set(depth[levels[idx] != depth]))} were "
                       f"not seen when fitting")
    return np.asarray(self.sigma_levels)[idx]

  def predict_log(self, c: np.ndarray | None, depth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std) of log E for each rollout, each [n] float64."""
    c, _, depth = self._inputs(c, None, depth, self.kind)
    return self._features(c, depth) @ self.coef, self._sigma(depth)

  def predict(self, c: np.ndarray | None, depth: np.ndarray) -> np.ndarray:
    """Median predicted error exp(mean log E), [n]."""
    return np.exp(self.predict_log(c, depth)[0])

  def interval(self, c: np.ndarray | None, depth: np.ndarray, level: float = LEVEL_1SIGMA
               ) -> Interval:
    """Central predictive interval of E at ``level``: exp(mu -+ z sigma), factor exp(z sigma)."""
    mu, sd = self.predict_log(c, depth)
    half = z_for_level(level) * sd
    return Interval(np.exp(mu - half), np.exp(mu + half), np.exp(half))

  def coverage(self, c: np.ndarray | None, e: np.ndarray, depth: np.ndarray,
               level: float = LEVEL_1SIGMA) -> float:
    """Fraction of rollouts whose error falls inside the ``level`` interval."""
    _, e, _ = self._inputs(c, e, depth, self.kind)
    lo, hi, _ = self.interval(c, depth, level)
    return float(np.mean((e >= lo) & (e <= hi)))

  def nll(self, c: np.ndarray | None, e: np.ndarray, depth: np.ndarray) -> float:
    """Mean Gaussian negative log-likelihood of log E per rollout, in nats.

    This is the density of log E (the density of E adds the same log E term to every
    predictor, so differences between calibrators are unchanged).
    """
    _, e, _ = self._inputs(c, e, depth, self.kind)
    mu, sd = self.predict_log(c, depth)
    r = (np.log(e) - mu) / sd
    return float(np.mean(0.5 * np.log(2 * np.pi) + np.log(sd) + 0.5 * r * r))


# ----------------------------------------------------------------------------- selective prediction


def _kept_weights(scores: np.ndarray, coverage: float) -> np.ndarray:
  """Weight of each rollout in the kept set of the ``coverage * n`` lowest scores.

  Ties straddling the boundary share it: each member of the boundary tie group gets the same
  fractional weight, i.e. the expectation over random tie-breaking. A constant score therefore
  keeps every rollout with weight ``coverage`` (no reduction), never an arbitrary subset.
  """
  n = scores.size
  k = coverage * n
  order = np.argsort(scores, kind="mergesort")
  ss = scores[order]
  new = np.concatenate([[True], ss[1:] != ss[:-1]])
  starts = np.flatnonzero(new)
  counts = np.diff(np.concatenate([starts, [n]]))
  group_w = np.clip((k - starts) / counts, 0.0, 1.0)
  w = np.empty(n, np.float64)
  w[order] = np.repeat(group_w, counts)
  return w


def selective_risk(errors: np.ndarray, scores: np.ndarray, coverage: float) -> float:
  """Mean error of the kept ``coverage`` fraction of rollouts (lowest scores kept; ties shared)."""
  errors, scores = _check_pair(errors, scores, "selective_risk")
  if not 0.0 < coverage <= 1.0:
    raise ValueError(f"coverage must lie in (0, 1], got {coverage!r}")
  if errors.size == 0:
    raise ValueError("selective_risk: no rollouts")
  w = _kept_weights(scores, coverage)
  return float(np.sum(w * errors) / np.sum(w))


def selective_error_reduction(errors: np.ndarray, scores: np.ndarray, coverage: float = 0.8
                              ) -> float:
  """1 - (mean error of the kept fraction) / (mean error of all): the error cut by abstaining on
  the ``1 - coverage`` highest-scoring rollouts. The paper reports it at 80% coverage.

  Pass rollouts of one depth for per-depth numbers, or several depths pooled (then a depth-only
  score already earns the depth trend).
  """
  errors, scores = _check_pair(errors, scores, "selective_error_reduction")
  total = float(np.mean(errors)) if errors.size else float("nan")
  return 1.0 - selective_risk(errors, scores, coverage) / total


def risk_coverage_curve(errors: np.ndarray, scores: np.ndarray,
                        coverages: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(coverages, selective risks): mean kept error at each coverage (default 1/n, 2/n, ..., 1)."""
  errors, scores = _check_pair(errors, scores, "risk_coverage_curve")
  cov = (np.arange(1, errors.size + 1) / errors.size if coverages is None
         else np.asarray(coverages, np.float64))
  return cov, np.asarray([selective_risk(errors, scores, float(c)) for c in cov])


# ----------------------------------------------------------------------------- dispersion


def dispersion(samples: np.ndarray, axes: int | Sequence[int] | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
  """Spread of M stochastic samples of the same rollouts: samples [M, ...].

  raw = sqrt(mean_m ||s_m - mean||^2), the norm over ``axes`` of one sample's array (axes index
  ``samples[0]``; default every axis but the first, i.e. one value per rollout for samples
  [M, B, *S, F]); normalised = raw / ||mean||, the spread relative to the ensemble mean.
  Returns (raw, normalised), float64.
  """
  s = np.asarray(samples, np.float64)
  if s.ndim < 1 or s.shape[0] < 2:
    raise ValueError(f"dispersion needs samples [M >= 2, ...], got shape {s.shape}")
  if axes is None:
    axes = tuple(range(1, s.ndim - 1))
  axes = (axes,) if isinstance(axes, int) else tuple(axes)
  ax = tuple(a % (s.ndim - 1) + 1 for a in axes)
  mean = s.mean(0)
  raw = np.sqrt(np.mean(np.sum(np.square(s - mean), axis=ax), axis=0))
  norm = np.sqrt(np.sum(np.square(mean), axis=tuple(a - 1 for a in ax)))
  with np.errstate(divide="ignore", invalid="ignore"):
    return raw, raw / norm
