"""T5: weight averaging applied to RL (GRPO) checkpoints: pass@1 level and step-to-step volatility.

Command:  python scripts/reproduce.py averaging_rl [--quick] [--seeds N] [--out DIR] [--rejudge]
Hardware: CPU (2 cores). Each seed (one ``harness.Unit``, cached by its config) trains GRPO on
1-4 digit addition from the shared cached SFT policy (``experiments/grpo_arithmetic.py``'s setup)
for 300 steps with ``rlpost.train.loop.run`` (in a temporary run directory), evaluating every 25
steps the raw policy and, beside it, LAWA (k = 5 snapshots every 10 steps) and an EMA (decay 0.95
per step) carried in the run loop (``RLConfig.averaging``). Each evaluation: 200 test problems x 8
samples, the same problems and evaluation key for every seed and policy.

Metrics per seed and policy: pass@1 at the last step, mean pass@1 over the second half of the
evaluations, and volatility = the standard deviation of the change in pass@1 between successive
evaluations. Pre-declared claims (one Holm family): each average vs the raw policy of the same run
(``paired=True``) on the second-half mean pass@1 (higher) and on the volatility (lower).

Outputs in ``--out`` (default ``results/averaging_rl``): ``table.md``, ``results.json`` (every
per-seed evaluation point of every policy, so ``--rejudge`` and the plot need nothing else),
``pass1_curves.png``.

Results on this CPU (generated from results/averaging_rl/table.md; do not edit by hand):

`python scripts/reproduce.py averaging_rl`: 3 seeds; GRPO for 300 steps, evaluated every 25 steps on 200 test problems x 8 samples; averages `lawa:k=5,every=10,as=lawa;ema:decay=0.95,as=ema`; 9.6 min on a machine not recorded. Cells: mean [95% t interval over seeds].

## Paper claims

Pre-declared metrics: the mean pass@1 over the second half of the evaluations and the volatility, per seed; averaged - raw of the same run, paired by seed; 3 seeds; one Holm family. Intervals exclude problem-sampling error: every seed and policy is evaluated on the same fixed test problems with the same evaluation key.

| claim (paper) | ours: a - b [interval] | p (Holm) | permutation p | seeds | min. detectable | verdict |
| --- | --- | --- | --- | --- | --- | --- |
| averaging RL checkpoints (lawa) raises the pass@1 level (2nd-half mean) | lawa: +0.020 [+0.003, +0.037] | 0.0191 (0.0645) | 0.125 | 3 vs 3 | 0.015 | inconclusive |
| averaging RL checkpoints (lawa) damps step-to-step volatility | lawa: -0.008 [-0.020, +0.004] | 0.0484 (0.0645) | 0.125 | 3 vs 3 | 0.010 | inconclusive |
| averaging RL checkpoints (ema) raises the pass@1 level (2nd-half mean) | ema: +0.019 [+0.004, +0.035] | 0.0161 (0.0645) | 0.125 | 3 vs 3 | 0.013 | inconclusive |
| averaging RL checkpoints (ema) damps step-to-step volatility | ema: -0.009 [-0.017, -0.001] | 0.0217 (0.0645) | 0.125 | 3 vs 3 | 0.007 | inconclusive |

Statistics: paired t interval and one-sided paired t test at 95%, Holm-adjusted within each family; 3 seeds per arm; pooled seed SD up to 0.007; minimum detectable effect (80% power) 0.00728-0.0152.

Rules (``experiments/harness.py``): a claim is reproduced when the Holm-adjusted one-sided paired t test gives p <= 0.05 and the 95% paired t interval of averaged - raw lies on the claimed side of 0, not reproduced when it lies on the other side, inconclusive otherwise; the exact sign-flip permutation p (not adjusted; at 3 seeds its smallest value is 1/8) is reported beside it.

(end of generated results)
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

from experiments import harness
from experiments.averaging import report as R

AVERAGING = "lawa:k=5,every=10,as=lawa;ema:decay=0.95,as=ema"
POLICIES = ("raw", "lawa", "ema")
METRICS = {"final": "final pass@1", "second_half_mean": "2nd-half mean pass@1",
           "volatility": "volatility (sd of eval-to-eval change)"}
FAMILY = "averaging RL checkpoints"
README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "README.md")


def rl_config(quick: bool) -> dict:
  from experiments.grpo_arithmetic import CONFIG

  cfg = dict(CONFIG, steps=300, eval_every=25, eval_problems=200, eval_samples=8,
             checkpoint_every=25, averaging=AVERAGING)
  if quick:
    cfg.update(num_train=200, num_test=40, sft_steps=10, sft_batch_size=32, num_prompts=4,
               group_size=4, steps=6, eval_every=2, checkpoint_every=2, eval_problems=8,
               eval_samples=4, eval_batch=32, task_spec=dict(min_digits=1, max_digits=2),
               model=dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                          intermediate_size=64))
  return cfg


def get_config(quick: bool) -> dict:
  return {"seeds": 2 if quick else 3, "rl": rl_config(quick)}


def curves(evals: list[dict]) -> dict:
  """{policy: [steps, pass@1]} from a run's evaluations (step 0 has no average yet)."""
  out = {}
  for pol in POLICIES:
    key = "pass@1" if pol == "raw" else f"avg/{pol}/pass@1"
    pts = [(e["step"], e[key]) for e in evals if key in e and e["step"] > 0]
    out[pol] = [[p[0] for p in pts], [float(p[1]) for p in pts]]
  return out


def run_seed(cfg: dict, progress) -> dict:
  from rlpost.train import loop, rl

  trainer = rl.make_train(cfg, log=lambda s: None)
  with tempfile.TemporaryDirectory(prefix="averaging_rl_") as run_dir:
    res = loop.run(trainer, run_dir, progress=False)
  progress(cfg["steps"])
  return {"seed": cfg["seed"], "curves": curves(res["evals"])}


def units(config: dict) -> dict:
  out = {}
  for seed in range(config["seeds"]):
    cfg = dict(config["rl"], seed=seed)
    out[f"s{seed}"] = harness.Unit(cfg, lambda progress, cfg=cfg: run_seed(cfg, progress),
                                   cfg["steps"])
  return out


def collect(config: dict, results: dict) -> dict:
  return {"per_seed": [{"seed": r["seed"], "curves": r["curves"]} for r in results.values()]}


def seed_metrics(curve) -> dict:
  """{metric: value} of one seed's pass@1 curve of one policy."""
  vals = np.asarray(curve[1], np.float64)
  return {"final": float(vals[-1]), "second_half_mean": float(vals[len(vals) // 2:].mean()),
          "volatility": float(np.std(np.diff(vals))) if len(vals) > 2 else float("nan")}


def claims() -> list[harness.Claim]:
  out = []
  for pol in ("lawa", "ema"):
    out += [harness.Claim(f"{pol}_raises_pass1", f"averaging RL checkpoints ({pol}) raises the "
                          "pass@1 level (2nd-half mean)", "second_half_mean", (pol, "raw"),
                          "greater", family=FAMILY, paired=True),
            harness.Claim(f"{pol}_damps_volatility", f"averaging RL checkpoints ({pol}) damps "
                          "step-to-step volatility", "volatility", (pol, "raw"), "less",
                          family=FAMILY, paired=True)]
  return out


def summarize(report: dict) -> dict:
  per_seed = sorted(report["data"]["per_seed"], key=lambda s: s["seed"])
  values = {m: {pol: [seed_metrics(s["curves"][pol])[m] for s in per_seed] for pol in POLICIES}
            for m in METRICS}
  cells = {pol: {m: harness.cell(values[m][pol]) for m in METRICS} for pol in POLICIES}
  judged = harness.judge_family(claims(), values) if len(per_seed) >= 2 else []
  return {"values": values, "cells": cells, "claims": [v.to_json() for v in judged],
          "verdicts": {v.claim.id: v.verdict for v in judged}}


def render(report: dict) -> str:
  s, cfg = report["summary"], report["config"]["rl"]
  n = len(report["data"]["per_seed"])
  judged = s["claims"]
  lines = ["# T5: averaging GRPO checkpoints", "",
           f"`{report['command']}`: {n} seeds; GRPO for {cfg['steps']} steps, evaluated every "
           f"{cfg['eval_every']} steps on {cfg['eval_problems']} test problems x "
           f"{cfg['eval_samples']} samples; averages `{cfg['averaging']}`; "
           f"{report['seconds'] / 60:.1f} min on {R.machine_text(report.get('machine'))}. Cells: "
           "mean [95% t interval over seeds].", "",
           "## Paper claims", "",
           f"Pre-declared metrics: the mean pass@1 over the second half of the evaluations and the "
           f"volatility, per seed; averaged - raw of the same run, paired by seed; {n} seeds; one "
           "Holm family. Intervals exclude problem-sampling error: every seed and policy is "
           "evaluated on the same fixed test problems with the same evaluation key.", ""]
  lines += R.verdict_section(judged)
  lines += ["Rules (``experiments/harness.py``): a claim is reproduced when the Holm-adjusted "
            "one-sided paired t test gives p <= 0.05 and the 95% paired t interval of averaged - "
            "raw lies on the claimed side of 0, not reproduced when it lies on the other side, "
            "inconclusive otherwise; the exact sign-flip permutation p (not adjusted; at "
            f"{n} seeds its smallest value is 1/{2 ** n}) is reported beside it.", "",
           "## Per policy", "", "| policy | " + " | ".join(METRICS.values()) + " |",
           "| --- | " + " | ".join("---" for _ in METRICS) + " |"]
  for pol in POLICIES:
    lines.append(f"| {pol} | " + " | ".join(harness.fmt(s["cells"][pol][m]) for m in METRICS)
                 + " |")
  return "\n".join(lines) + "\n"


def plot(report: dict, out_dir: str) -> list[str]:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  per_seed = report["data"]["per_seed"]
  fig, ax = plt.subplots(figsize=(6, 3.5))
  colors = {"raw": "tab:gray", "lawa": "tab:blue", "ema": "tab:red"}
  for i, pol in enumerate(POLICIES):
    steps = np.asarray(per_seed[0]["curves"][pol][0], np.float64)
    vals = np.asarray([s["curves"][pol][1] for s in per_seed], np.float64)  # [S, E]
    shift = (i - 1) * 0.01 * (steps[-1] - steps[0] if len(steps) > 1 else 1.0)
    harness.errorbars(ax, steps + shift, [harness.cell(vals[:, j]) for j in range(vals.shape[1])],
                      color=colors[pol], label=pol, markersize=3)
  ax.set_xlabel("RL step")
  ax.set_ylabel("test pass@1 (mean, 95% t interval)")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  path = os.path.join(out_dir, "pass1_curves.png")
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return [path]


EXPERIMENT = harness.Experiment(name="averaging_rl", get_config=get_config, units=units,
                                summarize=summarize, render=render, plot=plot, collect=collect,
                                module="experiments.averaging.t5_rl", readme=README)
