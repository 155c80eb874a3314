"""ACE at CPU scale: pass@k for k = 1..64, overconfident errors and entropy over training.

Paper: "ACE: Asymmetric Confidence-aware Error penalty" (no public code; the recipe follows the
best reading in ``rlpost.objectives.recipes.ace``). Claims checked: (1) pass@k gains over GRPO
grow with k while pass@1 holds; (2) fewer overconfident errors (wrong rollouts the policy made
more likely than the reference did); (3) slower entropy collapse.

Command:  python scripts/reproduce.py ace [--quick] [--seeds N] [--out DIR]
Hardware: 2 CPU cores. Setup: 1-4 digit addition from the cached SFT policy of
``experiments/grpo_arithmetic.py``; G=8, 8 prompts per step, 0/1 reward, GRPO's loss (KL 0.04
to the SFT policy). Arms: GRPO; ACE multiplicative softplus with alpha in {0.1, 0.5, 2.0} (no
published default: a sweep); ACE relu and ACE additive at the pre-declared main alpha 0.5.
Verdicts use the pre-declared main arm (multiplicative softplus, alpha 0.5), never the best of
the sweep. Evaluation: pass@k from 64 samples per test problem (unbiased estimator), token
entropy of the samples; training logs the share of overconfident errors every step.

The paper's own setup at full size (accelerators, not run here): ``experiments/ace/full.py``.

Outputs in ``--out`` (default ``results/ace``): ``table.md``, ``results.json``, ``passk.png``,
``training.png``; finished arms are cached under ``cache/``. The full table, with plots, is in
``results/ace/table.md``; its paper-claims part is below.

Results on this CPU (generated from results/ace/table.md; do not edit by hand):

`python scripts/reproduce.py ace`: 10 seeds per arm, 200 RL steps, G=8; pass@k from 200 test problems x 64 samples; 37.2 min on this machine. Cells: mean [95% t interval over seeds]; differences: Welch intervals. SFT start: pass@1 0.356, pass@2 0.439, pass@4 0.510, pass@8 0.577, pass@16 0.636, pass@32 0.685, pass@64 0.730, token entropy 0.755.

## Paper claims (main arm, pre-declared: ace-softplus-mul-0.5)

ace-softplus-mul-0.5 against grpo, 10 seeds per arm; one Holm family of 5 claims. pass@k and token entropy at the final evaluation, overconfident errors averaged over the second half of training (the metrics declared with the run). Intervals exclude problem-sampling error (every arm is evaluated on the same fixed test problems with the same evaluation key). The other arms (the alpha sweep and the variants) are described above, not judged.

| claim (paper) | ours: a - b [interval] | p (Holm) | permutation p | seeds | min. detectable | verdict |
| --- | --- | --- | --- | --- | --- | --- |
| pass@k gains grow with k (per seed: pass@64 - pass@1) | ace-softplus-mul-0.5: +0.004 [-0.013, +0.022] | 0.306 (0.915) | 0.303 | 10 vs 10 | 0.025 | inconclusive |
| pass@64 improves | ace-softplus-mul-0.5: +0.008 [-0.010, +0.026] | 0.179 (0.896) | 0.194 | 10 vs 10 | 0.025 | inconclusive |
| pass@1 holds (within 0.01) | ace-softplus-mul-0.5: +0.004 [-0.011, +0.018] | 0.229 (0.915) | 0.663 | 10 vs 10 | 0.024 | inconclusive |
| fewer overconfident errors | ace-softplus-mul-0.5: -0.002 [-0.015, +0.011] | 0.369 (0.915) | 0.365 | 10 vs 10 | 0.019 | inconclusive |
| slower entropy collapse (higher final token entropy) | ace-softplus-mul-0.5: +0.004 [-0.007, +0.015] | 0.232 (0.915) | 0.224 | 10 vs 10 | 0.016 | inconclusive |

Statistics: TOST (Welch), margin 0.01; Welch interval and one-sided Welch test at 95%, Holm-adjusted within each family; 10 seeds per arm; pooled seed SD up to 0.0188; minimum detectable effect (80% power) 0.0158-0.025.

Rules (`experiments/harness.py`): a directional claim is reproduced when its Holm-adjusted one-sided p is <= 0.05 and its 95% interval lies beyond the margin (0), not reproduced when the interval lies on the other side of the margin, inconclusive otherwise; an equivalence claim (margin 0.01) is reproduced when TOST rejects (Holm-adjusted), not reproduced when its 90% interval lies wholly outside the margin, inconclusive otherwise. The permutation p (not adjusted) is reported beside the deciding test. Min. detectable: the difference a two-sided test at 80% power would find at these seeds and this seed SD.
"pass@k gains grow with k" is judged on each seed's pass@64 - pass@1: the arms are unpaired, so ACE minus GRPO of its means is the gain at k = 64 minus the gain at k = 1.

(end of generated results)
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from experiments import harness, rl_seeds

MAIN = "ace-softplus-mul-0.5"

# "pass@1 holds": the largest pass@1 difference (either way) that counts as holding, the one point
# of the claim as first stated ("no loss beyond 1 point"); the margin of its equivalence test.
PASS1_MARGIN = 0.01


@dataclasses.dataclass(frozen=True)
class Sizes:
  seeds: int = 10
  steps: int = 200
  group_size: int = 8
  alphas: tuple = (0.1, 0.5, 2.0)
  main_alpha: float = 0.5
  eval_every: int = 50
  eval_problems: int = 200
  eval_samples: int = 64
  base: dict = dataclasses.field(default_factory=lambda: dict(num_prompts=8))


def _gain_growth_metric(kmax: int) -> str:
  return f"pass@{kmax} - pass@1"


def claims(sz: Sizes) -> list[harness.Claim]:
  """The paper's claims about the pre-declared main arm against GRPO, as data (one Holm family).

  "Gains grow with k" compares two gains, at k = kmax and at k = 1. Arms are unpaired, so it is
  judged on a per-seed derived metric, pass@kmax - pass@1: the difference of its arm means,
  ACE minus GRPO, is the gain at kmax minus the gain at 1.
  """
  kmax = max(_ks(sz))
  pair = (f"ace-softplus-mul-{sz.main_alpha}", "grpo")
  return [
      harness.Claim("passk_gain_grows_with_k",
                    f"pass@k gains grow with k (per seed: pass@{kmax} - pass@1)",
                    _gain_growth_metric(kmax), pair, family="ace"),
      harness.Claim("pass_at_kmax_improves", f"pass@{kmax} improves", f"pass@{kmax}", pair,
                    family="ace"),
      harness.Claim("pass1_holds", f"pass@1 holds (within {PASS1_MARGIN:g})", "pass@1", pair,
                    "equivalent", PASS1_MARGIN, "ace"),
      harness.Claim("fewer_overconfident_errors", "fewer overconfident errors",
                    "overconfident_errors", pair, "less", family="ace"),
      harness.Claim("slower_entropy_collapse",
                    "slower entropy collapse (higher final token entropy)", "token_entropy", pair,
                    family="ace"),
  ]


def sizes(quick: bool) -> Sizes:
  if not quick:
    return Sizes()
  tiny = dict(rl_seeds.QUICK_BASE, num_prompts=4)
  return Sizes(seeds=2, steps=3, group_size=4, alphas=(0.5,), eval_every=3, eval_problems=8,
               eval_samples=8, base=tiny)


def arms(sz: Sizes) -> dict:
  """{arm name: recipe kwargs} (None: plain GRPO)."""
  out = {"grpo": None}
  for a in sz.alphas:
    out[f"ace-softplus-mul-{a}"] = {"alpha": a}
  out[f"ace-relu-mul-{sz.main_alpha}"] = {"alpha": sz.main_alpha, "fn": "relu"}
  out[f"ace-softplus-add-{sz.main_alpha}"] = {"alpha": sz.main_alpha, "mode": "additive"}
  return out


def arm_config(base: dict, recipe_args: dict | None) -> dict:
  if recipe_args is None:
    return dict(base, recipe="grpo", recipe_args={})
  return dict(base, recipe="ace", recipe_args=dict(recipe_args))


def base_config(sz: Sizes) -> dict:
  from experiments.grpo_arithmetic import CONFIG

  cfg = dict(CONFIG, steps=sz.steps, group_size=sz.group_size, eval_every=sz.eval_every,
             eval_problems=sz.eval_problems, eval_samples=sz.eval_samples,
             checkpoint_every=10 ** 9)
  cfg.update(sz.base)
  return cfg


def get_config(quick: bool) -> dict:
  return dataclasses.asdict(sizes(quick))


def _sizes(config: dict) -> Sizes:
  return Sizes(**dict(config, alphas=tuple(config["alphas"])))


def units(config: dict) -> dict:
  sz = _sizes(config)
  base = base_config(sz)
  cfgs = {name: arm_config(base, kw) for name, kw in arms(sz).items()}
  return rl_seeds.arm_units(cfgs, list(range(sz.seeds)))


def _ks(sz: Sizes) -> list[int]:
  return [k for k in (1, 2, 4, 8, 16, 32, 64) if k <= sz.eval_samples]


def _train_mean(arm: dict, key: str) -> np.ndarray:
  """[S] mean of a training metric over the second half of training, per seed."""
  v = np.asarray(arm["train"][key])  # [steps, S]
  return v[len(v) // 2:].mean(axis=0)


def per_seed(results: dict, sz: Sizes) -> dict:
  """{metric: {arm: [S] per-seed values}}, the pre-declared metrics: pass@k and token entropy at
  the final evaluation, overconfident errors averaged over the second half of training, and the
  derived pass@kmax - pass@1 of the final evaluation."""
  ks, kmax = _ks(sz), max(_ks(sz))
  out = {key: {n: rl_seeds.final_metric(arm, key) for n, arm in results.items()}
         for key in [f"pass@{k}" for k in ks] + ["token_entropy"]}
  out["overconfident_errors"] = {n: _train_mean(arm, "overconfident_errors")
                                 for n, arm in results.items()}
  out[_gain_growth_metric(kmax)] = {n: out[f"pass@{kmax}"][n] - out["pass@1"][n] for n in results}
  return out


def summarize(report: dict) -> dict:
  results, sz = report["data"], _sizes(report["config"])
  ks = _ks(sz)
  cols = [f"pass@{k}" for k in ks] + ["token_entropy", "overconfident_errors"]
  s = {"ks": ks, "cells": {}, "gain": {}, "start": {}}
  first = results["grpo"]["evals"][0]["per_seed"]
  for key in [f"pass@{k}" for k in ks] + ["token_entropy"]:
    s["start"][key] = float(np.mean([e[key] for e in first]))
  values = per_seed(results, sz)
  for name in results:
    s["cells"][name] = {key: harness.cell(values[key][name]) for key in cols}
    if name != "grpo":
      s["gain"][name] = {key: harness.diff_cell(values[key][name], values[key]["grpo"])
                         for key in cols}
  judged = harness.judge_family(claims(sz), values)
  s["claims"] = [v.to_json() for v in judged]
  s["verdicts"] = {v.claim.id: v.verdict for v in judged}
  s["main"] = f"ace-softplus-mul-{sz.main_alpha}"
  return s


def render(report: dict) -> str:
  s, sz = report["summary"], _sizes(report["config"])
  ks = s["ks"]
  cols = [f"pass@{k}" for k in ks] + ["token_entropy", "overconfident_errors"]
  names = list(s["cells"])
  lines = ["# ACE at CPU scale", "",
           f"`{report['command']}`: {sz.seeds} seeds per arm, {sz.steps} RL steps, G={sz.group_size}; "
           f"pass@k from {sz.eval_problems} test problems x {sz.eval_samples} samples; "
           f"{report['seconds'] / 60:.1f} min on this machine. Cells: mean [95% t interval over "
           "seeds]; differences: Welch intervals. SFT start: "
           + ", ".join(f"pass@{k} {s['start'][f'pass@{k}']:.3f}" for k in ks)
           + f", token entropy {s['start']['token_entropy']:.3f}.", "",
           "## Final test pass@k", "",
           "| arm | " + " | ".join(f"pass@{k}" for k in ks) + " | token entropy | overconfident errors (2nd half) |",
           "| --- | " + " | ".join("---" for _ in ks) + " | --- | --- |"]
  for n in names:
    c = s["cells"][n]
    lines.append(f"| {n} | " + " | ".join(harness.fmt(c[key]) for key in cols) + " |")
  lines += ["", "## ACE minus GRPO", "",
            "| arm | " + " | ".join(f"pass@{k}" for k in ks) + " | token entropy | overconfident errors |",
            "| --- | " + " | ".join("---" for _ in ks) + " | --- | --- |"]
  for n, g in s["gain"].items():
    lines.append(f"| {n} | " + " | ".join(harness.fmt(g[key]) for key in cols) + " |")
  kmax = max(ks)
  lines += ["", f"## Paper claims (main arm, pre-declared: {s['main']})", "",
            f"{s['main']} against grpo, {sz.seeds} seeds per arm; one Holm family of "
            f"{len(s['claims'])} claims. pass@k and token entropy at the final evaluation, "
            "overconfident errors averaged over the second half of training (the metrics "
            "declared with the run). Intervals exclude problem-sampling error (every arm is "
            "evaluated on the same fixed test problems with the same evaluation key). The "
            "other arms (the alpha sweep and the variants) are described above, not judged.", "",
            *harness.verdict_rows(s["claims"])]
  lines += ["", harness.protocol_note(s["claims"]), "", harness.rules_note(s["claims"]),
            f"\"pass@k gains grow with k\" is judged on each seed's pass@{kmax} - pass@1: the "
            f"arms are unpaired, so ACE minus GRPO of its means is the gain at k = {kmax} minus "
            "the gain at k = 1.", ""]
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
                      lw=2.5 if n in ("grpo", s["main"]) else 1)
  ax.plot(ks, [s["start"][f"pass@{k}"] for k in ks], "k:", label="SFT start")
  ax.set_xscale("log", base=2)
  ax.set_xlabel("k")
  ax.set_ylabel("final test pass@k")
  ax.legend(fontsize=7)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "passk.png"), dpi=120)
  plt.close(fig)

  fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
  for n in ("grpo", s["main"]):
    arm = results[n]
    v = np.asarray(arm["train"]["overconfident_errors"]).mean(axis=1)
    w = max(1, len(v) // 20)
    axes[0].plot(np.arange(w, len(v) + 1), np.convolve(v, np.ones(w) / w, "valid"), label=n)
    steps = [e["step"] for e in arm["evals"]]
    axes[1].plot(steps, [np.mean([x["token_entropy"] for x in e["per_seed"]]) for e in arm["evals"]],
                 "o-", label=n)
  axes[0].set_ylabel("overconfident errors (share of rollouts)")
  axes[1].set_ylabel("token entropy of test samples (nats)")
  for ax in axes:
    ax.set_xlabel("RL step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "training.png"), dpi=120)
  plt.close(fig)
  return [os.path.join(out_dir, f) for f in ("passk.png", "training.png")]


EXPERIMENT = harness.Experiment(name="ace", get_config=get_config, units=units,
                                summarize=summarize, render=render, plot=plot,
                                module="experiments.ace")
