"""Which checkpoints to average and with which weights (host-side, NumPy).

Shape legend: N selected checkpoints (steps s_1 < ... < s_N); M power-EMA snapshots; T training
steps covered by a discrete profile.

Selection (each returns a sorted list of steps and raises a ValueError that names the steps when
the request cannot be met):
  ``select_latest``      the k latest checkpoints at spacing nu, ending at ``end`` (LAWA);
  ``select_from``        every checkpoint from a start step, optionally at spacing nu (SWA);
  ``select_log_spaced``  the latest checkpoint at or before end - base^n, n = 0, 1, ...;
  ``select_all``         every checkpoint.

Weights (each returns float64 [N] summing to 1, except the least-squares reconstruction):
  ``uniform_weights``    1/N;
  ``ema_weights``        w_i proportional to d^(N - i) (per checkpoint) or d^(s_N - s_i) (per step),
                         normalised, i.e. bias-corrected;
  ``mwa_weights``        metric-weighted averaging (MWA, Choi & Yu 2025): w_i = f(m_i, p) / sum_j
                         f(m_j, p) for a pluggable f with one penalty hyperparameter p and
                         f(m, 0) = 1, so p = 0 is the uniform average. ``loss_power``
                         (f = m^-p: lower loss, more weight) and ``step_power`` (f = s^p: later
                         step, more weight) are provided; ``loss_softmin``
                         (f = exp(-p (m - min m))) is a scale-free alternative. The paper's exact
                         formula could not be checked here, hence the pluggable f;
  ``posthoc_ema_weights``  EDM2 post-hoc EMA (Karras et al. 2024, section 3 and appendix C):
                         the least-squares combination of power-function EMA snapshots whose
                         averaging profile is closest in L2 to the profile of a target width.

Power-function EMA profiles. A snapshot at step t with exponent gamma averages the trajectory with
the profile p_{t,gamma}(tau) = (gamma + 1) tau^gamma / t^(gamma + 1) on 0 <= tau <= t (continuous
time); its relative width is
sigma_rel = std(p) / t = sqrt((gamma + 1) / ((gamma + 2)^2 (gamma + 3))).
The discrete EMA with beta_t = (1 - 1/t)^(gamma + 1) gives step tau the exact weight
w(tau) = (tau^(gamma+1) - (tau - 1)^(gamma+1)) / t^(gamma+1), tau = 1..t (a telescoping sum
equal to 1). Reconstruction solves min_x || sum_i x_i p_i - p_target ||_2 either exactly over the
discrete steps (when N x T is small) or with the closed-form continuous inner products
<p_a, p_b> = (g_a + 1)(g_b + 1) min(t_a, t_b)^(g_a + g_b + 1) /
             ((g_a + g_b + 1) t_a^(g_a + 1) t_b^(g_b + 1)).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np


def _steps(available: Sequence[int]) -> list[int]:
  steps = sorted({int(s) for s in available})
  if not steps:
    raise ValueError("no checkpoints to choose from (the checkpoint list is empty)")
  return steps


def _end(steps: list[int], end: int | None) -> int:
  if end is None:
    return steps[-1]
  if end not in steps:
    raise ValueError(f"end step {end} is not a checkpoint (available: {_fmt(steps)})")
  return int(end)


def _fmt(steps: Sequence[int], limit: int = 12) -> str:
  steps = list(steps)
  if len(steps) <= limit:
    return ", ".join(map(str, steps))
  head, tail = steps[:limit // 2], steps[-limit // 2:]
  return ", ".join(map(str, head)) + ", ..., " + ", ".join(map(str, tail))


# ------------------------------------------------------------------------------------ selection
def select_latest(available: Sequence[int], k: int, *, every: int | None = None,
                  end: int | None = None) -> list[int]:
  """The ``k`` latest checkpoints ending at ``end`` (default: the latest one).

  every: spacing nu in steps: the steps end, end - nu, ..., end - (k - 1) nu must all exist.
  None takes the k latest checkpoints whatever their spacing.
  """
  steps = _steps(available)
  if k < 1:
    raise ValueError(f"k must be >= 1, got {k}")
  end = _end(steps, end)
  if every is None:
    before = [s for s in steps if s <= end]
    if len(before) < k:
      raise ValueError(f"k={k} checkpoints requested but only {len(before)} exist at or before "
                       f"step {end} (steps {_fmt(before)})")
    return before[-k:]
  if every < 1:
    raise ValueError(f"every must be >= 1, got {every}")
  want = [end - i * every for i in range(k)][::-1]
  missing = [s for s in want if s not in set(steps)]
  if missing:
    raise ValueError(f"k={k} checkpoints at spacing {every} ending at step {end} need steps "
                     f"{_fmt(want)}; missing {_fmt(missing)} (available: {_fmt(steps)})")
  return want


def select_from(available: Sequence[int], start: int, *, every: int | None = None,
                end: int | None = None) -> list[int]:
  """Every checkpoint with start <= step <= end (and (step - start) % every == 0 if given)."""
  steps = _steps(available)
  end = _end(steps, end)
  out = [s for s in steps if start <= s <= end and (every is None or (s - start) % every == 0)]
  if not out:
    spacing = f" at spacing {every}" if every else ""
    raise ValueError(f"no checkpoint between steps {start} and {end}{spacing} "
                     f"(available: {_fmt(steps)})")
  return out


def select_log_spaced(available: Sequence[int], *, base: float = 2.0, end: int | None = None,
                      count: int | None = None) -> list[int]:
  """The latest checkpoint at or before end - base^n for n = 0, 1, ... (and end itself)."""
  steps = _steps(available)
  if base <= 1:
    raise ValueError(f"log-spaced selection needs base > 1, got {base}")
  end = _end(steps, end)
  chosen = [end]
  offset = 1.0
  arr = np.asarray(steps)
  while end - offset >= steps[0] and (count is None or len(chosen) < count):
    cand = arr[arr <= end - offset]
    if cand.size and int(cand[-1]) not in chosen:
      chosen.append(int(cand[-1]))
    offset *= base
  return sorted(chosen)


def select_all(available: Sequence[int]) -> list[int]:
  return _steps(available)


# -------------------------------------------------------------------------------------- weights
def _normalise(w: np.ndarray, what: str, steps: Sequence[int] | None = None) -> np.ndarray:
  w = np.asarray(w, np.float64)
  bad = ~np.isfinite(w) | (w < 0)
  if bad.any():
    where = [int(s) for s in np.asarray(steps)[bad]] if steps is not None else np.flatnonzero(bad)
    raise ValueError(f"{what}: weights must be finite and >= 0; bad at steps {list(where)}: "
                     f"{w[bad].tolist()}")
  total = w.sum()
  if not total > 0:
    raise ValueError(f"{what}: weights sum to {total}, nothing to average")
  return w / total


def uniform_weights(n: int) -> np.ndarray:
  if n < 1:
    raise ValueError("uniform weights need at least one checkpoint")
  return np.full(n, 1.0 / n)


def ema_weights(steps: Sequence[int], decay: float, *, per: str = "checkpoint") -> np.ndarray:
  """Bias-corrected EMA weights over checkpoints: d^(N - i) or d^(s_N - s_i), normalised."""
  if not 0 <= decay < 1:
    raise ValueError(f"ema decay must be in [0, 1), got {decay}")
  s = np.asarray(steps, np.float64)
  if per == "checkpoint":
    age = np.arange(s.size)[::-1].astype(np.float64)
  elif per == "step":
    age = s[-1] - s
  else:
    raise ValueError(f"per must be 'checkpoint' or 'step', got {per!r}")
  return _normalise(np.power(decay, age) if decay > 0 else (age == 0).astype(np.float64),
                    "ema", steps)


WeightFn = Callable[[np.ndarray, float], np.ndarray]


def loss_power(metric: np.ndarray, penalty: float) -> np.ndarray:
  """f(m, p) = m^-p for positive metrics where lower is better (a training loss)."""
  m = np.asarray(metric, np.float64)
  if np.any(~(m > 0)):
    raise ValueError(f"loss_power needs positive finite metrics, got {m.tolist()}")
  return np.power(m, -penalty)


def step_power(metric: np.ndarray, penalty: float) -> np.ndarray:
  """f(s, p) = s^p for positive steps (later checkpoints weigh more for p > 0)."""
  s = np.asarray(metric, np.float64)
  if np.any(~(s > 0)):
    raise ValueError(f"step_power needs positive steps, got {s.tolist()}")
  return np.power(s, penalty)


def loss_softmin(metric: np.ndarray, penalty: float) -> np.ndarray:
  """f(m, p) = exp(-p (m - min m)): softmin of the metric with temperature 1/p."""
  m = np.asarray(metric, np.float64)
  return np.exp(-penalty * (m - np.min(m)))


MWA_WEIGHT_FNS: dict[str, WeightFn] = {"loss": loss_power, "step": step_power,
                                       "loss_softmin": loss_softmin}


def mwa_weights(metric: Sequence[float], penalty: float, *,
                weight_fn: WeightFn | str = "loss",
                steps: Sequence[int] | None = None) -> np.ndarray:
  """Metric-weighted averaging weights: f(m_i, p) / sum_j f(m_j, p); p = 0 gives 1/N.

  metric: [N] one value per checkpoint (training loss, or the step for step weighting).
  weight_fn: a name in ``MWA_WEIGHT_FNS`` or any f(metric [N], p) -> [N] non-negative.
  steps: used only to name checkpoints in error messages.
  """
  fn = MWA_WEIGHT_FNS[weight_fn] if isinstance(weight_fn, str) else weight_fn
  m = np.asarray(metric, np.float64)
  if m.ndim != 1 or m.size == 0:
    raise ValueError(f"mwa needs a non-empty [N] metric, got shape {m.shape}")
  bad = ~np.isfinite(m)
  if bad.any():
    where = np.asarray(steps)[bad].tolist() if steps is not None else np.flatnonzero(bad).tolist()
    raise ValueError(f"mwa: non-finite metric at steps {where}")
  return _normalise(fn(m, float(penalty)), "mwa", steps)


# ------------------------------------------------------------------------- power-function EMA
def gamma_to_sigma_rel(gamma: float) -> float:
  g = float(gamma)
  if g <= -1:
    raise ValueError(f"gamma must be > -1, got {g}")
  return float(np.sqrt((g + 1) / ((g + 2) ** 2 * (g + 3))))


_SIGMA_REL_MAX = None


def _sigma_rel_max() -> float:
  global _SIGMA_REL_MAX
  if _SIGMA_REL_MAX is None:
    grid = np.linspace(-0.999, 2.0, 30001)
    _SIGMA_REL_MAX = float(max(gamma_to_sigma_rel(g) for g in grid))
  return _SIGMA_REL_MAX


def sigma_rel_to_gamma(sigma_rel: float) -> float:
  """The exponent gamma of the power profile with relative width ``sigma_rel``.

  Squaring sigma_rel^2 (gamma + 2)^2 (gamma + 3) = gamma + 1 gives the cubic
  s^2 g^3 + 7 s^2 g^2 + (16 s^2 - 1) g + (12 s^2 - 1) = 0. sigma_rel rises from 0 at gamma = -1
  to a maximum of about 0.30 near gamma = -0.3 and falls back to 0 as gamma grows; the largest
  real root is the profile that concentrates on recent steps (the EMA-like one).
  """
  s = float(sigma_rel)
  if not 0 < s <= _sigma_rel_max():
    raise ValueError(f"sigma_rel must be in (0, {_sigma_rel_max():.4f}], got {sigma_rel}")
  s2 = s * s
  roots = np.roots([s2, 7 * s2, 16 * s2 - 1, 12 * s2 - 1])
  real = [r.real for r in roots if abs(r.imag) < 1e-6 * max(1.0, abs(r.real)) and r.real > -1]
  if not real:
    raise ValueError(f"no power profile has sigma_rel={sigma_rel}")
  return float(max(real))


def power_profile(t: int, gamma: float) -> np.ndarray:
  """[t] weights of steps 1..t in the discrete power EMA at step t (sum to 1)."""
  tau = np.arange(1, int(t) + 1, dtype=np.float64)
  e = gamma + 1.0
  # (tau^e - (tau - 1)^e) / t^e, computed as ratios to avoid overflow for large gamma.
  return np.power(tau / t, e) - np.power((tau - 1.0) / t, e)


def _continuous_gram(t_a, g_a, t_b, g_b) -> np.ndarray:
  t_a, g_a = np.asarray(t_a, np.float64)[:, None], np.asarray(g_a, np.float64)[:, None]
  t_b, g_b = np.asarray(t_b, np.float64)[None, :], np.asarray(g_b, np.float64)[None, :]
  m = np.minimum(t_a, t_b)
  log = (np.log(g_a + 1) + np.log(g_b + 1) + (g_a + g_b + 1) * np.log(m) - np.log(g_a + g_b + 1)
         - (g_a + 1) * np.log(t_a) - (g_b + 1) * np.log(t_b))
  return np.exp(log)


def posthoc_ema_weights(snapshot_steps: Sequence[int], snapshot_gammas: Sequence[float],
                        target_step: int, target_sigma_rel: float, *,
                        exact: bool | None = None, max_exact_size: int = 20_000_000) -> np.ndarray:
  """Least-squares weights x [M] with sum_i x_i * snapshot_i ~ the power EMA of the target width.

  snapshot_steps, snapshot_gammas: [M] step t_i and exponent gamma_i of each stored power-EMA
    snapshot (several widths may share a step).
  target_step: the step at which to reconstruct (<= the last snapshot step).
  exact: least squares over the discrete per-step profiles (True), over the continuous profiles
    (False), or discrete when M * target_step <= ``max_exact_size`` (None).
  The weights need not be positive; they sum to about 1 (each profile has unit mass).
  """
  t = np.asarray(snapshot_steps, np.int64)
  g = np.asarray(snapshot_gammas, np.float64)
  if t.ndim != 1 or t.shape != g.shape or t.size == 0:
    raise ValueError(f"need [M] snapshot steps and gammas of equal length, got {t.shape}, "
                     f"{g.shape}")
  if np.any(t < 1):
    raise ValueError(f"snapshot steps must be >= 1, got {t.tolist()}")
  if target_step < 1 or target_step > t.max():
    raise ValueError(f"target step {target_step} is outside the snapshots' range 1..{int(t.max())}")
  g_t = sigma_rel_to_gamma(target_sigma_rel)
  if exact is None:
    exact = t.size * int(t.max()) <= max_exact_size
  if exact:
    T = int(t.max())
    basis = np.zeros((t.size, T))
    for i, (ti, gi) in enumerate(zip(t, g)):
      basis[i, :ti] = power_profile(int(ti), gi)
    target = np.zeros(T)
    target[:target_step] = power_profile(int(target_step), g_t)
    x, *_ = np.linalg.lstsq(basis.T, target, rcond=None)
    return x
  gram = _continuous_gram(t, g, t, g)
  rhs = _continuous_gram(t, g, [target_step], [g_t])[:, 0]
  x, *_ = np.linalg.lstsq(gram, rhs, rcond=None)
  return x
