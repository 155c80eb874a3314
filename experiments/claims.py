"""Claims as data, judged by ``rlpost.eval.stats`` (the protocol of experiments/STATISTICS.md).

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

The commit that declared each claim, and whether it is exploratory, is kept in
``experiments/declared.json`` (``declare``); ``compare`` sets a replication's verdicts beside the
committed ones.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Mapping, Sequence

import numpy as np
from scipy.stats import norm as normal

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
  whose difference is significantly non-zero, and a verdict decided by a bound within half a
  minimum detectable effect of its threshold ("near its threshold": another start or seed set
  can flip it);
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
    if c.paired or len(c.arms) == 1:
      # one sample of differences: the two-sample MDE at sd / sqrt(2) has the same
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


def mappings(tree):
  """Every mapping in a tree of mappings and lists (``tree`` itself first), depth first."""
  if isinstance(tree, Mapping):
    yield tree
    for v in tree.values():
      yield from mappings(v)
  elif isinstance(tree, (list, tuple)):
    for v in tree:
      yield from mappings(v)


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
