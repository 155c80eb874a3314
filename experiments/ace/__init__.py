"""ACE at CPU scale, on the calibrated GRPO testbed without KL: pass@k, overconfident errors,
and how selective the confidence penalty is.

Paper: "ACE: Asymmetric Confidence-aware Error penalty" (no public code; the recipe follows the
best reading in ``rlpost.objectives.recipes.ace``). Claims checked: (1) pass@64 improves over
GRPO (the primary claim), (2) pass@1 holds, (3) the gain grows with k, (4) fewer overconfident
errors (wrong rollouts the policy made more likely than the reference did), (5) slower entropy
collapse.

Command:  python scripts/reproduce.py ace [--quick] [--seeds N] [--out DIR]
Hardware: 2 CPU cores. Setup (pre-declared in ``Sizes`` before the run): the calibrated testbed
of ``experiments/calibrate.py`` (setting ``b23-lr1e-4-kl0-p64``: 2-3 digit addition, whose
3-digit problems the SFT policy solves sometimes and whose pass@64 is not saturated, the
0.4M-parameter character decoder SFT-started on that band, 64 prompts x G=8 per step, 0/1
reward, AdamW lr 1e-4, 100 steps) with **no KL** in either arm: the paper's base (DAPO) has
none, and KL to the SFT policy is what kept the confidence shift small in the previous design.
Arms: GRPO and the pre-declared ACE (softplus, multiplicative, alpha 0.5, over GRPO); other
alphas, if run, are exploratory and never judged. Both arms run the reference pass every step
(``log_confidence``), so the confidence diagnostics exist for GRPO too.

Primary metric (pre-declared): test pass@64 (unbiased estimator from 64 samples of 200 test
problems at temperature 1), the mean of each seed's last 3 evaluations (steps 60, 80, 100);
pass@1, pass@64 - pass@1 and the token entropy use the same window; overconfident errors are
the mean over the second half of training. Seeds: 8 per arm, from ``stats.seeds_needed`` at the
pilot SD 0.0075 (pass@64 over the last 3 evaluations, previous design: 0.007 GRPO, 0.008 ACE)
and the minimum effect 0.015, floor 8. GRPO must learn first: its pass@1 gain over the SFT start
is judged as a gate (its own family) before the ACE claims are read.

Selectivity: every step logs, over the wrong rollouts, the 10/50/90% quantiles of the confidence
shift c (its sum of logp - ref_logp) and the share of their sum softplus(c) that falls on the
overconfident ones (c > 0). ACE multiplies a negative advantage by 1 + alpha softplus(c), so
these describe its extra weight per wrong rollout before the advantage's size: the penalty
itself is |A| alpha softplus(c), which varies with the group's accuracy and is 0 in all-wrong
groups (A = 0), which the share still counts.

The paper's own setup at full size (accelerators, not run here): ``experiments/ace/full.py``.

Outputs in ``--out`` (default ``results/ace``): ``table.md``, ``results.json``, ``passk.png``,
``training.png``; finished arms are cached under ``cache/``.

The numbers this table last produced are in ``results/ace/table.md``, and copied into the results
section of ``experiments/ace/README.md`` by ``experiments/docsync.py``.
"""

from __future__ import annotations

import dataclasses
import importlib
import os

import numpy as np

from experiments import harness, rl_seeds
from rlpost.eval import stats

# "pass@1 holds": the largest pass@1 difference (either way) that counts as holding, the one point
# of the claim as first stated ("no loss beyond 1 point"); the margin of its equivalence test.
PASS1_MARGIN = 0.01
WINDOW_METRICS = ("pass@", "token_entropy")


@dataclasses.dataclass(frozen=True)
class Sizes:
  """The pre-declared design. Defaults fit ~40 minutes on 2 CPU cores."""

  seeds: int = 8
  seed_offset: int = 0  # the first seed (a replication runs seeds the table did not use)
  steps: int = 100
  eval_every: int = 20
  window: int = 3
  group_size: int = 8
  main_alpha: float = 0.5
  exploratory_alphas: tuple = ()
  eval_problems: int = 200
  eval_samples: int = 64
  pilot_sd: float = 0.0075
  min_effect: float = 0.015
  min_seeds: int = 8
  base: dict = dataclasses.field(default_factory=dict)
  # full-size runs (``full``): the base arm's and the main arm's names, and the setting in words
  base_arm: str = "grpo"
  main_name: str = ""
  setting: str = ""
  sd_source: str = ""  # where pilot_sd comes from when not the CPU pilot (full-size runs)


def sizes(quick: bool) -> Sizes:
  if not quick:
    return Sizes()
  tiny = dict(rl_seeds.QUICK_BASE, num_prompts=4, sft_steps=400, sft_lr=3e-3,
              task_spec=dict(min_digits=1, max_digits=2, terms=2))
  return Sizes(seeds=2, steps=3, eval_every=1, window=2, group_size=4, eval_problems=8,
               eval_samples=8, min_seeds=2, base=tiny)


def seeds_from_power(sz: Sizes) -> int:
  return max(sz.min_seeds, stats.seeds_needed(sz.pilot_sd, sz.min_effect))


def main_arm(sz: Sizes) -> str:
  return sz.main_name or f"ace-softplus-mul-{sz.main_alpha}"


def _ks(sz: Sizes) -> list[int]:
  return [k for k in (1, 2, 4, 8, 16, 32, 64) if k <= sz.eval_samples]


def _gain_growth_metric(kmax: int) -> str:
  return f"pass@{kmax} - pass@1"


def claims(sz: Sizes) -> list[harness.Claim]:
  """The gate (family "testbed": GRPO's pass@1 over the SFT start, filled in by ``summarize``)
  and the paper's claims about the main arm against GRPO (family "ace").

  "Gains grow with k" compares two gains, at k = kmax and at k = 1. Arms are unpaired, so it is
  judged on a per-seed derived metric, pass@kmax - pass@1: the difference of its arm means,
  ACE minus GRPO, is the gain at kmax minus the gain at 1.
  """
  kmax = max(_ks(sz))
  base = sz.base_arm
  pair = (main_arm(sz), base)
  return [
      harness.Claim("grpo_learns", f"{base} gains pass@1 over the SFT start", "pass@1", (base,),
                    family="testbed"),
      harness.Claim("pass_at_kmax_improves", f"pass@{kmax} improves", f"pass@{kmax}", pair,
                    family="ace", sesoi=sz.min_effect),
      harness.Claim("pass1_holds", f"pass@1 holds (within {PASS1_MARGIN:g})", "pass@1", pair,
                    "equivalent", PASS1_MARGIN, "ace"),
      harness.Claim("passk_gain_grows_with_k",
                    f"pass@k gains grow with k (per seed: pass@{kmax} - pass@1)",
                    _gain_growth_metric(kmax), pair, family="ace", sesoi=sz.min_effect),
      harness.Claim("fewer_overconfident_errors", "fewer overconfident errors",
                    "overconfident_errors", pair, "less", family="ace"),
      harness.Claim("slower_entropy_collapse",
                    "slower entropy collapse (higher token entropy)", "token_entropy", pair,
                    family="ace"),
  ]


def arms(sz: Sizes) -> dict:
  """{arm name: ACE recipe kwargs} (None: plain GRPO); the main arm second, then exploratory
  alphas."""
  out = {"grpo": None, main_arm(sz): {"alpha": sz.main_alpha}}
  for a in sz.exploratory_alphas:
    out[f"ace-softplus-mul-{a}"] = {"alpha": a}
  return out


def arm_config(base: dict, recipe_args: dict | None, *, kl_coef: float | None = None) -> dict:
  """The RLConfig dict of an arm; ``kl_coef`` None keeps the recipes' own (GRPO's 0.04)."""
  kl = {} if kl_coef is None else {"kl_coef": kl_coef}
  if recipe_args is None:
    return dict(base, recipe="grpo", recipe_args=kl)
  return dict(base, recipe="ace", recipe_args=dict(recipe_args, **kl))


def base_config(sz: Sizes) -> dict:
  from experiments import calibrate

  cfg = calibrate.testbed_config("b23-lr1e-4-kl0-p64")
  cfg.update(steps=sz.steps, group_size=sz.group_size, eval_every=sz.eval_every,
             eval_problems=sz.eval_problems, eval_samples=sz.eval_samples,
             log_confidence=True, checkpoint_every=10 ** 9)
  cfg.update(sz.base)
  return cfg


def get_config(quick: bool) -> dict:
  return dataclasses.asdict(sizes(quick))


def _sizes(config: dict) -> Sizes:
  return Sizes(**dict(config, exploratory_alphas=tuple(config["exploratory_alphas"])))


def units(config: dict) -> dict:
  sz = _sizes(config)
  base = base_config(sz)
  cfgs = {name: arm_config(base, kw, kl_coef=0.0) for name, kw in arms(sz).items()}
  return rl_seeds.arm_units(cfgs, list(range(sz.seed_offset, sz.seed_offset + sz.seeds)))


def replicate(config: dict, seeds: int, seed_offset: int) -> dict:
  """The committed design's main arms (GRPO and the main ACE arm) at fresh seeds."""
  return dict(config, seeds=seeds, seed_offset=seed_offset, exploratory_alphas=[])


def _window(arm: dict, key: str, window: int) -> np.ndarray:
  """[S] the mean of each seed's last ``window`` evaluations (step 0 excluded)."""
  evals = arm["evals"][1:][-window:]
  return np.array([[e["per_seed"][i][key] for e in evals]
                   for i in range(len(arm["seeds"]))]).mean(axis=1)


def _train_mean(arm: dict, key: str) -> np.ndarray:
  """[S] mean of a training metric over the second half of training, per seed."""
  v = np.asarray(arm["train"][key])  # [steps, S]
  return v[len(v) // 2:].mean(axis=0)


MAIN = main_arm(Sizes())
SELECTIVITY = ("shift_wrong_p10", "shift_wrong_p50", "shift_wrong_p90",
               "penalty_share_overconfident", "confidence_shift")


def per_seed(results: dict, sz: Sizes) -> dict:
  """{metric: {arm: [S] per-seed values}}: the pre-declared metrics (pass@k and token entropy
  over the last ``window`` evaluations, overconfident errors and the selectivity diagnostics
  over the second half of training, and the derived pass@kmax - pass@1)."""
  ks, kmax = _ks(sz), max(_ks(sz))
  out = {key: {n: _window(arm, key, sz.window) for n, arm in results.items()}
         for key in [f"pass@{k}" for k in ks] + ["token_entropy"]}
  for key in ("overconfident_errors",) + SELECTIVITY:
    out[key] = {n: _train_mean(arm, key) for n, arm in results.items()}
  out[_gain_growth_metric(kmax)] = {n: out[f"pass@{kmax}"][n] - out["pass@1"][n] for n in results}
  return out


def _softplus(x):
  return float(np.logaddexp(0.0, x))


def summarize(report: dict) -> dict:
  results, sz = report["data"], _sizes(report["config"])
  ks = _ks(sz)
  cols = [f"pass@{k}" for k in ks] + ["token_entropy", "overconfident_errors"]
  s = {"ks": ks, "cells": {}, "gain": {}, "start": {}, "selectivity": {},
       "seeds_from_power": seeds_from_power(sz), "main": main_arm(sz),
       "arm_seconds": {n: a["seconds"] for n, a in results.items()}}
  first = results[sz.base_arm]["evals"][0]["per_seed"]
  for key in [f"pass@{k}" for k in ks] + ["token_entropy"]:
    s["start"][key] = float(np.mean([e[key] for e in first]))
  values = per_seed(results, sz)
  for name in results:
    s["cells"][name] = {key: harness.cell(values[key][name]) for key in cols}
    if name != sz.base_arm:
      s["gain"][name] = {key: harness.diff_cell(values[key][name], values[key][sz.base_arm])
                         for key in cols}
    sel = {key: harness.cell(values[key][name]) for key in SELECTIVITY}
    # ACE's weight 1 + alpha softplus(c) is increasing in c: its quantiles over the wrong
    # rollouts are the weights at c's quantiles (here the seed means of c's quantiles).
    sel["weight_at"] = {q: 1.0 + sz.main_alpha * _softplus(sel[f"shift_wrong_{q}"]["mean"])
                        for q in ("p10", "p50", "p90")}
    s["selectivity"][name] = sel
  judged, s["base_learned"] = harness.judge_gated(claims(sz), values,
                                                  start=s["start"]["pass@1"], table="ace")
  s["claims"] = [v.to_json() for v in judged]
  s["verdicts"] = {v.claim.id: v.verdict for v in judged}
  return s


def _setting(sz: Sizes) -> str:
  from experiments import calibrate

  return sz.setting or f"{calibrate.describe(base_config(sz))}, no KL"


def render(report: dict) -> str:
  s, sz = report["summary"], _sizes(report["config"])
  ks = s["ks"]
  cols = [f"pass@{k}" for k in ks] + ["token_entropy", "overconfident_errors"]
  names = list(s["cells"])
  paper = [c for c in s["claims"] if c["claim"]["family"] == "ace"]
  gate = [c for c in s["claims"] if c["claim"]["family"] == "testbed"]
  mdes = [c["mde"] for c in paper]
  kmax = max(ks)
  lines = [
      "# ACE at full size" if report.get("full") else "# ACE at CPU scale", "",
      f"`{report['command']}`: {harness.seeds_note(sz, s['seeds_from_power'])}, {sz.steps} RL steps, G={sz.group_size}, {_setting(sz)}. "
      f"Primary metric: test pass@{kmax} "
      f"({sz.eval_problems or 'all'} problems x {sz.eval_samples} samples), the mean of each seed's "
      f"last {sz.window} evaluations. Minimum detectable effect of the ACE claims: "
      f"{min(mdes):.3f}-{max(mdes):.3f}. {harness.wall_time(report)} Cells: mean [95% t "
      "interval over seeds]; "
      "differences: Welch intervals. Intervals exclude problem-sampling error (every arm is "
      "evaluated on the same fixed test problems with the same evaluation key). SFT start: "
      + ", ".join(f"pass@{k} {s['start'][f'pass@{k}']:.3f}" for k in ks)
      + f", token entropy {s['start']['token_entropy']:.3f}.", "",
      "## Test pass@k (last-3 mean)", "",
      "| arm | " + " | ".join(f"pass@{k}" for k in ks)
      + " | token entropy | overconfident errors (2nd half) | minutes |",
      "| --- | " + " | ".join("---" for _ in ks) + " | --- | --- | --- |"]
  for n in names:
    c = s["cells"][n]
    tag = "" if n in (sz.base_arm, s["main"]) else " (exploratory)"
    lines.append(f"| {n}{tag} | " + " | ".join(harness.fmt(c[key]) for key in cols)
                 + f" | {harness.minutes(s['arm_seconds'][n])} |")
  lines += ["", "## ACE minus GRPO", "",
            "| arm | " + " | ".join(f"pass@{k}" for k in ks) + " | token entropy | overconfident errors |",
            "| --- | " + " | ".join("---" for _ in ks) + " | --- | --- |"]
  for n, g in s["gain"].items():
    lines.append(f"| {n} | " + " | ".join(harness.fmt(g[key]) for key in cols) + " |")
  lines += ["", "## How selective the penalty was", "",
            "Over the wrong rollouts of each step, second half of training (mean [95% t "
            "interval] over seeds): quantiles of the confidence shift c, the share of sum "
            "softplus(c) on overconfident ones (c > 0), and ACE's multiplier "
            f"1 + {sz.main_alpha} softplus(c) of a negative advantage at c's quantiles. These "
            "describe ACE's extra weight before the advantage's size: the extra penalty is "
            "|A| alpha softplus(c), 0 in all-wrong groups (A = 0), which the share still counts.",
            "", "| arm | c p10 | c p50 | c p90 | share of softplus(c) on c > 0 | weight at p10 / "
            "p50 / p90 |", "| --- | --- | --- | --- | --- | --- |"]
  for n, sel in s["selectivity"].items():
    w = sel["weight_at"]
    lines.append(f"| {n} | {harness.fmt(sel['shift_wrong_p10'])} | "
                 f"{harness.fmt(sel['shift_wrong_p50'])} | {harness.fmt(sel['shift_wrong_p90'])} "
                 f"| {harness.fmt(sel['penalty_share_overconfident'])} | {w['p10']:.2f} / "
                 f"{w['p50']:.2f} / {w['p90']:.2f} |")
  lines += ["", f"## Paper claims (main arm, pre-declared: {s['main']})", "",
            "The gate (GRPO's pass@1 over the SFT start, one-sample t against it) must pass "
            "before the ACE claims are read:", "", *harness.verdict_rows(gate), "",
            ("Gate passed: GRPO learns." if s["base_learned"] else
             "**Gate failed**: GRPO did not demonstrably learn, so the ACE claims below compare "
             "arms of a testbed where the base method does not learn."), "",
            f"{s['main']} against {sz.base_arm}, {sz.seeds} seeds per arm; one Holm family of "
            f"{len(paper)} claims. Exploratory arms are not judged.", "",
            *harness.verdict_rows(paper), "",
            harness.protocol_note(paper), "", harness.rules_note(s["claims"]),
            f"\"pass@k gains grow with k\" is judged on each seed's pass@{kmax} - pass@1: the "
            f"arms are unpaired, so ACE minus GRPO of its means is the gain at k = {kmax} minus "
            "the gain at k = 1. It is therefore close to implied by the two claims before it "
            f"(pass@{kmax} improves, pass@1 holds): not independent evidence.", ""]
  return "\n".join(lines)


def plot(report: dict, out_dir: str) -> list[str]:
  results, s = report["data"], report["summary"]
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  ks = s["ks"]
  fig, ax = plt.subplots(figsize=(5.5, 3.6))
  for n, c in s["cells"].items():
    harness.errorbars(ax, ks, [c[f"pass@{k}"] for k in ks], label=n, capsize=2,
                      lw=2.5 if n in (report["config"].get("base_arm", "grpo"), s["main"]) else 1)
  ax.plot(ks, [s["start"][f"pass@{k}"] for k in ks], "k:", label="SFT start")
  ax.set_xscale("log", base=2)
  ax.set_xlabel("k")
  ax.set_ylabel("test pass@k (last-3 mean)")
  ax.legend(fontsize=7)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "passk.png"), dpi=120)
  plt.close(fig)

  fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
  for n in (report["config"].get("base_arm", "grpo"), s["main"]):
    arm = results[n]
    for ax, key in zip(axes[:2], ("overconfident_errors", "shift_wrong_p50")):
      v = np.asarray(arm["train"][key]).mean(axis=1)
      w = max(1, len(v) // 20)
      ax.plot(np.arange(w, len(v) + 1), np.convolve(v, np.ones(w) / w, "valid"), label=n)
    steps = [e["step"] for e in arm["evals"]]
    axes[2].plot(steps, [np.mean([x["token_entropy"] for x in e["per_seed"]]) for e in arm["evals"]],
                 "o-", label=n)
  axes[0].set_ylabel("overconfident errors (share of rollouts)")
  axes[1].set_ylabel("median confidence shift of wrong rollouts")
  axes[2].set_ylabel("token entropy of test samples (nats)")
  for ax in axes:
    ax.set_xlabel("RL step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "training.png"), dpi=120)
  plt.close(fig)
  return [os.path.join(out_dir, f) for f in ("passk.png", "training.png")]


def from_full_runs(runs_dir: str, prefix: str) -> tuple[dict, dict]:
  """Full-size runs of ``experiments/ace/full.py`` (DAPO and ACE over DAPO) as this table's
  config and data: the DAPO arm in GRPO's place, ``ace-dapo-0.5`` as the main arm, the other
  alphas exploratory."""
  full_size = importlib.import_module("experiments.ace.full")
  from experiments.full_size import power_fields

  runs = harness.collect_runs(runs_dir, full_size.FULL,
                              select={n for n in full_size.FULL if n.startswith(prefix)})
  main = f"ace-dapo-{full_size.MAIN_ALPHA}"
  missing = [n for n in ("dapo", main) if n not in runs]
  if missing:
    raise harness.RunsError(f"ace --full: no runs under {runs_dir} for arm(s) "
                            f"{', '.join(missing)}")
  cfg = runs[main]["config"]
  for name, arm in runs.items():
    if any(k not in arm["train"] for k in ("overconfident_errors",) + SELECTIVITY):
      raise harness.RunsError(f"ace --full: the runs of {name} ({arm['runs'][0]}) logged no "
                              "confidence diagnostics; run them with log_confidence=true")
  sz = Sizes(seeds=min(len(r["seeds"]) for r in runs.values()), steps=cfg["steps"],
             eval_every=cfg["eval_every"], group_size=cfg["group_size"],
             main_alpha=full_size.MAIN_ALPHA, eval_problems=cfg["eval_problems"],
             eval_samples=cfg["eval_samples"], base_arm="dapo", main_name=main,
             **power_fields(),
             setting=f"full size (experiments/ace/full.py: {cfg['task']}, "
                     f"{cfg['num_prompts']} prompts per step, lr {cfg['lr']:g}, DAPO base)")
  order = ["dapo", main] + sorted(n for n in runs if n not in ("dapo", main))
  return dataclasses.asdict(sz), {n: runs[n] for n in order}


EXPERIMENT = harness.Experiment(name="ace", get_config=get_config, units=units,
                                summarize=summarize, render=render, plot=plot,
                                module="experiments.ace", full=from_full_runs,
                                replicate=replicate)
