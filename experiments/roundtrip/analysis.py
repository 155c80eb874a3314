"""Per-seed statistics of one system from its units' per-rollout arrays (``unit.py``).

Every function takes the arrays of one seed and returns plain floats or lists (one entry per
depth), so that ``summarize`` can put a mean and a Student-t interval across seeds on each of them.
Rollouts are trajectory-major (``unit.windows``), so ``x.reshape(N, P)`` groups start times by
trajectory.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from experiments import harness
from rlpost.eval import trust

# Calibrators compared (``trust.Calibrator`` kinds and depth features). The pair that enters the
# verdicts uses the same depth feature, log(depth), in both, so that the gain measures what C adds:
# errors grow roughly as a power of depth, which a linear depth term fits poorly.
CALIBRATORS = {
    "c_logdepth": dict(kind="c_depth", depth_transform="log"),
    "c_depth": dict(kind="c_depth", depth_transform="linear"),
    "logdepth": dict(kind="depth", depth_transform="log"),
    "depth": dict(kind="depth", depth_transform="linear"),
    "depth_onehot": dict(kind="depth_onehot"),
}
MAIN_CALIBRATOR, DEPTH_ONLY = "c_logdepth", "logdepth"


def _floor(x: np.ndarray) -> np.ndarray:
  """Errors and discrepancies enter logs: floor them at a tiny positive value."""
  return np.maximum(np.asarray(x, np.float64), 1e-12)


def _depth_grid(values: np.ndarray, depths) -> np.ndarray:
  """[B, K] -> the depth of each entry, [B, K]."""
  return np.broadcast_to(np.asarray(depths, np.float64)[None, :], values.shape)


def ranking(a: dict[str, np.ndarray], depths, num_test_traj: int) -> dict[str, Any]:
  """Fixed-depth, within-trajectory and pooled Spearman of C (and baselines) against E, and the
  model's skill at the shallowest depth i: 1 - E_i / (error of the trivial prediction
  x_i := x_0)."""
  e, c = a["test_E"], a["test_C"]
  out = {
      "E_mean": e.mean(0).tolist(), "C_mean": c.mean(0).tolist(),
      "C_over_E": (np.median(c / _floor(e), axis=0)).tolist(),
      "rho_fixed": trust.fixed_depth_spearman(c, e).tolist(),
      "rho_fixed_latent": trust.fixed_depth_spearman(a["test_C_latent"], e).tolist(),
      "rho_pooled": trust.spearman(c.ravel(), e.ravel()),
  }
  if "test_disp" in a:
    out["rho_disp"] = trust.fixed_depth_spearman(a["test_disp"], e).tolist()
    out["rho_disp_norm"] = trust.fixed_depth_spearman(a["test_disp_norm"], e).tolist()
  wm, ws = [], []
  for k in range(len(depths)):
    m, s, _ = trust.within_trajectory_spearman(c[:, k].reshape(num_test_traj, -1),
                                               e[:, k].reshape(num_test_traj, -1))
    wm.append(m)
    ws.append(s)
  out["rho_within"], out["rho_within_std"] = wm, ws
  persist = a["test_fwd_persist"][:, [d - 1 for d in depths]]
  out["E_persistence"] = persist.mean(0).tolist()
  out["skill"] = float(1.0 - e[:, 0].mean() / persist[:, 0].mean())
  out["rho_within_depth_mean"] = float(np.nanmean(wm))
  return out


def fit_calibrators(a: dict[str, np.ndarray], depths) -> dict[str, trust.Calibrator]:
  """Every calibrator of ``CALIBRATORS`` fit on the training rollouts (pooled over depths)."""
  e, c = a["train_E"], a["train_C"]
  dep = _depth_grid(e, depths)
  return {name: trust.Calibrator.fit(_floor(c).ravel(), _floor(e).ravel(), dep.ravel(), **kw)
          for name, kw in CALIBRATORS.items()}


def calibration(a: dict[str, np.ndarray], depths, cals: dict[str, trust.Calibrator]
                ) -> dict[str, Any]:
  """Held-out width factors, coverage (overall and per depth) and Gaussian NLL per calibrator."""
  e, c = _floor(a["test_E"]), _floor(a["test_C"])
  dep = _depth_grid(e, depths)
  out = {}
  for name, cal in cals.items():
    row = {"sigma": cal.sigma,
           "factor68": float(np.exp(cal.sigma)),
           "factor95": float(np.exp(trust.z_for_level(trust.LEVEL_95) * cal.sigma)),
           "nll": cal.nll(c.ravel(), e.ravel(), dep.ravel())}
    for tag, level in (("68", trust.LEVEL_1SIGMA), ("95", trust.LEVEL_95)):
      row[f"cov{tag}"] = cal.coverage(c.ravel(), e.ravel(), dep.ravel(), level)
      row[f"cov{tag}_by_depth"] = [cal.coverage(c[:, k], e[:, k], dep[:, k], level)
                                   for k in range(len(depths))]
    row["nll_by_depth"] = [cal.nll(c[:, k], e[:, k], dep[:, k]) for k in range(len(depths))]
    out[name] = row
  out["nll_gain"] = out[DEPTH_ONLY]["nll"] - out[MAIN_CALIBRATOR]["nll"]
  out["nll_gain_vs_onehot"] = out["depth_onehot"]["nll"] - out[MAIN_CALIBRATOR]["nll"]
  out["coef_logC"] = float(cals[MAIN_CALIBRATOR].coef[1])
  return out


def ood(a: dict[str, np.ndarray], depths, num_test_traj: int, num_starts: int,
        ood_every: int) -> dict[str, Any]:
  """AUROC per depth of C, raw and normalised dispersion, and of the true error E (reference):
  OOD rollouts are positives, test rollouts from the same start times negatives."""
  keep = np.zeros((num_test_traj, num_starts), bool)
  keep[:, ::ood_every] = True
  keep = keep.ravel()
  out = {}
  for name, key in (("C", "C"), ("disp", "disp"), ("disp_norm", "disp_norm"), ("E", "E")):
    neg, pos = a[f"test_{key}"][keep], a[f"ood_{key}"]
    labels = np.concatenate([np.zeros(len(neg)), np.ones(len(pos))])
    out[name] = [trust.auroc(np.concatenate([neg[:, k], pos[:, k]]), labels)
                 for k in range(len(depths))]
    out[f"{name}_depth_mean"] = float(np.mean(out[name]))
  out["C_minus_best_disp"] = float(np.mean(out["C"]) - max(np.mean(out["disp"]),
                                                           np.mean(out["disp_norm"])))
  return out


def selective(a: dict[str, np.ndarray], depths, cals: dict[str, trust.Calibrator],
              coverage: float) -> dict[str, Any]:
  """Error cut at ``coverage`` by each ranking, per depth and pooled over depths.

  Per depth: C, sampling dispersion, depth-only (constant within a depth: cuts nothing) and the
  oracle (the true error). Pooled: the main calibrator's predicted error (C and depth), the
  depth-only calibrator's (ranks by depth), raw C, and the oracle.
  """
  e, c = a["test_E"], a["test_C"]
  dep = _depth_grid(e, depths)
  red = trust.selective_error_reduction
  out: dict[str, Any] = {"by_depth": {
      "C": [red(e[:, k], c[:, k], coverage) for k in range(len(depths))],
      "disp": [red(e[:, k], a["test_disp"][:, k], coverage) for k in range(len(depths))],
      "depth": [red(e[:, k], dep[:, k], coverage) for k in range(len(depths))],
      "oracle": [red(e[:, k], e[:, k], coverage) for k in range(len(depths))],
  }}
  pred_c = cals[MAIN_CALIBRATOR].predict(_floor(c).ravel(), dep.ravel())
  pred_d = cals[DEPTH_ONLY].predict(None, dep.ravel())
  out["pooled"] = {"C_calibrated": red(e.ravel(), pred_c, coverage),
                   "C_raw": red(e.ravel(), c.ravel(), coverage),
                   "depth": red(e.ravel(), pred_d, coverage),
                   "oracle": red(e.ravel(), e.ravel(), coverage)}
  out["pooled"]["C_minus_3x_depth"] = out["pooled"]["C_calibrated"] - 3 * out["pooled"]["depth"]
  out["by_depth_C_mean"] = float(np.mean(out["by_depth"]["C"]))
  return out


def risk_curves(a: dict[str, np.ndarray], depths, cals: dict[str, trust.Calibrator]
                ) -> dict[str, Any]:
  """Risk-coverage curves (selective risk / full risk) at the shallowest and deepest depth and
  pooled, for C, dispersion, depth-only and the oracle (plots)."""
  e, c = a["test_E"], a["test_C"]
  dep = _depth_grid(e, depths)
  grid = np.linspace(0.05, 1.0, 20)
  out = {}
  for tag, k in (("first", 0), ("last", len(depths) - 1)):
    out[tag] = {name: (trust.risk_coverage_curve(e[:, k], s, grid)[1] / e[:, k].mean()).tolist()
                for name, s in (("C", c[:, k]), ("disp", a["test_disp"][:, k]),
                                ("oracle", e[:, k]))}
  pooled = {"C (calibrated)": cals[MAIN_CALIBRATOR].predict(_floor(c).ravel(), dep.ravel()),
            "depth only": dep.ravel(), "oracle": e.ravel()}
  out["pooled"] = {name: (trust.risk_coverage_curve(e.ravel(), s, grid)[1] / e.mean()).tolist()
                   for name, s in pooled.items()}
  out["coverage"] = grid.tolist()
  return out


def _log_ratio(a: np.ndarray, b: np.ndarray) -> float:
  """log(mean a / mean b): positive when b is the smaller error."""
  return float(np.log(np.mean(a) / np.mean(b)))


def specialists(units: dict[str, dict[str, np.ndarray]], depths) -> dict[str, Any]:
  """Bidirectional vs forward-only and backward-only models at equal training steps.

  Errors at every depth 1..D (mean over test rollouts); the gains are log(specialist / bidir) of
  the error averaged over depths ``depths`` (one step included), positive when the bidirectional
  model is more accurate.
  """
  bi = units["bidir"]
  idx = [d - 1 for d in depths]
  out = {"bidir_fwd": bi["test_fwd_err"].mean(0).tolist(),
         "bidir_bwd": bi["test_bwd_err"].mean(0).tolist()}
  if "forward" in units:
    f = units["forward"]["test_fwd_err"]
    out["forward_fwd"] = f.mean(0).tolist()
    out["gain_fwd"] = _log_ratio(f[:, idx], bi["test_fwd_err"][:, idx])
    out["gain_fwd_1step"] = _log_ratio(f[:, 0], bi["test_fwd_err"][:, 0])
  if "backward" in units:
    b = units["backward"]["test_bwd_err"]
    out["backward_bwd"] = b.mean(0).tolist()
    out["gain_bwd"] = _log_ratio(b[:, idx], bi["test_bwd_err"][:, idx])
    out["gain_bwd_1step"] = _log_ratio(b[:, 0], bi["test_bwd_err"][:, 0])
  return out


def inverse(a: dict[str, np.ndarray], depths) -> dict[str, Any]:
  """The backward direction as an inverse solver: error recovering x_0 from the true x_i, the
  trivial estimate x_0 = x_i, and the forward error at the same depth, per depth."""
  idx = [d - 1 for d in depths]
  inv, per, fwd = a["test_bwd_err"][:, idx], a["test_persist"][:, idx], a["test_fwd_err"][:, idx]
  return {"error": inv.mean(0).tolist(), "persistence": per.mean(0).tolist(),
          "forward_error": fwd.mean(0).tolist(),
          "gain_vs_persistence": [float(np.log(per[:, k].mean() / inv[:, k].mean()))
                                  for k in range(len(depths))]}


def undertrained(u: dict[str, np.ndarray], depths) -> dict[str, Any]:
  """Rankings of the undertrained model: fixed depth per depth, and pooled (inflated)."""
  return {"E_mean": u["test_E"].mean(0).tolist(),
          "rho_fixed": trust.fixed_depth_spearman(u["test_C"], u["test_E"]).tolist(),
          "rho_pooled": trust.spearman(u["test_C"].ravel(), u["test_E"].ravel())}


def seed_metrics(units: dict[str, dict[str, np.ndarray]], depths, *, num_test_traj: int,
                 num_starts: int, ood_every: int, coverage: float) -> dict[str, Any]:
  """All per-seed statistics of one system (``units``: kind -> arrays)."""
  a = units["bidir"]
  cals = fit_calibrators(a, depths)
  out = {"ranking": ranking(a, depths, num_test_traj),
         "calibration": calibration(a, depths, cals),
         "ood": ood(a, depths, num_test_traj, num_starts, ood_every),
         "selective": selective(a, depths, cals, coverage),
         "curves": risk_curves(a, depths, cals),
         "specialists": specialists(units, depths),
         "inverse": inverse(a, depths)}
  if "under" in units:
    out["undertrained"] = undertrained(units["under"], depths)
  out["derived"] = derived(out)
  return out


def derived(m: dict[str, Any]) -> dict[str, float]:
  """Per-seed differences that the verdicts need (so that their CIs are paired by seed)."""
  r = m["ranking"]
  rho = np.asarray(r["rho_fixed"])
  best_disp = np.maximum(np.asarray(r["rho_disp"]), np.asarray(r["rho_disp_norm"]))
  out = {"rho_minus_disp": float(np.mean(rho - best_disp))}
  if "undertrained" in m:
    u = m["undertrained"]
    out["trained_minus_under"] = float(np.mean(rho - np.asarray(u["rho_fixed"])))
    out["under_pooled_minus_fixed"] = float(u["rho_pooled"] - np.mean(u["rho_fixed"]))
  return out


def scatter(a: dict[str, np.ndarray], depths, max_points: int = 128) -> dict[str, Any]:
  """What the scatter and calibration plots draw of one seed, kept in results.json: E_i, C_i and
  the main calibrator's predicted error of at most ``max_points`` evenly spaced test rollouts per
  depth (4 significant digits), and the calibrator's sigma."""
  e, c = _floor(a["test_E"]), _floor(a["test_C"])
  cal = fit_calibrators(a, depths)[MAIN_CALIBRATOR]
  pred = cal.predict(c.ravel(), _depth_grid(e, depths).ravel()).reshape(e.shape)
  idx = np.unique(np.linspace(0, e.shape[0] - 1, min(max_points, e.shape[0])).astype(int))
  keep = lambda x: [[float(f"{v:.4g}") for v in col] for col in x[idx].T]  # noqa: E731
  return {"E": keep(e), "C": keep(c), "pred": keep(pred), "sigma": float(cal.sigma)}


def summarize(per_seed: list[Any]) -> Any:
  """Mean and 95% Student-t interval across seeds of every number in a nested structure.

  Dicts recurse; lists of numbers become lists of interval dicts (entry-wise); a number becomes
  ``harness.cell``'s ``{"mean", "lo", "hi", "n"}`` over its finite per-seed values (NaN and
  missing values, None in JSON, are dropped).
  """
  first = per_seed[0]
  if isinstance(first, dict):
    return {k: summarize([s[k] for s in per_seed]) for k in first}
  if isinstance(first, (list, tuple)):
    return [summarize([s[i] for s in per_seed]) for i in range(len(first))]
  vals = np.asarray([np.nan if v is None else v for v in per_seed], np.float64)
  vals = vals[np.isfinite(vals)]
  if vals.size == 0:
    return {"mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": 0}
  return harness.cell(vals)
