"""Shared helpers of the averaging tables: grouping runs by setting, seed statistics, verdicts.

Shape legend: R runs, E eval points, M methods (index 0 is the raw checkpoint). Losses are excess
losses in nats (cross-entropy above the language's entropy floor); a gain is raw minus method, so a
positive gain means the average is better.
"""

from __future__ import annotations

import math

import numpy as np

from rlpost.eval.metrics import mean_ci, paired_difference_ci


def settings(data: dict) -> list[tuple[str, float]]:
  """(schedule, lr) pairs in run order, each with one run per seed."""
  out = []
  for r in data["runs"]:
    key = (r["schedule"], r["lr"])
    if key not in out:
      out.append(key)
  return out


def run_index(data: dict, schedule: str, lr: float) -> np.ndarray:
  """Run indices of one setting, ordered by seed (so settings pair up seed by seed)."""
  idx = [(r["seed"], i) for i, r in enumerate(data["runs"])
         if r["schedule"] == schedule and r["lr"] == lr]
  return np.asarray([i for _, i in sorted(idx)])


def step_index(data: dict, fraction: float) -> int:
  """Index of the eval step closest to ``fraction`` of training."""
  steps = np.asarray(data["steps"])
  return int(np.argmin(np.abs(steps - fraction * steps[-1])))


def method_index(data: dict, name: str) -> int:
  return data["methods"].index(name)


def ci(values) -> dict:
  m, lo, hi = mean_ci(np.asarray(values, np.float64))
  return {"mean": m, "lo": lo, "hi": hi, "n": int(np.size(values))}


def diff_ci(a, b) -> dict:
  m, lo, hi = paired_difference_ci(np.asarray(a, np.float64), np.asarray(b, np.float64))
  return {"mean": m, "lo": lo, "hi": hi, "n": int(np.size(a))}


def fmt(c: dict, digits: int = 3) -> str:
  """'0.123 [0.100, 0.140]' (no interval for a single seed)."""
  if c is None:
    return "—"
  if c.get("lo") is None or (isinstance(c["lo"], float) and math.isnan(c["lo"])):
    return f"{c['mean']:.{digits}f}"
  return f"{c['mean']:+.{digits}f} [{c['lo']:+.{digits}f}, {c['hi']:+.{digits}f}]" if c.get(
      "signed") else f"{c['mean']:.{digits}f} [{c['lo']:.{digits}f}, {c['hi']:.{digits}f}]"


def signed(c: dict) -> dict:
  return dict(c, signed=True)


def verdict(c: dict, *, margin: float = 0.0) -> str:
  """reproduced if the CI of the claimed effect lies above ``margin``, not reproduced if it lies
  below it, inconclusive otherwise (or with fewer than 2 seeds)."""
  if c["n"] < 2 or math.isnan(c["lo"]):
    return "inconclusive"
  if c["lo"] > margin:
    return "reproduced"
  if c["hi"] < margin:
    return "not reproduced"
  return "inconclusive"


def lr_label(schedule: str, lr: float) -> str:
  return f"{lr:g}" + (" (cosine)" if schedule == "cosine" else "")


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(r) + " |" for r in rows]
  return "\n".join(lines)
