"""The paper's claims as data, judged by ``harness.judge_family`` (experiments/STATISTICS.md).

Each claim of the paper (``PaperClaim``) is one or more parts; a part is a one-sample claim
about a pre-declared per-seed summary of one system (``METRICS``) against a threshold: "above t"
is ``harness.Claim(..., (system,), "greater", center=t)``, "below t" direction ``"less"``, and a
band ("coverage near nominal") an equivalence claim, TOST with ``center`` and ``margin``. Each
part is judged on the seeds' values by a one-sample t interval and one-sided t test (``harness``);
a claim is *reproduced* on a system when every part is, *not reproduced* when any part is,
*inconclusive* otherwise.

Per-depth rules are judged on one pre-declared summary per seed rather than one claim per depth:
"at every depth" is the worst depth of the seed (the minimum over depths of the per-seed values;
for the per-depth coverage band, the largest deviation from nominal), so a reproduced verdict on
it is one at every depth; "depth mean" rules use the seed's mean over depths. This keeps one
test per part in the Holm family.

Families (Holm-adjusted together):

* ``paper``: every part of every paper claim on the deciding systems, the fair tests (kdv1d and,
  when a plan includes it, ns2d: reversible or near-conservative) whose model passes the skill
  gate. The overall verdict
  of a claim is the deciding systems' verdict when they agree, inconclusive otherwise or when
  none decides.
* ``controls``: weaker forms of the claims and controls (not claims of the paper) on the
  deciding systems.
* ``<family>@<system>``: the same claims on a system that does not decide (the ks1d stress test,
  dissipative so that backward stepping is ill posed; a fair test whose model failed the gate),
  reported beside the verdicts and adjusted per system.
* ``gate@<system>``: the skill gate, 1 - E_1 / (error of the trivial prediction x_1 := x_0)
  above ``SKILL_GATE`` (one-sample t), one test per system: whether a model predicts its own
  errors says little about the paper when it is no better than predicting no change.
* ``sanity@<system>``: that an oracle ranking (by the true error) meets each selective-prediction
  rule: a rule the oracle is not shown to meet (its own check is not reproduced) is no test of
  C_i at these seeds, and the claim is *not testable* on that
  system (experiments/STATISTICS.md, protocol v2 point 4). The OOD rules get
  a reference check instead, the true error E_i as the OOD score: how visible the shift is in the
  error itself. It bounds nothing (C_i may detect the shift better than E_i), so a failed
  reference does not void an OOD verdict; a failed oracle check is listed under the verdicts.

Thresholds sit somewhat below the paper's numbers (a CPU-scale model is not the paper's model);
each part states its own. ``DROPPED`` lists the paper claims left out of the verdicts, and why.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import numpy as np

from experiments import harness

REPRODUCED, NOT, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
SKILL_GATE = 0.5
SELECTIVE_CUT = 0.15  # the paper's error cut at 80% coverage
NOMINAL68, BAND68 = 0.683, 0.08  # the 68% interval's coverage: inside [0.603, 0.763]
NOMINAL95, BAND95 = 0.95, 0.04  # the 95% interval's coverage: inside [0.91, 0.99]


def _get(path: str) -> Callable[[dict], Any]:
  """A per-seed value by its dotted path in ``analysis.seed_metrics`` (None when absent)."""
  def get(s: dict):
    for part in path.split("."):
      if not isinstance(s, dict) or part not in s:
        return None
      s = s[part]
    return s
  return get


def _reduce(path: str, fn: Callable) -> Callable[[dict], Any]:
  get = _get(path)
  return lambda s: None if get(s) is None else float(fn(np.asarray(get(s), np.float64)))


def _diff(a: str, b: str, times: float = 1.0) -> Callable[[dict], Any]:
  ga, gb = _get(a), _get(b)
  return lambda s: (None if ga(s) is None or gb(s) is None else float(ga(s) - times * gb(s)))


# Per-seed summaries the claims are judged on: name -> function of one seed's statistics.
METRICS: dict[str, Callable[[dict], Any]] = {
    "skill": _get("ranking.skill"),
    "rho_fixed_worst": _reduce("ranking.rho_fixed", np.min),
    "rho_within_depth_mean": _get("ranking.rho_within_depth_mean"),
    "factor68": _get("calibration.c_logdepth.factor68"),
    "cov68": _get("calibration.c_logdepth.cov68"),
    "cov95": _get("calibration.c_logdepth.cov95"),
    "cov68_worst_deviation": _reduce("calibration.c_logdepth.cov68_by_depth",
                                     lambda x: np.max(np.abs(x - NOMINAL68))),
    "nll_gain": _get("calibration.nll_gain"),
    "nll_gain_vs_onehot": _get("calibration.nll_gain_vs_onehot"),
    "auroc_C_depth_mean": _get("ood.C_depth_mean"),
    "auroc_C_deepest": _reduce("ood.C", lambda x: x[-1]),
    "auroc_disp_depth_mean": _get("ood.disp_depth_mean"),
    "auroc_disp_norm_depth_mean": _get("ood.disp_norm_depth_mean"),
    "auroc_C_minus_best_disp": _get("ood.C_minus_best_disp"),
    "cut_C_depth_mean": _get("selective.by_depth_C_mean"),
    "cut_oracle_depth_mean": _reduce("selective.by_depth.oracle", np.mean),
    "cut_oracle_worst": _reduce("selective.by_depth.oracle", np.min),
    "pooled_cut_oracle_minus_depth": _diff("selective.pooled.oracle", "selective.pooled.depth"),
    "auroc_E_depth_mean": _get("ood.E_depth_mean"),
    "auroc_E_deepest": _reduce("ood.E", lambda x: x[-1]),
    "pooled_cut_C_minus_depth": _diff("selective.pooled.C_calibrated", "selective.pooled.depth"),
    "pooled_cut_C_minus_3x_depth": _get("selective.pooled.C_minus_3x_depth"),
    "pooled_cut_oracle_minus_3x_depth": _diff("selective.pooled.oracle",
                                              "selective.pooled.depth", 3.0),
    "gain_fwd": _get("specialists.gain_fwd"),
    "gain_bwd": _get("specialists.gain_bwd"),
    "inverse_gain_worst": _reduce("inverse.gain_vs_persistence", np.min),
    "rho_minus_disp": _get("derived.rho_minus_disp"),
    "under_pooled_minus_fixed": _get("derived.under_pooled_minus_fixed"),
    "trained_minus_under": _get("derived.trained_minus_under"),
}


@dataclasses.dataclass(frozen=True)
class Part:
  """One tested part of a claim: ``metric`` (a key of ``METRICS``) "greater" than ``center``,
  "less" than it, or "equivalent" to it within ``margin``; ``rule`` says so in words."""

  metric: str
  direction: str
  center: float
  rule: str
  margin: float = 0.0


def _parts(direction: str, center: float, rule: str, **metrics: str) -> tuple[Part, ...]:
  """One part per ``label=metric``, the rule ``rule.format(label)``."""
  return tuple(Part(m, direction, center, rule.format(label)) for label, m in metrics.items())


@dataclasses.dataclass(frozen=True)
class PaperClaim:
  """A claim and its parts; ``control``: a weaker form or a control, not a claim of the paper."""

  id: str
  paper: str
  parts: tuple[Part, ...]
  control: bool = False


CLAIMS = (
    PaperClaim("fixed_depth", "C_i ranks rollout error at fixed depth: Spearman 0.91-0.98",
               (Part("rho_fixed_worst", "greater", 0.80,
                     "Spearman(C_i, E_i) at the seed's worst depth above 0.80"),)),
    PaperClaim("within_trajectory", "ranking within trajectories: Spearman 0.69 +- 0.16",
               (Part("rho_within_depth_mean", "greater", 0.53,
                     "depth mean of the within-trajectory mean Spearman above 0.53 "
                     "(= 0.69 - 0.16)"),)),
    PaperClaim("calibrator_width", "calibrator interval factors 1.14x (68%) / 1.29x (95%)",
               (Part("factor68", "less", 1.20, "68% factor exp(sigma) below 1.20"),)),
    PaperClaim("calibrator_coverage", "calibrator coverage near nominal (68% / 95%)",
               (Part("cov68", "equivalent", NOMINAL68,
                     f"held-out 68% coverage within {NOMINAL68} +- {BAND68}", BAND68),
                Part("cov95", "equivalent", NOMINAL95,
                     f"held-out 95% coverage within {NOMINAL95} +- {BAND95}", BAND95))),
    PaperClaim("calibrator_nll", "calibrator one nat better than depth-only (held-out NLL)",
               (Part("nll_gain", "greater", 0.5,
                     "NLL gain over the log-depth-only calibrator above 0.5 nats"),)),
    PaperClaim("ood_auroc", "OOD AUROC 0.98, 1.0 by depth 10",
               (Part("auroc_C_depth_mean", "greater", 0.90, "depth-mean AUROC of C_i above 0.90"),
                Part("auroc_C_deepest", "greater", 0.95,
                     "AUROC of C_i at the deepest depth above 0.95"))),
    PaperClaim("dispersion_inverts",
               "sampling-dispersion baselines invert on OOD data (AUROC < 0.5)",
               _parts("less", 0.5, "depth-mean AUROC of the {} sample spread below 0.5",
                      raw="auroc_disp_depth_mean", normalised="auroc_disp_norm_depth_mean")),
    PaperClaim("selective_cut", "15% error cut at 80% coverage",
               (Part("cut_C_depth_mean", "greater", SELECTIVE_CUT,
                     f"depth mean of the per-depth error cut ranking by C_i above "
                     f"{SELECTIVE_CUT}"),)),
    PaperClaim("specialists",
               "bidirectional training beats direction specialists in both directions",
               _parts("greater", 0.0,
                      "{}: log(specialist / bidirectional error), depth mean, above 0",
                      forward="gain_fwd", backward="gain_bwd")),
    PaperClaim("inverse_solver", "the backward direction works as an inverse solver",
               (Part("inverse_gain_worst", "greater", 0.0,
                     "log(error of x_0 := x_i / error recovering x_0 from the true x_i) at "
                     "the worst depth above 0"),)),
    # Weaker forms and controls (not claims of the paper).
    PaperClaim("fixed_depth_positive", "weaker: C_i ranks error at fixed depth better than chance",
               (Part("rho_fixed_worst", "greater", 0.0,
                     "Spearman at the seed's worst depth above 0"),), control=True),
    PaperClaim("beats_spread", "control: C_i ranks error better than the sample spread",
               (Part("rho_minus_disp", "greater", 0.0,
                     "depth mean of rho(C_i) - best rho(spread) above 0"),), control=True),
    PaperClaim("calibrator_nll_positive", "weaker: the calibrator with C beats depth-only at all",
               _parts("greater", 0.0, "NLL gain over {} above 0",
                      **{"log depth only": "nll_gain",
                         "one mean per depth": "nll_gain_vs_onehot"}), control=True),
    PaperClaim("coverage_by_depth", "control: the 68% interval is calibrated at each depth",
               (Part("cov68_worst_deviation", "less", BAND68,
                     f"largest |68% coverage - {NOMINAL68}| over depths below {BAND68}"),),
               control=True),
    PaperClaim("ood_beats_dispersion", "weaker: C_i detects OOD better than sampling dispersion",
               (Part("auroc_C_minus_best_disp", "greater", 0.0,
                     "depth-mean AUROC(C_i) - best spread AUROC above 0"),), control=True),
    PaperClaim("selective_per_depth", "weaker: ranking by C_i cuts error at each fixed depth",
               (Part("cut_C_depth_mean", "greater", 0.0, "depth mean of the per-depth cut above 0"),),
               control=True),
    PaperClaim("selective_pooled_beats_depth",
               "weaker form of 'three times depth-only': pooled over depths, the calibrator's "
               "ranking cuts more than depth alone",
               (Part("pooled_cut_C_minus_depth", "greater", 0.0,
                     "pooled cut of the main calibrator - depth-only calibrator above 0"),),
               control=True),
    PaperClaim("pooled_inflated", "control: pooling over depths inflates Spearman (spec's lesson)",
               (Part("under_pooled_minus_fixed", "greater", 0.1,
                     "undertrained model, pooled - depth-mean fixed-depth Spearman above 0.1"),),
               control=True),
    PaperClaim("trained_vs_undertrained", "control: training improves the fixed-depth ranking",
               (Part("trained_minus_under", "greater", 0.0,
                     "depth-mean Spearman, trained - undertrained, above 0"),), control=True),
)

GATE = Part("skill", "greater", SKILL_GATE,
            f"skill 1 - E_1 / E_1(x_1 := x_0) above {SKILL_GATE}")

# Rules that even an oracle ranking (by the true error) must meet for the rule to test C_i: each
# selective-prediction rule of CLAIMS with the true error E_i as the score (Spearman, calibration
# and NLL rules an oracle meets by construction). The OOD rules' rows score OOD by E_i: a
# reference for how visible the shift is in the error, not a bound on C_i's AUROC
# (``REFERENCE_ONLY``).
ATTAINABLE = (
    ("selective_cut", Part("cut_oracle_depth_mean", "greater", SELECTIVE_CUT,
                           f"oracle ranking: depth mean of the per-depth cut above "
                           f"{SELECTIVE_CUT}")),
    ("selective_per_depth", Part("cut_oracle_worst", "greater", 0.0,
                                 "oracle ranking: the per-depth cut at the seed's worst depth "
                                 "above 0")),
    ("selective_pooled_beats_depth", Part("pooled_cut_oracle_minus_depth", "greater", 0.0,
                                          "oracle ranking: pooled cut - depth-only "
                                          "calibrator's above 0")),
    ("ood_auroc", Part("auroc_E_depth_mean", "greater", 0.90,
                       "reference score (the true error E_i, not a bound): depth-mean OOD AUROC "
                       "above 0.90")),
    ("ood_auroc", Part("auroc_E_deepest", "greater", 0.95,
                       "reference score (the true error E_i, not a bound): OOD AUROC at the "
                       "deepest depth above 0.95")),
)
REFERENCE_ONLY = {"ood_auroc"}

DROPPED = (
    {"id": "selective_vs_depth", "paper": "the cut is three times the depth-only baseline's",
     "old_rule": "pooled (C cut - 3 x depth-only cut) above 0, and the C cut above 0",
     "metrics": ("pooled_cut_C_minus_3x_depth", "pooled_cut_oracle_minus_3x_depth"),
     "why": "no ranking can meet it: pooled over depths, ranking by depth alone already earns "
            "nearly the oracle's whole cut (errors grow by an order of magnitude over the "
            "depths), so even the oracle's pooled cut is far below three times the depth-only "
            "one (oracle - 3 x depth-only below). Its attainable weaker form, "
            "`selective_pooled_beats_depth`, is a control."},
)


def per_seed_values(per_seed: list[dict]) -> dict[str, list[float]]:
  """{metric: finite per-seed values} of one system (metrics it lacks are left out)."""
  out = {}
  for name, fn in METRICS.items():
    vals = [fn(s) for s in per_seed]
    vals = [float(v) for v in vals if v is not None and np.isfinite(v)]
    if any(fn(s) is not None for s in per_seed):
      out[name] = vals
  return out


def _claim(cid: str, text: str, part: Part, system: str, family: str) -> harness.Claim:
  return harness.Claim(cid, text, part.metric, (system,), part.direction, part.margin, family,
                       center=part.center)


def every(verdicts: list[str]) -> str:
  """A claim of several parts: reproduced if each part is, not reproduced if any part is."""
  if verdicts and all(v == REPRODUCED for v in verdicts):
    return REPRODUCED
  if any(v == NOT for v in verdicts):
    return NOT
  return INCONCLUSIVE


def overall(verdicts: list[str]) -> str:
  """Across the deciding systems: unanimous verdicts stand, anything else is inconclusive."""
  if verdicts and all(v == verdicts[0] for v in verdicts):
    return verdicts[0]
  return INCONCLUSIVE


def judge(per_seed: Mapping[str, list[dict]], roles: Mapping[str, str]) -> dict:
  """Every verdict of the experiment from each system's per-seed statistics.

  Returns a JSON-ready dict: ``gate`` (verdicts of the skill gate), ``deciding`` (the fair
  systems that pass it), ``verdicts`` ({family: [verdict dicts]}, the oracle checks under
  ``sanity@<system>``), ``claims`` (per paper claim: the verdict on each system that has its
  data, and overall) and ``dropped`` (with the intervals of their metrics per system). A part whose metric has fewer than two
  finite seeds on a system is not judged there.
  """
  values = {name: per_seed_values(ps) for name, ps in per_seed.items()}
  by_metric: dict[str, dict[str, list[float]]] = {}
  for name, vals in values.items():
    for metric, v in vals.items():
      by_metric.setdefault(metric, {})[name] = v

  def judgeable(part: Part, system: str) -> bool:
    return len(values[system].get(part.metric, [])) >= 2

  gates = [_claim(f"skill_gate@{n}", GATE.rule, GATE, n, f"gate@{n}")
           for n in per_seed if judgeable(GATE, n)]
  gate = harness.judge_family(gates, by_metric, table="roundtrip")
  deciding = [v.claim.arms[0] for v in gate
              if v.verdict == REPRODUCED and roles[v.claim.arms[0]] == "fair"]
  claims, origin = [], {}
  for pc in CLAIMS:
    group = "controls" if pc.control else "paper"
    for system in per_seed:
      family = group if system in deciding else f"{group}@{system}"
      for i, part in enumerate(pc.parts):
        if judgeable(part, system):
          claims.append(_claim(f"{pc.id}.{i}@{system}", f"`{pc.id}`: {part.rule}", part, system,
                               family))
          origin[claims[-1].id] = (pc.id, system)
  oracle_check = {}  # sanity claim id -> the paper claim whose rule it checks (not references)
  for i, (cid, part) in enumerate(ATTAINABLE):
    for system in per_seed:
      if judgeable(part, system):
        claims.append(_claim(f"{cid}.oracle{i}@{system}", f"`{cid}`: {part.rule}", part, system,
                             f"sanity@{system}"))
        if cid not in REFERENCE_ONLY:
          oracle_check[claims[-1].id] = cid
  judged = harness.judge_family(claims, by_metric, table="roundtrip")
  verdicts: dict[str, list[dict]] = {}
  parts: dict[tuple[str, str], list[str]] = {}
  oracle_fails: dict[str, list[str]] = {}
  for v in judged:
    verdicts.setdefault(v.claim.family, []).append(v.to_json())
    if v.claim.id in origin:
      parts.setdefault(origin[v.claim.id], []).append(v.verdict)
    if v.claim.id in oracle_check and v.verdict != REPRODUCED:
      failed = oracle_fails.setdefault(oracle_check[v.claim.id], [])
      if v.claim.arms[0] not in failed:
        failed.append(v.claim.arms[0])
  table = []
  for pc in CLAIMS:
    # A rule the oracle ranking cannot meet on a system tests nothing about C_i there.
    systems = {s: (harness.NOT_TESTABLE if s in oracle_fails.get(pc.id, [])
                   else every(parts[(pc.id, s)])) for s in per_seed if (pc.id, s) in parts}
    votes = [systems[s] for s in deciding if s in systems]
    table.append({"id": pc.id, "paper": pc.paper, "control": pc.control, "systems": systems,
                  "oracle_fails": oracle_fails.get(pc.id, []),
                  "verdict": overall(votes) if votes else INCONCLUSIVE,
                  "deciding_systems": [s for s in deciding if s in systems],
                  "rules": [p.rule for p in pc.parts]})
  dropped = [dict(d, cells={m: {s: harness.cell(values[s][m]) for s in per_seed
                                if len(values[s].get(m, [])) >= 1}
                            for m in d["metrics"]})
             for d in DROPPED]
  return {"gate": [v.to_json() for v in gate], "deciding": deciding, "verdicts": verdicts,
          "claims": table, "dropped": dropped}
