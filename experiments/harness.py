"""The one skeleton of every paper table: claims as data judged by ``rlpost.eval.stats`` (the
protocol of experiments/STATISTICS.md), and the run that produces their per-seed values.

Running (``Experiment``, ``run``, ``rejudge``): a table is plain functions of plain data. Its
units are cached by the digest of their spec, so a rerun computes only the missing ones;
``results.json`` keeps the config, the machine, and every per-seed value and evaluation point;
``rejudge`` re-judges it without training; ``experiments/docsync.py`` copies ``table.md`` into
the README and the module docstring.

Judging:

A paper table pre-declares its claims (protocol v2 of experiments/STATISTICS.md): which metric,
which two arms, the claimed direction, the threshold (``margin``), the smallest effect of interest
(``sesoi``), the commit that declared it, whether it is exploratory, and the family (the claims of
one paper) whose p-values are Holm-adjusted together. ``judge_family`` turns per-seed values into
one of five outcomes (``OUTCOMES``), with d the difference a - b beyond the threshold, signed in
the claimed direction:

* a directional claim ("a beats b"): the Welch interval of d and the one-sided Welch test of
  H0: d <= 0. *reproduced* when the Holm-adjusted p is at most ``alpha`` (different from 0) and d
  is not equivalent to 0 within +-sesoi (TOST at ``alpha``: its 90% interval inside);
  *trivial* when it is different from 0 but equivalent to 0 (real, too small to matter);
  *not reproduced* when it is equivalent to 0 but not different from it, or its interval lies
  wholly below 0; *inconclusive* otherwise. With sesoi 0 nothing is equivalent to 0, so there is no
  *trivial* outcome (a threshold claim whose threshold is itself the effect of interest);
* a non-superiority claim ("no gain", direction ``"not_greater"``): the one-sided test of
  H0: d >= sesoi. *reproduced* when it rejects (Holm-adjusted); *not reproduced* when the 95%
  interval lies wholly above +sesoi (a gain of at least the SESOI); *inconclusive* otherwise;
* an equivalence claim ("within ``margin``"): TOST. *reproduced* when both one-sided tests reject
  at ``alpha`` (Holm-adjusted); *not reproduced* when its 90% interval lies wholly outside
  (-margin, +margin); *inconclusive* otherwise;
* *not testable*: a rule an oracle cannot be shown to meet at the seeds run (set by the table that
  has the oracle's values).

A non-superiority or equivalence claim that holds while d is significantly different from 0 (95%
interval excluding 0) says so in ``Verdict.note``. A permutation test of the same difference is
reported beside each (distribution-free; at 3-4 seeds per arm its smallest attainable p, 1/20 or
1/70, is too coarse to carry a Holm-corrected decision).

A claim about pooled rates rather than per-seed values (e.g. "fewer opposite-sign advantages",
counted over many rollouts) is judged by ``judge_proportions``: a two-proportion z-test.

Each verdict carries the minimum detectable effect of the run (80% power at the arms' pooled SD
and seed count), to report what an inconclusive claim could have detected.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import platform
import subprocess
import time
from typing import Callable, Mapping, Sequence

import numpy as np
from scipy.stats import binom
from scipy.stats import norm as normal

from rlpost import progress as progress_lib
from rlpost.eval import stats

DIRECTIONS = ("greater", "less", "equivalent", "not_greater")
REPRODUCED, TRIVIAL, NOT_REPRODUCED, INCONCLUSIVE = ("reproduced", "trivial", "not reproduced",
                                                     "inconclusive")
NOT_TESTABLE = "not testable"
OUTCOMES = (REPRODUCED, TRIVIAL, NOT_REPRODUCED, INCONCLUSIVE, NOT_TESTABLE)


@dataclasses.dataclass(frozen=True)
class Claim:
  """One pre-declared claim.

  Attributes:
    id: a short key (``"median_beats_mean"``).
    text: the paper's claim in words.
    metric: the name of the per-seed metric compared.
    arms: (a, b): the claim is about mean(a) - mean(b); or (a,): a one-sample claim about
      mean(a) - ``center`` (e.g. "Spearman above 0.5": center 0.5), judged as a paired claim
      against a constant arm.
    direction: "greater" (a - b > margin), "less" (a - b < -margin), "equivalent"
      (|a - b| < margin) or "not_greater" (no gain: a - b < +sesoi).
    margin: the threshold a directional claim is tested against (usually 0; > 0 for
      "equivalent", where it is the equivalence margin).
    family: claims of one family are Holm-adjusted together.
    paired: the arms' values pair up seed by seed (two policies of the same run, e.g. an
      averaged and the raw checkpoint): paired t interval and test on the per-seed differences.
    sesoi: the smallest effect of interest (beyond the threshold), normally the design's minimum
      effect; 0 when the threshold is itself the effect of interest. Required (> 0) for
      "not_greater".
    declared: the commit that declared the claim (before the run that judges it, unless
      ``exploratory``).
    exploratory: declared after seeing the results that motivated it: reported in its own
      family, never in a table's headline.
  """

  id: str
  text: str
  metric: str
  arms: tuple[str, str]
  direction: str = "greater"
  margin: float = 0.0
  family: str = ""
  paired: bool = False
  center: float = 0.0
  sesoi: float = 0.0
  declared: str = ""
  exploratory: bool = False

  def __post_init__(self):
    if len(self.arms) not in (1, 2):
      raise ValueError(f"claim {self.id!r}: arms must be (a, b) or (a,), got {self.arms}")
    if self.direction not in DIRECTIONS:
      raise ValueError(f"claim {self.id!r}: direction must be one of {DIRECTIONS}, "
                       f"got {self.direction!r}")
    if self.margin < 0 or (self.direction == "equivalent" and self.margin <= 0):
      raise ValueError(f"claim {self.id!r}: margin must be >= 0 (> 0 for an equivalence claim), "
                       f"got {self.margin}")
    if not self.sesoi >= 0 or (self.direction == "not_greater" and self.sesoi <= 0):
      raise ValueError(f"claim {self.id!r}: sesoi must be >= 0 (> 0 for a no-gain claim), got "
                       f"{self.sesoi}")


@dataclasses.dataclass(frozen=True)
class Verdict:
  """A judged claim: the difference a - b with its interval (Welch at ``level``; for an
  equivalence claim the TOST interval at 1 - 2 alpha), the deciding test's raw and Holm-adjusted
  p-values, the permutation test's p-value (two-sided for an equivalence claim), the verdict, the
  seed counts, the seed SD (pooled over arms; of the differences when paired) and the minimum
  detectable effect; ``note`` flags an equivalence claim (any verdict) or a holding no-gain claim
  whose difference is significantly non-zero, and a verdict decided by a bound within half a minimum detectable effect
  of its threshold ("near its threshold": another start or seed set can flip it);
  ``p_equivalent`` is the TOST p of a directional claim against +-sesoi (None without a sesoi);
  ``values`` the per-seed values judged, (a, b) (b the centre repeated for a one-sample claim),
  which a replication compares with its own."""

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
  sd: float = float("nan")
  note: str = ""
  p_equivalent: float | None = None
  values: tuple = ()

  def to_json(self) -> dict:
    return dict(dataclasses.asdict(self), claim=dataclasses.asdict(self.claim))


def _raw(claim: Claim, a: np.ndarray, b: np.ndarray, level: float, n_resamples: int) -> dict:
  """The claim's numbers before the family's correction."""
  paired = claim.paired or len(claim.arms) == 1
  t_name = "paired t" if paired else "Welch"
  diff, lo95, hi95 = stats.diff_interval(a, b, level=level, paired=paired,
                                         method="t" if paired else "welch")
  _, lo90, hi90 = stats.diff_interval(a, b, level=1 - 2 * (1 - level), paired=paired,
                                      method="t" if paired else "welch")
  out = dict(diff=float(np.mean(a) - np.mean(b)), lo95=lo95, hi95=hi95, lo90=lo90, hi90=hi90,
             p_eq=float("nan"))
  if claim.direction == "equivalent":
    p, lo, hi = stats.tost(a, b, claim.margin, level=level, paired=paired)
    p_perm = stats.permutation_test(a, b, paired=paired, n_resamples=n_resamples)
    return dict(out, lo=lo, hi=hi, p=p, p_perm=p_perm,
                method=f"TOST ({t_name}), margin {claim.margin:g}")
  if claim.direction == "not_greater":
    p = stats.t_test(a - claim.sesoi, b, paired=paired, alternative="less")
    p_perm = stats.permutation_test(a - claim.sesoi, b, paired=paired, alternative="less",
                                    n_resamples=n_resamples)
    return dict(out, lo=lo95, hi=hi95, p=p, p_perm=p_perm,
                method=f"{t_name} interval and one-sided {t_name} test against +sesoi")
  alternative = "greater" if claim.direction == "greater" else "less"
  shift = claim.margin if claim.direction == "greater" else -claim.margin
  p = stats.t_test(a - shift, b, paired=paired, alternative=alternative)
  p_perm = stats.permutation_test(a, b, paired=paired, alternative=alternative,
                                  n_resamples=n_resamples)
  if claim.sesoi > 0:
    out["p_eq"] = stats.tost(a - shift, b, claim.sesoi, level=level, paired=paired)[0]
  return dict(out, lo=lo95, hi=hi95, p=p, p_perm=p_perm,
              method=f"{t_name} interval and one-sided {t_name} test")


def decide(claim: Claim, lo: float, hi: float, p_holm: float, alpha: float,
           p_equivalent: float = float("nan")) -> str:
  """The outcome of ``claim`` from its interval (95%; the TOST interval for "equivalent"), its
  Holm-adjusted p and, for a directional claim with a sesoi, the TOST p of equivalence to the
  threshold within +-sesoi (the rules of this module's docstring)."""
  m = claim.margin
  if claim.direction == "equivalent":
    if p_holm <= alpha:
      return REPRODUCED
    if lo >= m or hi <= -m:
      return NOT_REPRODUCED
    return INCONCLUSIVE
  if claim.direction == "not_greater":
    if p_holm <= alpha:
      return REPRODUCED
    if lo > claim.sesoi:  # a gain of at least the SESOI
      return NOT_REPRODUCED
    return INCONCLUSIVE
  if claim.direction == "less":
    lo, hi = -hi, -lo
  return stats.outcome(lo - m, hi - m, p_holm,
                       p_equivalent if claim.sesoi > 0 else float("nan"), alpha)


def _decisive_distance(claim: Claim, verdict: str, r: Mapping) -> float:
  """How far the bounds that decided ``verdict`` lie from the thresholds they were compared with,
  the nearest of them (NaN for an inconclusive verdict). Directional claims are measured in the
  claimed direction beyond their threshold: the one-sided bound (the 90% interval's end) against
  0 for "different from 0", its ends against +-sesoi for "equivalent to 0", the 95% upper bound
  against 0 for "wholly below"."""
  m, s = claim.margin, claim.sesoi
  if claim.direction in ("greater", "less"):
    sign = 1.0 if claim.direction == "greater" else -1.0
    lo90, hi90 = sorted((sign * r["lo90"] - m, sign * r["hi90"] - m))
    hi95 = max(sign * r["lo95"], sign * r["hi95"]) - m
    equiv = min(s - hi90, lo90 + s) if s > 0 else float("inf")
    if verdict == REPRODUCED:
      return min(lo90, -equiv if s > 0 else float("inf"))
    if verdict == TRIVIAL:
      return min(lo90, equiv)
    if verdict == NOT_REPRODUCED:
      return -hi95 if hi95 < 0 else equiv
    return float("nan")
  if claim.direction == "equivalent":
    if verdict == REPRODUCED:
      return min(m - r["hi90"], r["lo90"] + m)
    if verdict == NOT_REPRODUCED:
      return max(r["lo90"] - m, -m - r["hi90"])
    return float("nan")
  if verdict == REPRODUCED:  # no gain: the one-sided upper bound below +sesoi
    return s - r["hi90"]
  if verdict == NOT_REPRODUCED:
    return r["lo95"] - s
  return float("nan")


def _near(claim: Claim, verdict: str, r: Mapping, mde: float, digits: int = 3) -> str:
  """A verdict decided by a bound within half a minimum detectable effect of its threshold: on
  another start or seed set it can flip."""
  d = _decisive_distance(claim, verdict, r)
  if not (math.isfinite(d) and mde > 0 and d < mde / 2):
    return ""
  return (f"near its threshold (the deciding bound is {d:.{digits}f} from it, under half the "
          f"minimum detectable effect {mde:.{digits}f})")


def _note(claim: Claim, verdict: str, lo95: float, hi95: float, digits: int = 3) -> str:
  """An equivalence claim (whatever its verdict) or a holding no-gain claim whose difference is
  significantly non-zero."""
  if not (claim.direction == "equivalent"
          or (claim.direction == "not_greater" and verdict == REPRODUCED)):
    return ""
  if not (lo95 > 0 or hi95 < 0):
    return ""
  side = "above" if lo95 > 0 else "below"
  return (f"but a - b is significantly {side} 0 (95% interval [{lo95:+.{digits}f}, "
          f"{hi95:+.{digits}f}])")


def judge_family(claims: Sequence[Claim], values: Mapping[str, Mapping[str, Sequence[float]]], *,
                 level: float = 0.95, n_resamples: int = 10000, table: str = "") -> list[Verdict]:
  """Verdicts of ``claims``; ``values[metric][arm]`` are per-seed values (1-D, >= 2 seeds).

  p-values are Holm-adjusted within each ``Claim.family``, the exploratory claims of a family
  apart from its pre-declared ones (claims declared after the run that motivated them never
  share a correction with those declared before); a test rejects when p <= alpha = 1 - level (an
  exact permutation test then has size alpha). ``table`` names the table whose declarations
  (experiments/declared.json) mark the exploratory claims.
  """
  if table:
    claims = [dataclasses.replace(c, exploratory=bool((declaration(table, c.id) or {}).get(
        "exploratory", c.exploratory))) for c in claims]
  alpha = round(1.0 - level, 12)
  raw = []
  for c in claims:
    try:
      a = np.asarray(values[c.metric][c.arms[0]], np.float64)
      b = (np.asarray(values[c.metric][c.arms[1]], np.float64) if len(c.arms) == 2
           else np.full_like(a, c.center))
    except KeyError as e:
      raise KeyError(f"claim {c.id!r}: no per-seed values for {e}") from None
    r = _raw(c, a, b, level, n_resamples)
    r["p"] = 1.0 if math.isnan(r["p"]) else r["p"]  # no spread and no difference: nothing to reject
    raw.append((c, a, b, r))
  adjusted = [0.0] * len(raw)
  for fam in dict.fromkeys((c.family, c.exploratory) for c in claims):
    idx = [i for i, c in enumerate(claims) if (c.family, c.exploratory) == fam]
    for i, p in zip(idx, stats.holm([raw[i][3]["p"] for i in idx])):
      adjusted[i] = float(p)
  out = []
  for (c, a, b, r), p_holm in zip(raw, adjusted):
    diff, lo, hi, p, p_perm, method = (r[k] for k in ("diff", "lo", "hi", "p", "p_perm",
                                                       "method"))
    n = min(len(a), len(b))
    if c.paired or len(c.arms) == 1:  # one sample of differences: the two-sample MDE at sd / sqrt(2) has the same
      # noncentrality (df 2n - 2 rather than n - 1, so slightly optimistic at few seeds)
      sd = float(np.std(a - b, ddof=1))
      mde = stats.min_detectable_effect(sd / math.sqrt(2), n) if sd > 0 else 0.0
    else:
      sd = math.sqrt((np.var(a, ddof=1) + np.var(b, ddof=1)) / 2)
      mde = stats.min_detectable_effect(sd, n) if sd > 0 else 0.0
    verdict = decide(c, lo, hi, p_holm, alpha, r["p_eq"])
    note = "; ".join(x for x in (_note(c, verdict, r["lo95"], r["hi95"]),
                                 _near(c, verdict, r, mde)) if x)
    out.append(Verdict(c, float(diff), float(lo), float(hi), float(p), p_holm, float(p_perm),
                       verdict, (len(a), len(b)), float(mde), method, float(sd),
                       note, None if math.isnan(r["p_eq"]) else float(r["p_eq"]),
                       (tuple(map(float, a)), tuple(map(float, b)))))
  return out


GATE = "testbed"
NOT_JUDGED = "not judged (gate failed)"


def judge_gated(claims: Sequence[Claim], values: Mapping[str, Mapping[str, Sequence[float]]],
                *, start: float, table: str = "") -> tuple[list[Verdict], bool]:
  """Verdicts of a table whose base method must learn first: the one-sample claims of family
  ``GATE`` ("the base gains over its start") are judged against ``start`` as their own Holm
  family, the other claims as theirs (``judge_family`` with ``table``). When a gate claim is not
  reproduced, the other claims' verdicts are ``NOT_JUDGED`` (their numbers are kept). Returns
  (verdicts in claim order, whether every gate claim was reproduced)."""
  gate = [dataclasses.replace(c, center=start) for c in claims if c.family == GATE]
  judged = judge_family(gate, values, table=table) + judge_family(
      [c for c in claims if c.family != GATE], values, table=table)
  order = {c.id: i for i, c in enumerate(claims)}
  judged.sort(key=lambda v: order[v.claim.id])
  passed = all(v.verdict == "reproduced" for v in judged if v.claim.family == GATE)
  if not passed:  # the numbers stay; no verdict is drawn from a base that did not learn
    judged = [v if v.claim.family == GATE else dataclasses.replace(v, verdict=NOT_JUDGED)
              for v in judged]
  return judged, passed


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
  if claim.direction not in ("greater", "less"):
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
          "verdict": decide(claim, lo, hi, p, round(1.0 - level, 12)), "n": (int(na), int(nb)),
          "method": "two-proportion z-test (unpooled), trials treated as independent"}


def verdict_rows(verdicts: Sequence[Verdict], digits: int = 3) -> list[str]:
  """Markdown table rows: claim | a - b [interval] | smallest effect of interest | p (Holm) |
  permutation p | seeds | minimum detectable effect | declared in | verdict (``Verdict`` objects
  or their ``to_json`` dicts; results judged before protocol v2 have no sesoi or declaring
  commit, shown as "-")."""
  rows = ["| claim (paper) | ours: a - b [interval] | SESOI | p (Holm) | permutation p | seeds | "
          "min. detectable | declared | verdict |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for v in verdicts:
    v = v if isinstance(v, dict) else v.to_json()
    c = v["claim"]
    one = len(c["arms"]) == 1
    label = f"{c['arms'][0]} - {c.get('center', 0.0):g}" if one else c["arms"][0]
    seeds = f"{v['n'][0]}" if one else f"{v['n'][0]} vs {v['n'][1]}"
    verdict = v["verdict"] + (f"; {v['note']}" if v.get("note") else "")
    rows.append(f"| {c['text']} | {label}: {v['diff']:+.{digits}f} "
                f"[{v['lo']:+.{digits}f}, {v['hi']:+.{digits}f}] | {sesoi_text(c)} | {v['p']:.3g} "
                f"({v['p_holm']:.3g}) | {v['p_permutation']:.3g} | {seeds} | "
                f"{v['mde']:.{digits}f} | {declared_text(c)} | {verdict} |")
  return rows


def sesoi_text(claim: Mapping) -> str:
  """A claim's smallest effect of interest for a table cell: +-margin for an equivalence claim,
  "-" when not recorded (judged before protocol v2)."""
  if claim.get("direction") == "equivalent":
    return f"+-{claim['margin']:g}"
  sesoi = claim.get("sesoi")
  return f"{sesoi:g}" if sesoi else "-" if sesoi is None else "0"


def declared_text(claim: Mapping) -> str:
  """A claim's declaring commit for a table cell ("-" when not recorded), marked exploratory."""
  return (claim.get("declared") or "-") + (" (exploratory)" if claim.get("exploratory") else "")


def rules_note(verdicts: Sequence[Verdict | dict], level: float = 0.95) -> str:
  """The decision rules of the judged claims, in words, for a table."""
  vs = [v if isinstance(v, dict) else v.to_json() for v in verdicts]
  alpha = 1 - level
  out = []
  directional = [v["claim"] for v in vs if v["claim"]["direction"] in ("greater", "less")]
  if directional:
    out.append(f"a directional claim is *reproduced* when its Holm-adjusted one-sided p is <= "
               f"{alpha:.2g} and it is not "
               "equivalent to the threshold within +-SESOI (TOST, "
               f"{1 - 2 * alpha:.0%} interval), *trivial* when it is significant but equivalent "
               "(too small to matter), *not reproduced* when it is equivalent but not "
               "significant or its interval lies wholly on the other side, *inconclusive* "
               "otherwise (SESOI 0: the threshold is itself the effect of interest, no "
               "*trivial* outcome)")
  if any(v["claim"]["direction"] == "not_greater" for v in vs):
    out.append(f"a no-gain claim is *reproduced* when the one-sided test that a - b < +SESOI "
               f"rejects (Holm-adjusted), *not reproduced* when its {level:.0%} interval lies "
               "wholly above +SESOI, *inconclusive* otherwise")
  equivalent = sorted({v["claim"]["margin"] for v in vs
                       if v["claim"]["direction"] == "equivalent"})
  if equivalent:
    m = "/".join(f"{x:g}" for x in equivalent)
    out.append(f"an equivalence claim (margin {m}) is *reproduced* when TOST rejects "
               f"(Holm-adjusted), *not reproduced* when its {1 - 2 * alpha:.0%} interval lies "
               "wholly outside the margin, *inconclusive* otherwise")
  if not out:
    return ""
  return ("Rules (protocol v2, experiments/STATISTICS.md; `experiments/harness.py`): "
          + "; ".join(out) + ". An equivalence claim whose difference is significantly "
          "non-zero (95% interval), whatever its verdict, and a holding no-gain claim whose "
          "difference is, say so beside the verdict, and so does a verdict whose deciding "
          "bound lies within half a minimum detectable effect of its threshold (near its "
          "threshold: it can flip on another start or seed set). The permutation p (not adjusted) "
          "is reported beside the deciding test. Min. detectable: the difference a two-sided "
          "test at 80% power would find at these seeds and this seed SD. Declared: the commit "
          "that declared the claim; exploratory claims were declared after the run that "
          "motivated them and are kept out of the headline.")


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


def pooled_sd(verdicts: Sequence[Verdict | dict]) -> float:
  """The largest pooled seed SD among ``verdicts`` (the pilot SD a table reports)."""
  sds = [(v if isinstance(v, dict) else v.to_json())["sd"] for v in verdicts]
  return max(sds) if sds else float("nan")


def protocol_note(verdicts: Sequence[Verdict | dict], level: float = 0.95) -> str:
  """One paragraph for a table: the interval method, the seed counts, the pooled seed SD and the
  minimum detectable effect of the judged claims."""
  vs = [v if isinstance(v, dict) else v.to_json() for v in verdicts]
  if not vs:
    return ""
  seeds = sorted({n for v in vs for n in v["n"]})
  methods = sorted({v["method"] for v in vs})
  mdes = [v["mde"] for v in vs]
  return (f"Statistics: {'; '.join(methods)} at {level:.0%}, Holm-adjusted within each family; "
          f"{'/'.join(str(s) for s in seeds)} seeds per arm; pooled seed SD up to "
          f"{pooled_sd(vs):.3g}; minimum detectable effect (80% power) "
          f"{min(mdes):.3g}-{max(mdes):.3g}.")


def seeds_note(sz, from_power: int) -> str:
  """The table header's seed sentence for a design ``sz`` with ``seeds``, ``pilot_sd``,
  ``min_effect`` and ``min_seeds`` (and ``sd_source`` when the SD is not the CPU pilot's): the
  seeds run and the count the power analysis asked for, and a warning when fewer ran."""
  source = getattr(sz, "sd_source", "")
  sd = f"SD {sz.pilot_sd} ({source})" if source else f"pilot SD {sz.pilot_sd}"
  short = (f"; UNDERPOWERED: {sz.seeds} < {from_power} seeds, judged under "
           "--allow-underpowered" if source and sz.seeds < from_power else "")
  return (f"{sz.seeds} seeds per arm ({from_power} from power: {sd}, minimum "
          f"effect {sz.min_effect}, 80% power, alpha 0.05; floor {sz.min_seeds}{short})")


def power_plan(config: Mapping) -> int:
  """Seeds per arm a design's power plan asks for (its ``pilot_sd``, ``min_effect`` and
  ``min_seeds``): the SESOI found with 80% power at alpha 0.05, two-sided."""
  from rlpost.eval import stats

  return max(int(config["min_seeds"]),
             stats.seeds_needed(float(config["pilot_sd"]), float(config["min_effect"])))


def wall_time(report: Mapping) -> str:
  """The table header's wall-time sentence: the units' training and evaluation time, or, for
  full-size runs, that the run directories do not record it."""
  if report.get("unit_seconds") is None:
    return "Wall time: not recorded in the full-size run directories."
  return (f"Wall time: {report['unit_seconds'] / 60:.1f} min of training and evaluation over "
          f"all arms (this invocation {report['seconds'] / 60:.1f} min; cached arms are not "
          f"rerun). {provenance_note(report)}")


def provenance_note(report: Mapping) -> str:
  """Where a table's numbers come from: the machine, the commit and the start."""
  m = report.get("machine") or {}
  commit = m.get("commit") or "?"
  if m.get("dirty"):
    commit += " with uncommitted changes"
  beds = report.get("testbeds")
  if beds:
    start = "the pinned testbed " + ", ".join(beds) + " (experiments/testbeds)"
  elif beds is None:
    start = "an SFT start retrained on that machine (results older than pinned testbeds)"
  else:
    start = "starts made within the run (nothing pinned: seeded initialisation, generated data)"
  return f"Run on {machine_text(m)} at commit {commit}, from {start}."


def machine_text(machine: Mapping | None) -> str:
  """'AMD EPYC 7B13, 2 CPU cores, jax 0.10.2 on cpu' from a results.json ``machine`` record."""
  if not machine or machine.get("recorded") is False:
    return "a machine not recorded"
  jax_version = machine.get("versions", {}).get("jax", "?")
  cpu = machine.get("cpu_model") or f"{machine.get('processor', '?')} (CPU model not recorded)"
  isa = isa_text(machine.get("cpu_isa"))
  cpu += f" ({isa})" if isa else ""
  return (f"{cpu}, {machine.get('cpus', '?')} CPU cores, jax {jax_version} on "
          f"{machine.get('platform', '?')}")


def minutes(seconds: float | None) -> str:
  return "-" if seconds is None or not math.isfinite(seconds) else f"{seconds / 60:.1f}"


def fmt(c: Mapping | None, digits: int = 3) -> str:
  """A ``cell``/``diff_cell`` as '0.123 [0.100, 0.140]' ('+' signs for a difference; the mean
  alone without an interval)."""
  if c is None:
    return "—"
  lo = c.get("lo")
  if lo is None or (isinstance(lo, float) and math.isnan(lo)):
    return f"{c['mean']:.{digits}f}"
  sign = "+" if c.get("signed") else ""
  return (f"{c['mean']:{sign}.{digits}f} [{c['lo']:{sign}.{digits}f}, "
          f"{c['hi']:{sign}.{digits}f}]")


def errorbars(ax, x: Sequence[float], cells: Sequence[Mapping], **kw):
  """Plot per-seed ``cell``s (mean and interval) against ``x`` with error bars; a cell without an
  interval (one seed) is drawn as a point."""
  m = np.array([c["mean"] for c in cells], np.float64)
  lo = np.array([c["lo"] if c.get("lo") is not None else np.nan for c in cells], np.float64)
  hi = np.array([c["hi"] if c.get("hi") is not None else np.nan for c in cells], np.float64)
  err = np.stack([np.nan_to_num(m - lo), np.nan_to_num(hi - m)])
  kw.setdefault("marker", "o")
  kw.setdefault("capsize", 3)
  return ax.errorbar(np.asarray(x), m, yerr=err, **kw)


# --------------------------------------------------------------------- running an experiment
@dataclasses.dataclass(frozen=True)
class Unit:
  """An independent, cacheable piece of an experiment (one arm's seed block, one system x seed).

  Attributes:
    spec: plain data that determines the result; its digest is the cache key, so a unit reruns
      exactly when its spec changes.
    run: ``run(progress)`` computes the result, calling ``progress(n)`` as it advances by ``n`` of
      ``weight``. The result is a dict of JSON values and, at its top level, numpy arrays (stored
      beside the JSON in an ``.npz``).
    weight: the unit's share of the progress bar (e.g. its training steps).
    code: source files the unit runs besides the ``rlpost`` package, the file that defines
      ``run`` and the repository modules those import (all always counted): their content is part
      of the unit's cache key (``code_version``), so a unit reruns when the code it runs changes.
  """

  spec: Mapping
  run: Callable[[Callable[[int], None]], dict]
  weight: int = 1
  code: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Experiment:
  """A paper table as plain functions of plain data.

  Attributes:
    name: the key of ``scripts/reproduce.py`` and of ``results/<name>``.
    get_config: ``get_config(quick) -> dict`` (big_vision style): seeds, sizes, arms; the key
      ``"seeds"`` is the seed count ``--seeds`` overrides.
    units: ``units(config) -> {unit id: Unit}``.
    summarize: ``summarize(results) -> dict``: per-seed values, judged claims, sanity checks, from
      ``results["config"]`` and ``results["data"]`` alone (so ``--rejudge`` needs no training).
    render: ``render(results) -> str``: ``table.md``; its "## Paper claims" section is what the
      docs carry.
    plot: ``plot(results, out_dir) -> [paths]`` (from ``results`` alone, error bars over seeds).
    collect: ``collect(config, units) -> data``: what ``results.json`` keeps of the unit results
      (every per-seed value and evaluation point); default: the units' JSON parts.
    module: the module whose docstring ends with the generated results block (docsync).
    readme: the README holding the generated results between ``docsync`` markers.
    full: ``full(runs_dir, prefix) -> (config, data)``: the full-size runs under ``runs_dir``
      (``collect_runs`` over the ``experiments/*/full.py`` arms whose names start with
      ``prefix``) as the config and data ``summarize`` reads (``reproduce.py --full``).
    replicate: ``replicate(config, seeds, seed_offset) -> config``: the committed design reduced
      to its main arms, run with ``seeds`` fresh seeds starting at ``seed_offset``
      (``reproduce.py --replicate``).
    pinned: whether the table's units start from a pinned testbed (a trained start or a
      dataset); a replication of such a table runs from the committed table's testbeds. A table
      with nothing to pin (models trained from their seeded initialisation on data it generates
      from fixed seeds) sets False.
    starts: ``starts(report) -> {arm: (arm config, step-0 evaluation)}`` for the step-0 guard
      (``check_same_start``), for a table whose data do not keep the ``rl_seeds.run_arm`` layout
      the guard finds by itself.
    replicate_own: a table's own replication, for a design ``replicate`` cannot express (a seed
      count chosen by a pilot's power plan, a pilot's seed ids to avoid):
      ``replicate_own(out_dir, seeds, seed_offset, no_progress, rejudge) -> dict`` (what
      ``replicate`` returns; ``rejudge``: re-judge the replication in ``out_dir`` without
      running); ``reproduce.py --replicate`` calls it in place of ``replicate``.
  """

  name: str
  get_config: Callable[[bool], dict]
  units: Callable[[dict], Mapping[str, Unit]]
  summarize: Callable[[dict], dict]
  render: Callable[[dict], str]
  plot: Callable[[dict, str], list] = lambda results, out_dir: []
  collect: Callable[[dict, Mapping[str, dict]], dict] | None = None
  module: str = ""
  readme: str = ""
  full: Callable[[str, str], tuple[dict, dict]] | None = None
  replicate: Callable[[dict, int, int], dict] | None = None
  pinned: bool = True
  starts: Callable[[dict], Mapping[str, tuple]] | None = None
  replicate_own: Callable[[str, int | None, int, bool, bool], dict] | None = None


def digest(spec: Mapping) -> str:
  """A short stable hash of plain data (the cache key of a unit)."""
  blob = json.dumps(spec, sort_keys=True, default=str)
  return hashlib.sha256(blob.encode()).hexdigest()[:16]


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sources(path: str) -> list[str]:
  if os.path.isfile(path):
    return [path]
  return sorted(os.path.join(d, f) for d, _, files in os.walk(path) for f in files
                if f.endswith(".py"))


def code_version(unit: "Unit") -> str:
  """A digest of the source the unit runs: every ``.py`` file of the ``rlpost`` package, the file
  defining ``unit.run`` and ``unit.code``, and every repository module those import (at module
  level or inside functions, transitively: a table's runner, config and helpers), by their code
  (paths relative to the repository; docstrings and comments left out, so regenerated docs do not
  invalidate a cache)."""
  import inspect

  files = _sources(os.path.join(_ROOT, "rlpost"))
  try:
    files += _sources(inspect.getsourcefile(unit.run) or "")
  except TypeError:  # a builtin or functools.partial of one: nothing more to count
    pass
  files += [f for c in unit.code for f in _sources(os.path.join(_ROOT, c) if not os.path.isabs(c)
                                                    else c)]
  files = _import_closure(files)
  h = hashlib.sha256()
  for f in sorted(set(os.path.abspath(f) for f in files)):
    h.update(os.path.relpath(f, _ROOT).encode() + b"\0")
    h.update(hashlib.sha256(_code_text(f).encode()).digest())
  return h.hexdigest()[:16]


def _module_file(module: str) -> str | None:
  """The repository file of a dotted module name (a package's ``__init__.py``), or None for a
  module outside the repository."""
  base = os.path.join(_ROOT, *module.split("."))
  for path in (base + ".py", os.path.join(base, "__init__.py")):
    if os.path.isfile(path):
      return path
  return None


def _imports(path: str) -> list[str]:
  """The repository files ``path`` imports anywhere in its code (``import a.b``, ``from a import
  b`` where ``b`` is a module or a name of ``a``, and relative imports), with the packages on the
  way (their ``__init__.py`` runs on import)."""
  import ast

  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), filename=path)
  rel = os.path.relpath(path, _ROOT)
  package = None if rel.startswith("..") else os.path.dirname(rel).replace(os.sep, ".")
  names = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names += [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      if node.level and package is None:  # a file outside the repository
        continue
      if node.level:
        parts = package.split(".") if package else []
        parts = parts[:len(parts) - (node.level - 1)] if node.level > 1 else parts
        base = ".".join(parts + ([node.module] if node.module else []))
      else:
        base = node.module or ""
      names += [base] + [f"{base}.{a.name}" for a in node.names]
  out = []
  for name in names:
    parts = name.split(".")
    for i in range(1, len(parts) + 1):  # every package on the way, then the module itself
      f = _module_file(".".join(parts[:i]))
      if f:
        out.append(f)
  return out


def _import_closure(files: Sequence[str]) -> list[str]:
  """``files`` and every repository file they import, transitively."""
  seen, todo = set(), [os.path.abspath(f) for f in files]
  while todo:
    f = todo.pop()
    if f in seen or not f.endswith(".py"):
      continue
    seen.add(f)
    todo += [os.path.abspath(g) for g in _imports(f) if os.path.abspath(g) not in seen]
  return sorted(seen)


def _code_text(path: str) -> str:
  """A source file as its syntax tree without docstrings (comments and layout do not reach the
  tree): what the code does, not the results blocks that docsync writes into docstrings."""
  import ast

  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), filename=path)
  for node in ast.walk(tree):
    body = getattr(node, "body", None)
    if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)):
      node.body = body[1:] or [ast.Pass()]
  return ast.dump(tree)


def unit_key(unit: "Unit") -> dict:
  """What a unit's cache entry is keyed by: its spec and the version of its code."""
  return {"spec": unit.spec, "code": code_version(unit)}


def testbeds_in(tree) -> list[str]:
  """The testbed digests anywhere in ``tree``: pinned files (``rlpost.train.pinned``) named by
  ``init_params`` (a start) or ``testbed`` (a dataset) keys."""
  from rlpost.train import pinned

  return sorted({pinned.parse_name(m[k])[1] for m in mappings(tree)
                 for k in ("init_params", "testbed") if isinstance(m.get(k), str) and m[k]})


def check_one_testbed(specs, desc: str) -> None:
  """Raises ``MixedStarts`` when ``specs`` start from two pinned policies (``init_params``), or
  read two pinned datasets (``testbed``) of one ``system``: a table compares its units from one
  start, and each system's units on one dataset."""
  from rlpost.train import pinned

  starts = sorted({pinned.parse_name(m["init_params"])[1] for m in mappings(specs)
                   if isinstance(m.get("init_params"), str) and m["init_params"]})
  if len(starts) > 1:
    raise MixedStarts(f"the units of {desc} start from {len(starts)} testbeds "
                      f"({', '.join(starts)}); a table starts from one")
  data: dict[str, set] = {}
  for m in mappings(specs):
    if isinstance(m.get("testbed"), str) and m["testbed"]:
      data.setdefault(str(m.get("system", "")), set()).add(pinned.parse_name(m["testbed"])[1])
  for system, files in sorted(data.items()):
    if len(files) > 1:
      raise MixedStarts(f"the units of {desc} read {len(files)} pinned datasets of system "
                        f"{system!r} ({', '.join(sorted(files))}); a system's units read one")


def mappings(tree):
  """Every mapping in a tree of mappings and lists (``tree`` itself first), depth first."""
  if isinstance(tree, Mapping):
    yield tree
    for v in tree.values():
      yield from mappings(v)
  elif isinstance(tree, (list, tuple)):
    for v in tree:
      yield from mappings(v)


class MixedStarts(ValueError):
  """Arms of one table that did not start from the same policy (named in the message)."""


# RLConfig keys that decide a step-0 evaluation besides the start: arms that agree on these (and on
# the start) must report the same step-0 evaluation.
_EVAL_KEYS = ("task", "task_spec", "num_train", "num_test", "data_seed", "graded_reward",
              "prompt_template", "max_prompt_tokens", "eval_problems", "eval_samples",
              "temperature", "top_p", "max_new_tokens", "model", "model_seed", "sft_steps",
              "sft_lr", "sft_batch_size", "policy")


def _arm_starts(tree, path: str = "") -> dict:
  """{path: (arm config, step-0 evaluation)} of every trained arm (``rl_seeds.run_arm`` layout)
  in ``tree``."""
  out = {}
  if isinstance(tree, Mapping):
    evals = tree.get("evals")
    if (isinstance(evals, list) and evals and isinstance(evals[0], Mapping)
        and evals[0].get("step") == 0 and isinstance(tree.get("config"), Mapping)):
      out[path or "/"] = (tree["config"], evals[0]["per_seed"][0])
    else:
      for k, v in tree.items():
        out.update(_arm_starts(v, f"{path}/{k}"))
  return out


def check_same_start(data, starts: Mapping[str, tuple] | None = None) -> None:
  """Refuse a table whose arms started from different policies: arms that share a testbed
  (``init_params``) and their evaluation settings must report bitwise-equal step-0 evaluations
  (one program on one machine gives exactly that; units cached on two machines or from two
  starts do not). The arms are ``starts`` ({arm: (config, step-0 evaluation)}) when given, else
  those of ``data`` in the ``rl_seeds.run_arm`` layout. Raises ``MixedStarts`` naming the two
  arms and the metric."""
  groups: dict[str, tuple[str, Mapping]] = {}
  for path, (cfg, ev) in (_arm_starts(data) if starts is None else starts).items():
    key = json.dumps({k: cfg.get(k) for k in _EVAL_KEYS + ("init_params",)}, sort_keys=True,
                     default=str)
    if key not in groups:
      groups[key] = (path, ev)
      continue
    first, ref = groups[key]
    for m in sorted(set(ref) & set(ev)):
      if ref[m] != ev[m] and not (_isnan(ref[m]) and _isnan(ev[m])):
        raise MixedStarts(
            f"arms {first} and {path} start from different policies: step-0 {m} {ref[m]!r} vs "
            f"{ev[m]!r} with the same start and evaluation settings (units from two starts or "
            "two machines); rerun the table into a fresh --out")


def check_starts(exp: Experiment, report: Mapping) -> None:
  """``check_same_start`` over the arms of ``report`` (``exp.starts`` where the table has its
  own layout)."""
  check_same_start(report["data"], exp.starts(report) if exp.starts else None)


def _isnan(x) -> bool:
  return isinstance(x, float) and math.isnan(x)


def write_json(path: str, obj) -> None:
  """Write ``obj`` as indented JSON to ``path`` atomically."""
  _write_text(path, json.dumps(jsonable(obj), indent=1))


def _atomic_write(path: str, write: Callable) -> None:
  tmp = f"{path}.tmp{os.getpid()}"
  try:
    write(tmp)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def _write_text(path: str, text: str) -> None:
  def write(tmp):
    with open(tmp, "w") as f:
      f.write(text)
  _atomic_write(path, write)


class UnitCache:
  """Finished units under ``directory``: ``<id>-<digest>.json`` (the JSON part of the result and
  the seconds the unit took; written last, so its presence marks a complete unit) and, for
  array results, ``<id>-<digest>.npz``."""

  def __init__(self, directory: str):
    self.directory = directory

  def _stem(self, uid: str, spec: Mapping) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in uid)
    return os.path.join(self.directory, f"{safe}-{digest(spec)}")

  def load(self, uid: str, spec: Mapping) -> tuple[dict, float] | None:
    """(result, seconds) of a finished unit, or None."""
    entry = self.load_entry(uid, spec)
    return None if entry is None else (entry["result"], float(entry["seconds"]))

  def load_entry(self, uid: str, spec: Mapping) -> dict | None:
    """{"result", "seconds", "provenance"} of a finished unit (provenance {} when not
    recorded), or None."""
    stem = self._stem(uid, spec)
    if not os.path.exists(stem + ".json"):
      return None
    with open(stem + ".json") as f:
      entry = json.load(f)
    out = entry["result"]
    if os.path.exists(stem + ".npz"):
      with np.load(stem + ".npz") as z:
        out.update({k: z[k] for k in z.files})
    return {"result": out, "seconds": float(entry["seconds"]),
            "provenance": entry.get("provenance", {})}

  def save(self, uid: str, spec: Mapping, result: Mapping, seconds: float,
           provenance: Mapping | None = None) -> None:
    os.makedirs(self.directory, exist_ok=True)
    stem = self._stem(uid, spec)
    arrays = {k: v for k, v in result.items() if isinstance(v, np.ndarray)}
    rest = {k: v for k, v in result.items() if k not in arrays}

    def write_npz(tmp):
      with open(tmp, "wb") as f:
        np.savez(f, **arrays)

    if arrays:
      _atomic_write(stem + ".npz", write_npz)
    _write_text(stem + ".json", json.dumps({"seconds": seconds, "result": jsonable(rest),
                                            "provenance": jsonable(provenance or {})}))


def jsonable(x):
  """``x`` with numpy scalars and arrays as Python numbers and lists (NaN stays NaN, which
  Python's json writes and reads as ``NaN``)."""
  if isinstance(x, Mapping):
    return {str(k): jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [jsonable(v) for v in x]
  if isinstance(x, np.ndarray):
    return jsonable(x.tolist())
  if isinstance(x, (float, np.floating)):
    return float(x)
  if isinstance(x, np.integer):
    return int(x)
  if isinstance(x, np.bool_):
    return bool(x)
  return x


def cpu_model() -> str:
  """The CPU's model name ('AMD EPYC 7B13', 'Intel(R) Xeon(R) CPU @ 2.20GHz'), or the
  architecture where the system does not say."""
  return _cpuinfo(("model name",)) or platform.processor() or platform.machine()


def _cpuinfo(keys: tuple[str, ...]) -> str:
  """The value of the first /proc/cpuinfo line whose name starts with one of ``keys`` ('' where
  the system has no such file or line)."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.lower().startswith(keys):
          return line.split(":", 1)[1].strip()
  except OSError:
    return ""
  return ""


# The vector extensions XLA:CPU may generate code for: two hosts that differ in these run other
# kernels (results/portability: the instruction set alone moves a retrained SFT start).
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
             "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",
             "asimd", "sve", "sve2")


def cpu_isa() -> list[str]:
  """The CPU's vector extensions among ``ISA_FLAGS`` (from /proc/cpuinfo; empty where the system
  does not say)."""
  have = set(_cpuinfo(("flags", "features")).split())
  return [x for x in ISA_FLAGS if x in have]


def isa_text(isa: Sequence[str] | None) -> str:
  """The widest x86 vector extension in ``isa`` ('AVX-512', 'AVX2', 'AVX'), or ''."""
  isa = set(isa or ())
  for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"), ("sve", "SVE"),
                     ("asimd", "NEON")):
    if flag in isa:
      return name
  return ""


PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "chex", "numpy", "scipy",
            "ml_dtypes", "tensorflow-datasets", "array-record", "grain")


def _git(*args: str) -> str:
  try:
    return subprocess.run(["git", *args], capture_output=True, text=True, cwd=_ROOT,
                          timeout=10).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return ""


def machine() -> dict:
  """The machine, environment and code a result was produced with: CPU model and vector
  extensions, cores (and those this process may use), XLA flags and thread settings, package versions, the commit and whether
  the tracked files differed from it."""
  import importlib.metadata as md

  versions = {}
  for pkg in PACKAGES:
    try:
      versions[pkg] = md.version(pkg)
    except md.PackageNotFoundError:
      pass
  import jax

  try:
    usable = len(os.sched_getaffinity(0))
  except (AttributeError, OSError):
    usable = os.cpu_count()
  return {"cpu_model": cpu_model(), "cpu_isa": cpu_isa(), "processor": platform.machine(),
          "cpus": os.cpu_count(),
          "cpus_usable": usable, "platform": jax.devices()[0].platform,
          "devices": jax.device_count(),
          "env": {k: os.environ[k] for k in ("XLA_FLAGS", "OMP_NUM_THREADS", "JAX_ENABLE_X64",
                                             "JAX_DEFAULT_MATMUL_PRECISION")
                  if k in os.environ},
          "load_average": list(os.getloadavg()), "python": platform.python_version(),
          "versions": versions, "commit": _git("rev-parse", "--short", "HEAD"),
          "dirty": bool(_git("status", "--porcelain", "--untracked-files=no"))}


def command(name: str, args) -> str:
  return (f"python scripts/reproduce.py {name}" + (" --quick" if args.quick else "")
          + (f" --seeds {args.seeds}" if args.seeds else ""))


def run(exp: Experiment, args, *, sync_docs: bool = False) -> dict:
  """Run (or resume) every unit of ``exp``, then judge and write the outputs into ``args.out``.

  ``args`` carries ``quick``, ``seeds`` (None: the config's), ``out`` and ``no_progress``.
  Finished units are cached under ``<out>/cache`` by the digest of their spec and of the code they
  run (``unit_key``); a rerun computes only the missing ones. ``results.json`` records each unit's
  provenance (``machine`` when it ran, its code version and testbed) and the table's testbeds.
  """
  config = exp.get_config(bool(args.quick))
  if args.seeds:
    config = dict(config, seeds=int(args.seeds))
  units = exp.units(config)
  os.makedirs(args.out, exist_ok=True)
  results, seconds, ran, provenance = run_units(units, os.path.join(args.out, "cache"),
                                                 exp.name, args.no_progress)
  data = _collect(exp, config, results)
  report = {"experiment": exp.name, "command": command(exp.name, args), "config": config,
            "machine": machine(), "seconds": seconds.pop("_total"),
            "unit_seconds": sum(seconds.values()), "units_run": ran, "units": provenance,
            "testbeds": testbeds_in([u.spec for u in units.values()]), "data": data}
  return write(exp, report, args.out, sync_docs=sync_docs)


def _collect(exp: Experiment, config: dict, results: Mapping[str, dict]) -> dict:
  """What results.json keeps of the unit results: ``exp.collect``'s choice, by default every
  unit's JSON part."""
  if exp.collect:
    return exp.collect(config, results)
  return {uid: {k: v for k, v in r.items() if not isinstance(v, np.ndarray)}
          for uid, r in results.items()}


def run_units(units: Mapping[str, Unit], cache_dir: str, desc: str, no_progress: bool = False):
  """Run (or load from ``cache_dir``) every unit. Returns (results, seconds per unit and
  "_total", ids run now, provenance per unit: the machine, commit and code version that computed
  it and the testbeds it started from). Refuses units that start from two pinned policies, or
  that read two pinned datasets of one system."""
  check_one_testbed([u.spec for u in units.values()], desc)
  cache = UnitCache(cache_dir)
  t0 = time.perf_counter()
  results, seconds, ran, provenance = {}, {}, [], {}
  bar = progress_lib.bar(total=sum(u.weight for u in units.values()), desc=desc,
                         disable=no_progress)
  for uid, unit in units.items():
    bar.set_postfix_str(uid)
    key = unit_key(unit)
    entry = cache.load_entry(uid, key)
    if entry is None:
      t = time.perf_counter()
      result = unit.run(bar.update)
      prov = dict(machine(), code=key["code"], testbeds=testbeds_in(unit.spec))
      cache.save(uid, key, result, time.perf_counter() - t, prov)
      ran.append(uid)
      entry = cache.load_entry(uid, key)  # exactly what a resumed run sees
    else:
      bar.update(unit.weight)
    results[uid], seconds[uid], provenance[uid] = (entry["result"], entry["seconds"],
                                                   entry["provenance"])
  bar.close()
  seconds["_total"] = time.perf_counter() - t0
  return results, seconds, ran, provenance


DECLARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "declared.json")


def declarations(table: str) -> dict:
  """{claim id or fnmatch pattern: {"declared", "exploratory", "why"}} of ``table``
  (experiments/declared.json)."""
  with open(DECLARED) as f:
    return json.load(f).get(table, {})


def declaration(table: str, claim_id: str) -> dict | None:
  """The declaration of one claim of ``table`` (exact ids first, then patterns in file order), or
  None when experiments/declared.json has none."""
  import fnmatch

  table_decl = declarations(table)
  if claim_id in table_decl:
    return table_decl[claim_id]
  return next((v for k, v in table_decl.items()
               if any(ch in k for ch in "*?[") and fnmatch.fnmatchcase(claim_id, k)), None)


def declare(table: str, summary):
  """``summary`` with each judged claim's ``declared`` commit and ``exploratory`` flag filled in
  from experiments/declared.json (``declaration``); a claim found there under neither keeps what
  it had. Raises ``ValueError`` for a claim declared exploratory that was Holm-adjusted as a
  pre-declared one (judged without ``judge_family(..., table=...)``)."""
  for m in list(mappings(summary)):
    c = m.get("claim")
    if isinstance(c, dict) and "id" in c and "verdict" in m:
      d = declaration(table, c["id"])
      if d is None:
        continue
      if d.get("exploratory") and "p_holm" in m and not c.get("exploratory"):
        raise ValueError(f"{table}: claim {c['id']!r} is declared exploratory but was "
                         "Holm-adjusted with the pre-declared claims of its family; judge it with "
                         f"judge_family(..., table={table!r})")
      c["declared"] = d["declared"]
      c["exploratory"] = bool(d.get("exploratory"))
  return summary


def write(exp: Experiment, report: dict, out_dir: str, *, sync_docs: bool = False) -> dict:
  """Judge ``report`` (``exp.summarize``), then write ``results.json``, ``table.md`` and the
  plots into ``out_dir`` (each file replaced atomically); with ``sync_docs``, the module's
  docstring block and the README's results section too."""
  if not report.get("full"):
    check_starts(exp, report)
  report = jsonable(dict(report, summary=exp.summarize(report)))
  declare(exp.name, report["summary"])
  table = exp.render(report)
  _write_text(os.path.join(out_dir, "table.md"), table)
  report["plots"] = [os.path.basename(p) for p in exp.plot(report, out_dir)]
  _write_text(os.path.join(out_dir, "results.json"), json.dumps(report, indent=1))
  if sync_docs:
    from experiments import docsync

    docsync.sync_all(exp, out_dir)
  print(table)
  return report


# ------------------------------------------------------------------ full-size run directories
class RunsError(ValueError):
  """A run directory that cannot enter a table (named in the message)."""


def read_run(run_dir: str) -> dict:
  """One ``scripts/train.py`` run directory: its ``config.json`` and ``metrics.jsonl``.

  Returns {"dir", "config", "identity" (``identity.json``, ``rlpost.train.identity``; None for
  a run older than identities), "evals": [{"step", metric: value}] (the ``eval/`` rows, in step
  order), "train": {metric: [value per step]} (the ``train/`` rows)}.
  """
  try:
    with open(os.path.join(run_dir, "config.json")) as f:
      config = json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise RunsError(f"{run_dir}: no readable config.json ({e})") from None
  evals, train = {}, {}
  try:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
      rows = [json.loads(line) for line in f if line.strip()]
  except (OSError, json.JSONDecodeError) as e:
    raise RunsError(f"{run_dir}: no readable metrics.jsonl ({e})") from None
  for row in rows:
    step = row.get("step")
    for k, v in row.items():
      if k.startswith("eval/"):
        evals.setdefault(step, {"step": step})[k[5:]] = v
      elif k.startswith("train/"):
        train.setdefault(k[6:], {})[step] = v
  from rlpost.train import identity

  try:
    ident = identity.read(run_dir)
  except ValueError as e:
    raise RunsError(str(e)) from None
  return {"dir": run_dir, "config": config, "identity": ident,
          "evals": [evals[s] for s in sorted(evals)],
          "train": {k: [v[s] for s in sorted(v)] for k, v in train.items()}}


def run_local_keys() -> frozenset:
  """Config keys a run may set differently from its arm: where the weights and data live, how
  the run is laid out on devices and in memory (values unchanged, tested), and operational
  ones; declared with each key (``run_local`` in ``rlpost.train.rl_config.RLConfig``)."""
  from rlpost.train import config as config_lib
  from rlpost.train.rl_config import RLConfig

  return config_lib.keys_where(RLConfig, run_local=True)


def _complete(config: Mapping) -> dict:
  """An RLConfig dict with every default filled in (JSON values), as ``config.json`` holds it."""
  from rlpost.train import config as config_lib
  from rlpost.train import rl

  try:
    cfg = config_lib.from_dict(rl.RLConfig, dict(config))
  except (TypeError, ValueError) as e:
    raise RunsError(f"a config that RLConfig refuses: {e}") from None
  return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


def _signature(config: Mapping) -> str:
  full = _complete(config)
  local = run_local_keys()
  return json.dumps({k: v for k, v in full.items() if k not in local}, sort_keys=True,
                    default=str)


def collect_runs(runs_dir: str, arms: Mapping[str, dict], *, select=None,
                 min_seeds: int = 2) -> dict:
  """Full-size run directories (any depth below ``runs_dir``) as the arms of a table.

  ``arms``: {arm name: RLConfig dict} (an ``experiments/*/full.py`` ``FULL``). A run belongs to
  the arm whose config it equals on every key outside ``run_local_keys()`` (defaults filled in on
  both sides); its seed is its config's ``seed``. ``select``: the arm names to return (None:
  all); runs of the other arms are recognised and left out. Returns {arm: {"config", "seeds",
  "evals": [{"step", "per_seed": [eval dict per seed]}], "train": {metric: [steps][S]},
  "seconds", "runs"}} (the layout of ``experiments.rl_seeds.run_arm``). Raises ``RunsError``
  naming the directory for a run of no arm, a seed run twice, an unfinished run (its last
  evaluation is not at its last step) or an arm whose seeds disagree on their evaluation steps,
  naming the arm for one with fewer than ``min_seeds`` seeds, and naming the key for runs of
  other weights, data or dtypes (``check_identities``).
  """
  by_sig: dict[str, str] = {}
  for name, c in arms.items():
    by_sig.setdefault(_signature(c), name)
  found: dict[str, dict] = {}
  dirs = sorted(os.path.dirname(p) for p in _find(runs_dir, "config.json"))
  if not dirs:
    raise RunsError(f"--runs {runs_dir}: no run directories (config.json) below it")
  for d in dirs:
    run = read_run(d)
    try:
      name = by_sig.get(_signature(run["config"]))
    except RunsError as e:
      raise RunsError(f"{d}: {e}") from None
    if name is None:
      raise RunsError(f"{d}: its config matches no arm of the table (every key outside "
                      f"harness.run_local_keys() must equal the arm's); arms: "
                      f"{', '.join(arms)}")
    if select is not None and name not in select:
      continue
    steps = run["config"].get("steps")
    if not run["evals"] or run["evals"][-1]["step"] != steps:
      last = run["evals"][-1]["step"] if run["evals"] else None
      raise RunsError(f"{d}: unfinished (last evaluation at step {last}, the run has {steps} "
                      "steps); finish it or leave it out")
    seed = run["config"].get("seed", 0)
    if seed in found.setdefault(name, {}):
      raise RunsError(f"{d}: arm {name} seed {seed} is also in {found[name][seed]['dir']}")
    found[name][seed] = run
  check_identities([r for by_seed in found.values() for r in by_seed.values()],
                   {r["dir"]: n for n, by_seed in found.items() for r in by_seed.values()})
  out = {}
  for name, by_seed in found.items():
    seeds = sorted(by_seed)
    if len(seeds) < min_seeds:
      raise RunsError(f"arm {name}: {len(seeds)} seed(s) under {runs_dir}, the table needs "
                      f">= {min_seeds}")
    runs = [by_seed[s] for s in seeds]
    steps = [[e["step"] for e in r["evals"]] for r in runs]
    for r, st in zip(runs, steps):
      if st != steps[0]:
        raise RunsError(f"{r['dir']}: evaluation steps {st} differ from those of "
                        f"{runs[0]['dir']} ({steps[0]}); align the runs of arm {name}")
    evals = [{"step": st, "per_seed": [r["evals"][i] for r in runs]}
             for i, st in enumerate(steps[0])]
    common = set.intersection(*(set(r["train"]) for r in runs))
    n = min(len(r["train"][k]) for r in runs for k in common) if common else 0
    train = {k: [[r["train"][k][t] for r in runs] for t in range(n)] for k in sorted(common)}
    out[name] = {"config": runs[0]["config"], "seeds": seeds, "evals": evals, "train": train,
                 "seconds": None, "runs": [r["dir"] for r in runs]}
  return out


def check_identities(runs: Sequence[dict], arm_of: Mapping[str, str]) -> None:
  """Every run of a table started from the same weights, read the same data and used the same
  dtypes (``rlpost.train.identity``: digests of what the paths held, since the paths are
  run-local). A run without ``identity.json`` (older than identities) gets the identity of the
  files its config names, when this machine has them. Raises ``RunsError`` naming the key and
  two runs that differ, or a run whose identity cannot be known."""
  from rlpost.train import identity

  known = []
  for r in runs:
    ident = r.get("identity")
    if ident is None:
      try:
        ident = identity.of_config(r["config"])
      except OSError as e:
        raise RunsError(f"{r['dir']}: no {identity.FILE} (a run older than run identities), and "
                        f"its files are not here to digest ({e}); rerun it, or copy its policy "
                        "and data to the paths its config.json names") from None
    known.append((r["dir"], ident))
  first_dir, first = known[0] if known else (None, None)
  for d, ident in known[1:]:
    for key in identity.differences(first, ident):
      raise RunsError(
          f"runs differ in '{key}': {first_dir} (arm {arm_of.get(first_dir)}) has "
          f"{identity.describe(first, key)}, {d} (arm {arm_of.get(d)}) has "
          f"{identity.describe(ident, key)}; a table pools runs of one policy, one data set and "
          "one dtype")


def _find(root: str, filename: str) -> list[str]:
  hits = []
  for d, _, files in os.walk(root):
    if filename in files:
      hits.append(os.path.join(d, filename))
  return hits


def run_full(exp: Experiment, runs_dir: str, out_dir: str, *, prefix: str = "",
             allow_underpowered: bool = False, log: Callable[[str], None] = print) -> dict:
  """Judge full-size runs with the CPU table's code: ``exp.full(runs_dir, prefix)`` returns a
  report (config, data) in the CPU layout, which is summarized, rendered and written to
  ``out_dir`` like a CPU run. Fewer seeds in an arm than the power plan asks for
  (``power_plan``: the stated SD of ``experiments/full_size.py``) raise ``RunsError`` unless
  ``allow_underpowered``, which ``log``s the shortfall and marks the table's header."""
  if exp.full is None:
    raise RunsError(f"{exp.name}: no full-size aggregation (its Experiment has no 'full')")
  config, data = exp.full(runs_dir, prefix)
  need = power_plan(config)
  if config["seeds"] < need:
    short = (f"{exp.name} --full: {config['seeds']} seed(s) in the arm with the fewest; the power "
             f"plan asks for {need} per arm (SD {config['pilot_sd']}: "
             f"{config.get('sd_source') or 'pilot'}; smallest effect of interest "
             f"{config['min_effect']}, 80% power, alpha 0.05)")
    if not allow_underpowered:
      raise RunsError(short + "; run the missing seeds (scripts/launch.py) or pass "
                      "--allow-underpowered")
    log(f"UNDERPOWERED (--allow-underpowered): {short}")
  report = {"experiment": exp.name, "command": f"python scripts/reproduce.py {exp.name} --full "
            f"--runs {runs_dir}" + (f" --prefix {prefix}" if prefix else ""),
            "config": config, "machine": machine(), "seconds": 0.0, "unit_seconds": None,
            "units_run": [], "data": data, "full": True}
  os.makedirs(out_dir, exist_ok=True)
  return write(exp, report, out_dir)


def rejudge(exp: Experiment, out_dir: str, *, sync_docs: bool = False) -> dict:
  """Re-judge the results already in ``out_dir`` with the current statistics (no training).

  ``results.json`` must be this table's: a file that is not JSON (truncated, say), not written by
  the harness, or written for another table (its ``"experiment"``) raises ValueError naming the
  file, before ``exp.summarize`` reads a layout it was not written for.
  """
  return write(exp, read_report(exp, out_dir), out_dir, sync_docs=sync_docs)


def read_report(exp: Experiment, out_dir: str) -> dict:
  """``out_dir/results.json``, checked to be this table's (ValueError naming the file)."""
  path = os.path.join(out_dir, "results.json")
  with open(path, "rb") as f:
    raw = f.read()
  try:
    report = json.loads(raw)
  except ValueError as e:  # JSONDecodeError and UnicodeDecodeError alike
    raise ValueError(f"{path} is not valid JSON ({e}; truncated or damaged?); restore it or "
                     f"rerun python scripts/reproduce.py {exp.name}") from e
  if not isinstance(report, dict) or "data" not in report or "config" not in report:
    raise ValueError(f"{path} was not written by experiments/harness.py (no 'data'/'config')")
  table = report.get("experiment")
  if table != exp.name:
    elsewhere = f"point --out at a directory holding {exp.name!r} results"
    if not (isinstance(table, str) and table):
      raise ValueError(f"{path} names no table (no 'experiment' entry), so it is not table "
                       f"{exp.name!r}'s results; {elsewhere}")
    raise ValueError(f"{path} holds the results of table {table!r}, not of table {exp.name!r}; "
                     f"re-judge it as {table!r} (scripts/reproduce.py {table} --rejudge), or "
                     f"{elsewhere}")
  return report


# ------------------------------------------------------------------ replication
def verdicts_in(summary) -> dict[str, dict]:
  """{claim id (with "@family" when ids repeat across families): verdict dict} of every judged
  claim anywhere in a table's summary."""
  found = [m for m in mappings(summary)
           if isinstance(m.get("claim"), Mapping) and "verdict" in m and "diff" in m]
  ids = [v["claim"]["id"] for v in found]
  out = {}
  for i, v in zip(ids, found):
    key = i if ids.count(i) == 1 else f"{i}@{v['claim'].get('family', '')}"
    out.setdefault(key, v)
  return out


def compare(committed: Mapping, new: Mapping, level: float = 0.95) -> list[dict]:
  """Per claim judged in both summaries: the committed and the new difference with their
  intervals and verdicts, and whether they agree: the change of the difference between the runs
  (``stats.diff_of_diffs``, two-sided Welch-Satterthwaite) is not significant at 1 - ``level``
  and the verdicts are equal; and, descriptively, the difference over both runs' seeds pooled
  (``row["pooled"]``, the claim's own interval kind at ``level``). Claims without per-seed
  values (judged before protocol v2) get neither."""
  old, cur = verdicts_in(committed), verdicts_in(new)
  rows = []
  for cid, v in cur.items():
    if cid not in old:
      continue
    o = old[cid]
    row = {"id": cid, "text": v["claim"]["text"], "committed": o, "new": v,
           "same_verdict": o["verdict"] == v["verdict"], "change": None, "pooled": None}
    if o.get("values") and v.get("values"):
      paired = bool(v["claim"].get("paired")) or len(v["claim"]["arms"]) == 1
      dd, lo, hi, p = stats.diff_of_diffs(*o["values"], *v["values"], level=level,
                                          paired=paired)
      row["change"] = {"diff": dd, "lo": lo, "hi": hi, "p": p}
      # both seed sets as one sample: descriptive, never a verdict (chosen after both ran)
      a, b = (list(x) + list(y) for x, y in zip(o["values"], v["values"]))
      d, lo, hi = stats.diff_interval(a, b, level, paired=paired,
                                      method="t" if paired else "welch")
      row["pooled"] = {"diff": d, "lo": lo, "hi": hi, "seeds": len(a)}
    row["agree"] = row["same_verdict"] and (row["change"] is None
                                            or row["change"]["p"] > 1 - level)
    rows.append(row)
  return rows


def replication_markdown(name: str, committed: Mapping, new: Mapping, rows: list[dict],
                         command_line: str, digits: int = 3, scope: str | None = None,
                         wall: str | None = None) -> str:
  """``replication.md``: what was rerun where, and per claim committed vs new. ``scope``: what
  the runs share, so what the comparison tests (default: the RL tables' fixed test problems and
  evaluation key); ``wall``: the replication's wall-time sentence (default ``wall_time``)."""
  def iv(v):
    return f"{v['diff']:+.{digits}f} [{v['lo']:+.{digits}f}, {v['hi']:+.{digits}f}]"

  agree = sum(r["agree"] for r in rows)
  nc, nn = committed.get("config", {}), new.get("config", {})
  lines = [f"# Replication of `{name}`", "",
           f"`{command_line}`: the table's main arms rerun "
           f"{'from its pinned testbeds' if new.get('testbeds') else 'from their seeded start'} "
           "with "
           f"{nn.get('seeds')} fresh seeds (from {nn.get('seed_offset', 0)}; the committed table "
           f"used {nc.get('seeds')} seeds from {nc.get('seed_offset', 0)}).", "",
           f"- Committed: commit {committed.get('machine', {}).get('commit', '?')} on "
           f"{machine_text(committed.get('machine'))}; testbeds "
           f"{', '.join(committed.get('testbeds') or ['not pinned'])}.",
           f"- Replication: commit {new.get('machine', {}).get('commit', '?')} on "
           f"{machine_text(new.get('machine'))}; testbeds "
           f"{', '.join(new.get('testbeds') or ['not pinned'])}. {wall or wall_time(new)}", "",
           f"{agree} of {len(rows)} claims agree: the same verdict, and the change of a - b "
           "between the runs (Welch-Satterthwaite over both runs' seeds, two-sided) not "
           "significant at 0.05.", "",
           "| claim | SESOI | declared | committed a - b [95%] | verdict | replication a - b "
           "[95%] | verdict | committed - replication [95%] | p | agree | both pooled [95%] |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]

  def verdict(v):
    return v["verdict"] + (f"; {v['note']}" if v.get("note") else "")

  for r in rows:
    c, n, ch = r["committed"], r["new"], r["change"]
    change = ("-", "-") if ch is None else (iv(ch), f"{ch['p']:.3g}")
    pooled = "-" if r.get("pooled") is None else iv(r["pooled"])
    lines.append(f"| {r['text']} | {sesoi_text(n['claim'])} | {declared_text(n['claim'])} | "
                 f"{iv(c)} | {verdict(c)} | {iv(n)} | {verdict(n)} | {change[0]} | "
                 f"{change[1]} | {'yes' if r['agree'] else 'no'} | {pooled} |")
  lines += ["", chance_note(rows),
            "", "Both pooled: the difference over both runs' seeds as one sample (95%, the "
            "claim's own interval kind), a description chosen after both ran, never a verdict.",
            "", "Verdicts follow protocol v2 (experiments/STATISTICS.md) in both runs, judged by "
            "the table's own rules. Intervals of equivalence claims are their 90% TOST "
            "intervals. " + (scope or "Both runs use the same fixed test problems and evaluation "
                             "key, so the test compares training seeds only.")]
  return "\n".join(lines) + "\n"


def chance_note(rows: list[dict], alpha: float = 0.05) -> str:
  """How many changes were significant against how many chance alone gives: with both runs
  drawn from one distribution each change test rejects with probability ``alpha``; the binomial
  tail treats the claims as independent, which claims sharing an arm are not."""
  tested = [r for r in rows if r["change"] is not None]
  k = sum(r["change"]["p"] <= alpha for r in tested)
  if not tested:
    return "No claim has per-seed values in both runs, so no change was tested."
  if not k:
    return (f"Changes significant at {alpha:g}: 0 of {len(tested)}; chance alone gives "
            f"{alpha * len(tested):.2g} on average.")
  p = float(binom.sf(k - 1, len(tested), alpha))
  text = (f"Changes significant at {alpha:g}: {k} of {len(tested)}; chance alone gives "
          f"{alpha * len(tested):.2g} on average (P(>= {k}) = {p:.2g} were the claims "
          "independent")
  if k == 1:
    return text + ")."
  return text + ("; claims that share an arm move together, which makes several changes at "
                 "once likelier than this P says).")


def replicate(exp: Experiment, out_dir: str, *, seeds: int | None = None,
              seed_offset: int = 1000, no_progress: bool = False) -> dict:
  """Rerun ``exp``'s main arms with fresh seeds from its pinned start, judge them as the table
  is judged, and compare with the committed ``out_dir/results.json``: writes the new run into
  ``out_dir/replication/`` and the comparison into ``out_dir/replication.md`` (printed).

  Refuses (ValueError) a table without a replication design, and seeds that overlap the
  committed ones."""
  if exp.replicate is None:
    raise ValueError(f"table {exp.name!r} has no replication design (its Experiment has no "
                     "'replicate')")
  committed = read_report(exp, out_dir)
  old = committed["config"]
  seeds = int(seeds or old.get("seeds", 2))
  if seeds < 2:
    raise ValueError(f"--seeds {seeds}: a replication needs >= 2 seeds per arm")
  o0, n0 = int(old.get("seed_offset", 0)), int(old.get("seeds", 0))
  if seed_offset < o0 + n0 and o0 < seed_offset + seeds:
    raise ValueError(f"--seed-offset {seed_offset}: seeds {seed_offset}-{seed_offset + seeds - 1}"
                     f" overlap the committed table's {o0}-{o0 + n0 - 1}; a replication uses "
                     "seeds the table did not use")
  config = exp.replicate(old, seeds, seed_offset)
  units = exp.units(config)
  beds, committed_beds = testbeds_in([u.spec for u in units.values()]), committed.get("testbeds")
  if (exp.pinned and not committed_beds) or beds != (committed_beds or []):
    raise ValueError(
        f"{os.path.join(out_dir, 'results.json')} started from "
        f"{'testbeds ' + ', '.join(committed_beds) if committed_beds else 'an unpinned start'}, "
        f"the replication would start from {', '.join(beds) or 'an unpinned start'}: a "
        f"replication compares seeds, not starts; rerun the table from its pinned testbed "
        f"first (python scripts/reproduce.py {exp.name})")
  rep_dir = replication_dir(out_dir, seeds, seed_offset)
  os.makedirs(rep_dir, exist_ok=True)
  results, secs, ran, provenance = run_units(units, os.path.join(rep_dir, "cache"),
                                             f"{exp.name} replication", no_progress)
  data = _collect(exp, config, results)
  line = (f"python scripts/reproduce.py {exp.name} --replicate --seeds {seeds} "
          f"--seed-offset {seed_offset}")
  report = {"experiment": exp.name, "command": line, "config": config, "machine": machine(),
            "seconds": secs.pop("_total"), "unit_seconds": sum(secs.values()), "units_run": ran,
            "units": provenance, "testbeds": beds, "data": data,
            "replication_of": {"commit": committed.get("machine", {}).get("commit"),
                               "seeds": n0, "seed_offset": o0}}
  return _write_replication(exp, committed, report, rep_dir)


def committed_arm(report: Mapping, name: str) -> Mapping | None:
  """The committed result of RL arm ``name`` (``rl_seeds.run_arm``'s output: "seeds" and
  "evals") in a table's report, wherever its ``data`` keeps it; None if it has none."""
  data = report.get("data") or {}
  arm = (data.get("arms") or {}).get(name, data.get(name))
  return arm if isinstance(arm, Mapping) and "evals" in arm and "seeds" in arm else None


def recheck(exp: Experiment, out_dir: str, names: Sequence[str]) -> dict:
  """Retrain the committed table's RL arms ``names`` at its own config and seeds, on this machine
  and code (no cache), and compare every evaluation (its step and every numeric metric of every
  seed) with the committed run: ``{name: {"bitwise", "max_abs_diff", "per_seed_max",
  "seconds"}}``, printed and appended with the machine and commit to ``out_dir/recheck.jsonl``.
  On the machine and code that ran the table the contract is bitwise; elsewhere it says how far
  the arm moved. Refuses (ValueError, before any training) a name that is not a committed RL
  arm."""
  committed = read_report(exp, out_dir)
  units = exp.units(committed["config"])
  arms = [n for n in units if committed_arm(committed, n) is not None]
  for n in names:
    if n not in arms:
      raise ValueError(f"--recheck {n}: not an RL arm of the committed table in "
                       f"{os.path.join(out_dir, 'results.json')} (its arms: "
                       f"{', '.join(arms) or 'none'})")
  out = {}
  for n in names:
    t0 = time.perf_counter()
    new, old = units[n].run(lambda *_: None), committed_arm(committed, n)
    if list(new["seeds"]) != list(old["seeds"]) or len(new["evals"]) != len(old["evals"]):
      raise ValueError(f"--recheck {n}: the rerun's seeds or evaluation points differ from the "
                       "committed ones; the table's design changed since it ran")
    per_seed = [0.0] * len(old["seeds"])
    for e_new, e_old in zip(new["evals"], old["evals"]):
      if e_new["step"] != e_old["step"]:
        raise ValueError(f"--recheck {n}: the rerun evaluates at step {e_new['step']} where the "
                         f"committed run did at {e_old['step']}; the design changed")
      for i, (a, b) in enumerate(zip(e_new["per_seed"], e_old["per_seed"])):
        if set(a) != set(b):
          raise ValueError(f"--recheck {n}: the rerun reports metrics "
                           f"{sorted(set(a) ^ set(b))} that only one run has")
        for key, x in b.items():
          if isinstance(x, (int, float)) and not isinstance(x, bool):
            per_seed[i] = max(per_seed[i], _abs_diff(float(a[key]), float(x)))
    out[n] = {"bitwise": max(per_seed) == 0.0, "max_abs_diff": max(per_seed),
              "per_seed_max": per_seed, "seconds": time.perf_counter() - t0}
    print(f"{n}: seeds {old['seeds'][0]}-{old['seeds'][-1]}, {len(old['evals'])} evaluations: "
          + ("bitwise equal to the committed run" if out[n]["bitwise"] else
             f"largest |difference| {max(per_seed):.3g} (per seed: "
             + ", ".join(f"{d:.2g}" for d in per_seed) + ")")
          + f"; {out[n]['seconds']:.0f} s on {machine_text(machine())}", flush=True)
  record = {"command": f"python scripts/reproduce.py {exp.name} --recheck {' '.join(names)}",
            "machine": machine(), "of_commit": committed.get("machine", {}).get("commit"),
            "arms": out}
  # appended, one JSON line per recheck: earlier records are never rewritten
  with open(os.path.join(out_dir, "recheck.jsonl"), "a") as f:
    f.write(json.dumps(jsonable(record)) + "\n")
  return out


def _abs_diff(a: float, b: float) -> float:
  """|a - b|: 0 where equal (two NaNs count as equal), inf where exactly one is NaN."""
  if math.isnan(a) or math.isnan(b):
    return 0.0 if math.isnan(a) and math.isnan(b) else math.inf
  return 0.0 if a == b else abs(a - b)


def replication_dir(out_dir: str, seeds: int, seed_offset: int) -> str:
  """Where a replication at ``seeds`` seeds from ``seed_offset`` goes: ``out_dir/replication``
  (the table's committed replication, with ``out_dir/replication.md``) when none is there or it
  used the same seeds; otherwise ``out_dir/replication-<offset>x<seeds>`` (its ``replication.md``
  inside), so another seed set never overwrites the committed one."""
  main = os.path.join(out_dir, "replication")
  path = os.path.join(main, "results.json")
  if not os.path.exists(path):
    return main
  with open(path) as f:
    cfg = json.load(f).get("config", {})
  if (int(cfg.get("seeds", -1)), int(cfg.get("seed_offset", 0))) == (seeds, seed_offset):
    return main
  return os.path.join(out_dir, f"replication-{seed_offset}x{seeds}")


def _markdown_path(rep_dir: str) -> str:
  """``replication.md`` beside the committed ``replication/``, inside any other."""
  if os.path.basename(rep_dir) == "replication":
    return os.path.join(os.path.dirname(rep_dir), "replication.md")
  return os.path.join(rep_dir, "replication.md")


def rejudge_replication(exp: Experiment, out_dir: str) -> dict:
  """Re-judge the committed table and its replication (``out_dir/replication/results.json``) with
  the current statistics and rewrite ``replication.md`` (no training)."""
  committed = read_report(exp, out_dir)
  report = read_report(exp, os.path.join(out_dir, "replication"))
  committed = jsonable(dict(committed, summary=declare(exp.name, exp.summarize(committed))))
  return _write_replication(exp, committed, report, os.path.join(out_dir, "replication"))


def _write_replication(exp: Experiment, committed: dict, report: dict, rep_dir: str) -> dict:
  check_starts(exp, report)
  report = jsonable(dict(report, summary=exp.summarize(report)))
  declare(exp.name, report["summary"])
  write_json(os.path.join(rep_dir, "results.json"), report)
  rows = compare(committed.get("summary", {}), report["summary"])
  text = replication_markdown(exp.name, committed, report, rows, report["command"])
  md = _markdown_path(rep_dir)
  _write_text(md, text)
  print(text)
  print(f"written: {md} and {os.path.join(rep_dir, 'results.json')}")
  return {"report": report, "rows": rows, "markdown": md}

