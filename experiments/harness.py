"""Claims as data, judged by ``rlpost.eval.stats`` (the protocol of shared/specs/statistics.md).

A paper table pre-declares its claims: which metric, which two arms, the claimed direction and
margin, and the family (the claims of one paper) whose p-values are Holm-adjusted together.
``judge_family`` turns per-seed values into verdicts:

* a directional claim ("arm a beats arm b by more than ``margin``"): the Welch interval of
  mean(a) - mean(b) and the one-sided Welch test of H0: a - b <= margin. *reproduced* when the
  Holm-adjusted p-value is at most ``alpha`` and the interval lies above the margin; *not
  reproduced* when the interval lies below the margin; *inconclusive* otherwise. A permutation
  test of the same difference is reported beside it (distribution-free; at 3-4 seeds per arm its
  smallest attainable p, 1/20 or 1/70, is too coarse to carry a Holm-corrected decision);
* an equivalence claim ("within ``margin``"): TOST. *reproduced* when both one-sided tests reject
  at ``alpha`` (Holm-adjusted); *not reproduced* when the interval lies wholly outside (-margin, +margin);
  *inconclusive* otherwise.

A claim about pooled rates rather than per-seed values (e.g. "fewer opposite-sign advantages",
counted over many rollouts) is judged by ``judge_proportions``: a two-proportion z-test.

Each verdict carries the minimum detectable effect of the run (80% power at the arms' pooled SD
and seed count), to report what an inconclusive claim could have detected.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np
from scipy.stats import norm as normal

from rlpost.eval import stats

DIRECTIONS = ("greater", "less", "equivalent")


@dataclasses.dataclass(frozen=True)
class Claim:
  """One pre-declared claim.

  Attributes:
    id: a short key (``"median_beats_mean"``).
    text: the paper's claim in words.
    metric: the name of the per-seed metric compared.
    arms: (a, b): the claim is about mean(a) - mean(b).
    direction: "greater" (a - b > margin), "less" (a - b < -margin) or "equivalent"
      (|a - b| < margin).
    margin: the minimum effect of interest (> 0 for "equivalent").
    family: claims of one family are Holm-adjusted together.
  """

  id: str
  text: str
  metric: str
  arms: tuple[str, str]
  direction: str = "greater"
  margin: float = 0.0
  family: str = ""

  def __post_init__(self):
    if self.direction not in DIRECTIONS:
      raise ValueError(f"claim {self.id!r}: direction must be one of {DIRECTIONS}, "
                       f"got {self.direction!r}")
    if self.margin < 0 or (self.direction == "equivalent" and self.margin <= 0):
      raise ValueError(f"claim {self.id!r}: margin must be >= 0 (> 0 for an equivalence claim), "
                       f"got {self.margin}")


@dataclasses.dataclass(frozen=True)
class Verdict:
  """A judged claim: the difference a - b with its interval (Welch at ``level``; for an
  equivalence claim the TOST interval at 1 - 2 alpha), the deciding test's raw and Holm-adjusted
  p-values, the permutation test's p-value (two-sided for an equivalence claim), the verdict, the
  seed counts and the minimum detectable effect."""

  claim: Claim
  diff: float
  lo: float
  hi: float
  p: float
  p_holm: float
  p_permutation: float
  verdict: str
  n: tuple[int, int]
  mde: float
  method: str

  def to_json(self) -> dict:
    return dict(dataclasses.asdict(self), claim=dataclasses.asdict(self.claim))


def _raw(claim: Claim, a: np.ndarray, b: np.ndarray, level: float, n_resamples: int):
  """(diff, lo, hi, p, p_permutation, method) before the family's correction."""
  if claim.direction == "equivalent":
    p, lo, hi = stats.tost(a, b, claim.margin, level=level)
    p_perm = stats.permutation_test(a, b, n_resamples=n_resamples)
    return (float(np.mean(a) - np.mean(b)), lo, hi, p, p_perm,
            f"TOST (Welch), margin {claim.margin:g}")
  diff, lo, hi = stats.diff_interval(a, b, level=level, method="welch")
  alternative = "greater" if claim.direction == "greater" else "less"
  shift = claim.margin if claim.direction == "greater" else -claim.margin
  p = stats.t_test(a - shift, b, alternative=alternative)
  p_perm = stats.permutation_test(a, b, alternative=alternative, n_resamples=n_resamples)
  return diff, lo, hi, p, p_perm, "Welch interval and one-sided Welch test"


def _decide(claim: Claim, lo: float, hi: float, p_holm: float, alpha: float) -> str:
  m = claim.margin
  if claim.direction == "equivalent":
    if p_holm <= alpha:
      return "reproduced"
    if lo >= m or hi <= -m:
      return "not reproduced"
    return "inconclusive"
  if claim.direction == "less":
    lo, hi = -hi, -lo
  if lo > m and p_holm <= alpha:
    return "reproduced"
  if hi < m:
    return "not reproduced"
  return "inconclusive"


def judge_family(claims: Sequence[Claim], values: Mapping[str, Mapping[str, Sequence[float]]], *,
                 level: float = 0.95, n_resamples: int = 10000) -> list[Verdict]:
  """Verdicts of ``claims``; ``values[metric][arm]`` are per-seed values (1-D, >= 2 seeds).

  p-values are Holm-adjusted within each ``Claim.family``; a test rejects when p <= alpha =
  1 - level (an exact permutation test then has size alpha).
  """
  alpha = round(1.0 - level, 12)
  raw = []
  for c in claims:
    try:
      a = np.asarray(values[c.metric][c.arms[0]], np.float64)
      b = np.asarray(values[c.metric][c.arms[1]], np.float64)
    except KeyError as e:
      raise KeyError(f"claim {c.id!r}: no per-seed values for {e}") from None
    diff, lo, hi, p, p_perm, method = _raw(c, a, b, level, n_resamples)
    p = 1.0 if math.isnan(p) else p  # no spread and no difference: nothing to reject
    raw.append((c, a, b, diff, lo, hi, p, p_perm, method))
  adjusted = [0.0] * len(raw)
  for fam in dict.fromkeys(c.family for c in claims):
    idx = [i for i, c in enumerate(claims) if c.family == fam]
    for i, p in zip(idx, stats.holm([raw[i][6] for i in idx])):
      adjusted[i] = float(p)
  out = []
  for (c, a, b, diff, lo, hi, p, p_perm, method), p_holm in zip(raw, adjusted):
    sd = math.sqrt((np.var(a, ddof=1) + np.var(b, ddof=1)) / 2)
    n = min(len(a), len(b))
    mde = stats.min_detectable_effect(sd, n) if sd > 0 else 0.0
    out.append(Verdict(c, float(diff), float(lo), float(hi), float(p), p_holm, float(p_perm),
                       _decide(c, lo, hi, p_holm, alpha), (len(a), len(b)), float(mde), method))
  return out


def judge_proportions(claim: Claim, rates: Mapping[str, tuple[float, int]], *,
                      level: float = 0.95) -> dict:
  """The verdict of a directional ``claim`` about two pooled rates; ``rates[arm]`` is (rate,
  count of trials).

  The unpooled two-proportion z statistic z = (p_a - p_b - shift) / se, with se =
  sqrt(p_a (1 - p_a) / n_a + p_b (1 - p_b) / n_b) and shift the signed margin, gives a one-sided
  p-value and the Wald interval of p_a - p_b at ``level``; the verdict follows the rules of a
  directional claim in ``judge_family`` (not Holm-adjusted; inconclusive when an arm has no
  trials). It treats every trial as independent, so where trials share a source (rollouts of one
  prompt) the test is lenient.
  Returns a JSON-ready dict: claim, diff, lo, hi, z, p, verdict, n and method.
  """
  if claim.direction == "equivalent":
    raise ValueError(f"claim {claim.id!r}: judge_proportions takes a directional claim")
  try:
    (pa, na), (pb, nb) = (rates[arm] for arm in claim.arms)
  except KeyError as e:
    raise KeyError(f"claim {claim.id!r}: no rate for {e}") from None
  if min(na, nb) < 0 or not all(0.0 <= x <= 1.0 for x in (pa, pb)):
    raise ValueError(f"claim {claim.id!r}: rates must lie in [0, 1] over >= 0 trials, got "
                     f"{pa} of {na} and {pb} of {nb}")
  diff = pa - pb
  se = (math.sqrt(pa * (1 - pa) / na + pb * (1 - pb) / nb) if min(na, nb) > 0
        else float("nan"))  # an arm without trials: no interval
  half = normal.ppf(0.5 + level / 2) * se
  shift = claim.margin if claim.direction == "greater" else -claim.margin
  if not se > 0:
    z, p = float("nan"), 1.0  # no trials or no spread: nothing to reject
  else:
    z = (diff - shift) / se
    p = float(normal.sf(z) if claim.direction == "greater" else normal.cdf(z))
  lo, hi = float(diff - half), float(diff + half)
  return {"claim": dataclasses.asdict(claim), "diff": diff, "lo": lo, "hi": hi, "z": z, "p": p,
          "verdict": _decide(claim, lo, hi, p, round(1.0 - level, 12)), "n": (int(na), int(nb)),
          "method": "two-proportion z-test (unpooled), trials treated as independent"}


def verdict_rows(verdicts: Sequence[Verdict], digits: int = 3) -> list[str]:
  """Markdown table rows: claim | a - b [interval] | p (Holm) | permutation p | seeds | minimum
  detectable effect | verdict (``Verdict`` objects or their ``to_json`` dicts)."""
  rows = ["| claim (paper) | ours: a - b [interval] | p (Holm) | permutation p | seeds | "
          "min. detectable | verdict |", "| --- | --- | --- | --- | --- | --- | --- |"]
  for v in verdicts:
    v = v if isinstance(v, dict) else v.to_json()
    c = v["claim"]
    rows.append(f"| {c['text']} | {c['arms'][0]}: {v['diff']:+.{digits}f} "
                f"[{v['lo']:+.{digits}f}, {v['hi']:+.{digits}f}] | {v['p']:.3g} "
                f"({v['p_holm']:.3g}) | {v['p_permutation']:.3g} | {v['n'][0]} vs {v['n'][1]} | "
                f"{v['mde']:.{digits}f} | {v['verdict']} |")
  return rows


def cell(x: Sequence[float], level: float = 0.95) -> dict:
  """{"mean", "lo", "hi", "n"}: the Student-t interval of a per-seed mean (no interval, NaN
  bounds, for a single seed)."""
  x = np.asarray(x, np.float64)
  if x.size < 2:
    return {"mean": float(np.mean(x)), "lo": float("nan"), "hi": float("nan"), "n": int(x.size)}
  m, lo, hi = stats.mean_interval(x, level=level, method="t")
  return {"mean": float(m), "lo": float(lo), "hi": float(hi), "n": int(x.size)}


def diff_cell(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> dict:
  """{"mean", "lo", "hi", "n", "signed"}: mean(a) - mean(b) of unpaired arms with its Welch
  interval (NaN bounds below 2 seeds per arm)."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if min(a.size, b.size) < 2:
    return {"mean": float(a.mean() - b.mean()), "lo": float("nan"), "hi": float("nan"),
            "n": int(min(a.size, b.size)), "signed": True}
  d, lo, hi = stats.diff_interval(a, b, level=level, method="welch")
  return {"mean": float(d), "lo": float(lo), "hi": float(hi), "n": int(min(a.size, b.size)),
          "signed": True}
