"""The paper's claims and the explicit rules that turn our numbers into verdicts.

Every verdict is computed here from the seed-level 95% bootstrap intervals (``analysis.summarize``);
none is written by hand. The building blocks:

* ``above(ci, t)``: *reproduced* if the interval lies entirely above t, *not reproduced* if it lies
  entirely below, *inconclusive* otherwise or with fewer than two seeds
  (``experiments.averaging.report.verdict``). ``below`` mirrors it.
* ``band(ci, lo, hi)``: *reproduced* if the interval lies inside [lo, hi], *not reproduced* if it
  lies entirely outside it.
* ``every(verdicts)``: a claim made at every depth (or about several quantities) is *reproduced*
  if each part is, *not reproduced* if any part is, *inconclusive* otherwise.
* ``overall(verdicts of the deciding systems)``: *reproduced* (or *not reproduced*) when every
  deciding system agrees, *inconclusive* when they disagree or none decides. The fair tests are
  the reversible or near-conservative systems (kdv1d, ns2d); the dissipative ks1d is the stress
  test, reported beside them and left out of the overall verdict.
* ``skill_gate``: a fair system decides only if its model has learned the dynamics: the skill
  1 - E_1 / (error of the trivial prediction x_1 := x_0) must have its CI above
  ``SKILL_GATE``. Whether a model predicts its own errors says little about the paper when
  the model is no better than predicting no change.

Thresholds sit somewhat below the paper's numbers (a CPU-scale model is not the paper's model);
each rule states its own threshold.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

from experiments.averaging import report as R

REPRODUCED, NOT, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
SKILL_GATE = 0.5


def above(c: dict, t: float) -> str:
  return R.verdict(c, margin=t)


def below(c: dict, t: float) -> str:
  flipped = dict(c, mean=-c["mean"], lo=-c["hi"], hi=-c["lo"])
  return R.verdict(flipped, margin=-t)


def band(c: dict, lo: float, hi: float) -> str:
  if c["n"] < 2 or math.isnan(c["lo"]):
    return INCONCLUSIVE
  if c["lo"] >= lo and c["hi"] <= hi:
    return REPRODUCED
  if c["hi"] < lo or c["lo"] > hi:
    return NOT
  return INCONCLUSIVE


def every(verdicts: list[str]) -> str:
  if verdicts and all(v == REPRODUCED for v in verdicts):
    return REPRODUCED
  if any(v == NOT for v in verdicts):
    return NOT
  return INCONCLUSIVE


def overall(verdicts: list[str]) -> str:
  """Across the fair systems: unanimous verdicts stand, anything else is inconclusive."""
  if verdicts and all(v == verdicts[0] for v in verdicts):
    return verdicts[0]
  return INCONCLUSIVE


def skill_gate(summary: dict) -> bool:
  """Whether a system's model beats the trivial no-change prediction clearly enough to decide."""
  return above(summary["ranking"]["skill"], SKILL_GATE) == REPRODUCED


def _m(c: dict, digits: int = 2) -> str:
  return f"{c['mean']:.{digits}f}"


def _ci(c: dict, digits: int = 2) -> str:
  if c["n"] < 2 or math.isnan(c["lo"]):
    return _m(c, digits)
  return f"{c['mean']:.{digits}f} [{c['lo']:.{digits}f}, {c['hi']:.{digits}f}]"


def _per_depth(cs: list[dict], depths, digits: int = 2) -> str:
  return " / ".join(_m(c, digits) for c in cs) + f" (d={'/'.join(map(str, depths))})"


@dataclasses.dataclass(frozen=True)
class Claim:
  """One claim: ``judge(summary, depths) -> (verdict, our numbers)`` for one system's summary;
  ``needs`` names the summary section the claim requires (systems without it are skipped)."""

  id: str
  paper: str
  rule: str
  judge: Callable[[dict, tuple], tuple[str, str]]
  needs: str = "ranking"
  control: bool = False  # a weaker form or a control, not a claim of the paper


def _fixed(s, depths, t=0.8):
  cs = s["ranking"]["rho_fixed"]
  return every([above(c, t) for c in cs]), _per_depth(cs, depths)


def _within(s, depths):
  r = s["ranking"]
  std = sum(c["mean"] for c in r["rho_within_std"]) / len(depths)
  c = r["rho_within_depth_mean"]
  return above(c, 0.53), f"{_ci(c)} (+- {std:.2f} over trajectories; depth mean)"


def _width(s, depths):
  cal = s["calibration"]["c_logdepth"]
  return below(cal["factor68"], 1.20), (f"{_ci(cal['factor68'])}x / "
                                        f"{_m(cal['factor95'])}x")


def _coverage(s, depths):
  cal = s["calibration"]["c_logdepth"]
  v = every([band(cal["cov68"], 0.603, 0.763), band(cal["cov95"], 0.91, 0.99)])
  return v, f"{_ci(cal['cov68'])} / {_ci(cal['cov95'])}"


def _nll(s, depths, t=0.5):
  cal = s["calibration"]
  return above(cal["nll_gain"], t), (f"{_ci(cal['nll_gain'])} nats "
                                     f"({_m(cal['c_logdepth']['nll'])} vs "
                                     f"{_m(cal['logdepth']['nll'])})")


def _auroc(s, depths):
  o = s["ood"]
  v = every([above(o["C_depth_mean"], 0.90), above(o["C"][-1], 0.95)])
  return v, f"{_per_depth(o['C'], depths)}; mean {_ci(o['C_depth_mean'])}"


def _inverts(s, depths):
  o = s["ood"]
  v = every([below(o["disp_depth_mean"], 0.5), below(o["disp_norm_depth_mean"], 0.5)])
  return v, f"raw {_ci(o['disp_depth_mean'])}, normalised {_ci(o['disp_norm_depth_mean'])}"


def _cut15(s, depths):
  sel = s["selective"]
  p = sel["pooled"]
  return above(sel["by_depth_C_mean"], 0.10), (
      f"{_ci(sel['by_depth_C_mean'])} depth mean of {_per_depth(sel['by_depth']['C'], depths)}; "
      f"pooled {_m(p['C_calibrated'])} vs depth-only pooled {_m(p['depth'])}")


def _cut3x(s, depths):
  p = s["selective"]["pooled"]
  v = every([above(p["C_minus_3x_depth"], 0.0), above(p["C_calibrated"], 0.0)])
  return v, (f"C {_m(p['C_calibrated'])} vs depth-only "
             f"{_m(p['depth'])} (C - 3 x depth: {_ci(p['C_minus_3x_depth'])})")


def _specialists(s, depths):
  sp = s["specialists"]
  v = every([above(sp["gain_fwd"], 0.0), above(sp["gain_bwd"], 0.0)])
  return v, (f"log(specialist / bidir error): forward {_ci(sp['gain_fwd'])}, backward "
             f"{_ci(sp['gain_bwd'])}")


def _inverse(s, depths):
  inv = s["inverse"]
  v = every([above(c, 0.0) for c in inv["gain_vs_persistence"]])
  return v, (f"error {_per_depth(inv['error'], depths, 3)} vs x_0 := x_i "
             f"{' / '.join(_m(c, 3) for c in inv['persistence'])}")


def _fixed_positive(s, depths):
  return _fixed(s, depths, t=0.0)


def _beats_spread(s, depths):
  c = s["derived"]["rho_minus_disp"]
  return above(c, 0.0), f"{_ci(c)} (depth mean of rho(C) - best rho(dispersion))"


def _nll_positive(s, depths):
  cal = s["calibration"]
  v = every([above(cal["nll_gain"], 0.0), above(cal["nll_gain_vs_onehot"], 0.0)])
  return v, (f"vs log-depth {_ci(cal['nll_gain'])}, vs one mean per depth "
             f"{_ci(cal['nll_gain_vs_onehot'])} nats")


def _coverage_by_depth(s, depths):
  cal = s["calibration"]["c_logdepth"]
  v = every([band(c, 0.603, 0.763) for c in cal["cov68_by_depth"]])
  return v, _per_depth(cal["cov68_by_depth"], depths)


def _ood_beats_disp(s, depths):
  o = s["ood"]
  return above(o["C_minus_best_disp"], 0.0), (f"{_ci(o['C_minus_best_disp'])}; true error E "
                                              f"itself: {_ci(o['E_depth_mean'])}")


def _cut_per_depth(s, depths):
  c = s["selective"]["by_depth_C_mean"]
  return above(c, 0.0), f"{_ci(c)} (depth mean; oracle " \
      f"{_per_depth(s['selective']['by_depth']['oracle'], depths)})"


def _pooled_inflated(s, depths):
  c = s["derived"]["under_pooled_minus_fixed"]
  u = s["undertrained"]
  return above(c, 0.1), (f"undertrained model: pooled {_ci(u['rho_pooled'])} vs fixed depth "
                         f"{_per_depth(u['rho_fixed'], depths)}")


def _trained_beats_under(s, depths):
  c = s["derived"]["trained_minus_under"]
  return above(c, 0.0), f"{_ci(c)} (depth mean of rho(C) trained - undertrained)"


CLAIMS = (
    Claim("fixed_depth", "C_i ranks rollout error at fixed depth: Spearman 0.91-0.98",
          "CI above 0.80 at every depth", _fixed),
    Claim("within_trajectory", "ranking within trajectories: Spearman 0.69 +- 0.16",
          "depth mean of the within-trajectory mean Spearman: CI above 0.53 (= 0.69 - 0.16)",
          _within),
    Claim("calibrator_width", "calibrator interval factors 1.14x (68%) / 1.29x (95%)",
          "68% factor exp(sigma): CI below 1.20", _width, needs="calibration"),
    Claim("calibrator_coverage", "calibrator coverage near nominal (68% / 95%)",
          "held-out coverage CIs inside [0.60, 0.76] (68%) and [0.91, 0.99] (95%)", _coverage,
          needs="calibration"),
    Claim("calibrator_nll", "calibrator one nat better than depth-only (held-out NLL)",
          "NLL gain over the depth-only calibrator: CI above 0.5 nats", _nll,
          needs="calibration"),
    Claim("ood_auroc", "OOD AUROC 0.98, 1.0 by depth 10",
          "depth-mean AUROC of C: CI above 0.90, and at the deepest depth above 0.95", _auroc,
          needs="ood"),
    Claim("dispersion_inverts", "sampling-dispersion baselines invert on OOD data (AUROC < 0.5)",
          "depth-mean AUROC of raw and of normalised dispersion: both CIs below 0.5", _inverts,
          needs="ood"),
    Claim("selective_cut", "15% error cut at 80% coverage",
          "depth mean of the per-depth cut ranking by C_i: CI above 0.10 (pooled over depths, "
          "ranking by depth alone earns about the whole pooled cut, as the depth-only column "
          "shows, so the pooled cut does not measure C_i)", _cut15, needs="selective"),
    Claim("selective_vs_depth", "the cut is three times the depth-only baseline's",
          "pooled (C cut - 3 x depth-only cut) and the C cut itself: both CIs above 0", _cut3x,
          needs="selective"),
    Claim("specialists", "bidirectional training beats direction specialists in both directions",
          "log(specialist / bidirectional error), averaged over depths: both CIs above 0",
          _specialists, needs="specialists.gain_fwd"),
    Claim("inverse_solver", "the backward direction works as an inverse solver",
          "error recovering x_0 from the true x_i below the trivial x_0 := x_i: "
          "log-ratio CI above 0 at every depth", _inverse, needs="inverse"),
    # Weaker forms and controls (not claims of the paper).
    Claim("fixed_depth_positive", "weaker: C_i ranks error at fixed depth better than chance",
          "Spearman CI above 0 at every depth", _fixed_positive, control=True),
    Claim("beats_spread", "control: C_i ranks error better than the sample spread (M samples)",
          "depth-mean Spearman difference: CI above 0", _beats_spread, needs="derived",
          control=True),
    Claim("calibrator_nll_positive", "weaker: the calibrator with C beats depth-only at all",
          "NLL gain CI above 0 vs both depth-only calibrators", _nll_positive,
          needs="calibration", control=True),
    Claim("coverage_by_depth", "control: the 68% interval is calibrated at each depth",
          "per-depth coverage CI inside [0.60, 0.76] at every depth", _coverage_by_depth,
          needs="calibration", control=True),
    Claim("ood_beats_dispersion", "weaker: C_i detects OOD better than sampling dispersion",
          "depth-mean AUROC(C) - best dispersion AUROC: CI above 0", _ood_beats_disp,
          needs="ood", control=True),
    Claim("selective_per_depth", "weaker: ranking by C_i cuts error at each fixed depth",
          "depth mean of the per-depth cut: CI above 0", _cut_per_depth, needs="selective",
          control=True),
    Claim("pooled_inflated", "control: pooling over depths inflates Spearman (spec's lesson)",
          "undertrained model, pooled minus depth-mean fixed-depth Spearman: CI above 0.1",
          _pooled_inflated, needs="undertrained", control=True),
    Claim("trained_vs_undertrained", "control: training improves the fixed-depth ranking",
          "depth-mean Spearman, trained - undertrained: CI above 0", _trained_beats_under,
          needs="undertrained", control=True),
)


def _has(summary: dict, path: str) -> bool:
  node: Any = summary
  for part in path.split("."):
    if not isinstance(node, dict) or part not in node:
      return False
    node = node[part]
  return True


def deciding_systems(summaries: dict[str, dict], roles: dict[str, str]) -> list[str]:
  """The fair systems that pass the skill gate: the only ones entering the overall verdict."""
  return [n for n, s in summaries.items() if roles[n] == "fair" and skill_gate(s)]


def judge_all(summaries: dict[str, dict], roles: dict[str, str], depths: dict[str, tuple]
              ) -> list[dict]:
  """Verdicts of every claim on every system that has the data, and across the deciding
  systems (fair tests whose model passes the skill gate)."""
  deciding = deciding_systems(summaries, roles)
  out = []
  for claim in CLAIMS:
    cells = {}
    for name, s in summaries.items():
      if _has(s, claim.needs):
        verdict, ours = claim.judge(s, depths[name])
        cells[name] = {"verdict": verdict, "ours": ours, "role": roles[name]}
    votes = [c["verdict"] for n, c in cells.items() if n in deciding]
    out.append({"id": claim.id, "paper": claim.paper, "rule": claim.rule,
                "control": claim.control, "systems": cells,
                "verdict": overall(votes) if votes else INCONCLUSIVE,
                "deciding_systems": [n for n in cells if n in deciding]})
  return out
