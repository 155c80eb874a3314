"""DARS / DARS-B at CPU scale: pass@k overall and on the hardest problems, rescued prompts,
and GRPO's cumulative-advantage bias.

Paper: "Depth-Breadth Synergy in RLVR" (DARS, DARS-B; official code yangzhch6/DARS). Claims
checked: (1) the cumulative |advantage| of a group peaks at accuracy 0.5 (hard prompts are
down-weighted); (2) naively enlarging the rollout size N does not improve pass@K; (3) DARS
improves pass@K; (4) DARS-B improves pass@1 and pass@K together; plus how many all-wrong
prompts the second stage rescues.

Command:  python scripts/reproduce.py dars [--quick] [--seeds N] [--out DIR]
Hardware: 2 CPU cores. Setup: 1-4 digit addition (4 digits is the hardest bucket) from the cached
SFT policy of ``experiments/grpo_arithmetic.py``; every arm uses the DARS objective (advantage
r - mean over the merged group, token sum over a constant length, dual clip, entropy bonus, no
KL), so arms differ only in rollout allocation and batch breadth:

* ``grpo-n8``: N=8 per prompt, 8 prompts, 2 mini-batches per step;
* ``grpo-n16``: N=16 (a naively larger N: the same rollouts per step as the DARS arms);
* ``dars-et`` / ``dars-hw``: N=8 in stage 1 plus a static budget of 8 stage-2 rollouts per prompt
  on average, scheduled by equal treatment / hardness weighting (n_max 32 / 64);
* ``dars-b``: dars-et with 4x the prompts per step, full-batch updates for 2 epochs, and a quarter
  of the steps (the same number of rollouts in total).

The paper's own setup at full size (accelerators, not run here): ``experiments/dars/full.py``.

Outputs in ``--out`` (default ``results/dars``): ``table.md``, ``results.json``, ``passk.png``,
``cumulative_advantage.png``; finished arms are cached under ``cache/``.

Results on this CPU (generated from results/dars/table.md; do not edit by hand):

`python scripts/reproduce.py dars`: 4 seeds per arm; pass@k from 200 test problems x 64 samples; 13.2 min on this machine. Cells: mean [95% t interval over seeds]; differences: Welch intervals. SFT start: pass@1 0.356, pass@4 0.510, pass@16 0.636, pass@64 0.730, pass@1 (4-digit) 0.002, pass@4 (4-digit) 0.006, pass@16 (4-digit) 0.024, pass@64 (4-digit) 0.096.

## Paper claims

Final-evaluation values, 4 seeds per arm against grpo-n8; one Holm family. Intervals exclude problem-sampling error (every arm is evaluated on the same fixed test problems with the same evaluation key).

| claim (paper) | ours: a - b [interval] | p (Holm) | permutation p | seeds | min. detectable | verdict |
| --- | --- | --- | --- | --- | --- | --- |
| naively larger N gives no pass@64 gain | grpo-n16: +0.004 [-0.046, +0.054] | 0.268 (0.268) | 0.857 | 4 vs 4 | 0.082 | inconclusive |
| DARS improves pass@64 | dars-et: +0.030 [-0.004, +0.064] | 0.0374 (0.0747) | 0.0286 | 4 vs 4 | 0.045 | inconclusive |
| DARS-B improves pass@1 | dars-b: +0.057 [+0.036, +0.078] | 0.00037 (0.00148) | 0.0143 | 4 vs 4 | 0.029 | reproduced |
| DARS-B improves pass@64 | dars-b: +0.074 [+0.040, +0.107] | 0.00142 (0.00426) | 0.0143 | 4 vs 4 | 0.043 | reproduced |

Statistics: TOST (Welch), margin 0.02; Welch interval and one-sided Welch test at 95%, Holm-adjusted within each family; 4 seeds per arm; pooled seed SD up to 0.0343; minimum detectable effect (80% power) 0.0288-0.0817.

Rules (`experiments/harness.py`): a directional claim is reproduced when its Holm-adjusted one-sided p is <= 0.05 and its 95% interval lies beyond the margin (0), not reproduced when the interval lies on the other side of the margin, inconclusive otherwise; an equivalence claim (margin 0.02) is reproduced when TOST rejects (Holm-adjusted), not reproduced when its 90% interval lies wholly outside the margin, inconclusive otherwise. The permutation p (not adjusted) is reported beside the deciding test. Min. detectable: the difference a two-sided test at 80% power would find at these seeds and this seed SD.

Sanity check (holds by algebra, not a reproduction): the mean-only cumulative advantage peaks at accuracy 0.5: peak at 0.5, holds.

(end of generated results)
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np

from experiments import harness, rl_seeds
from rlpost import objectives as O
from rlpost.train import rl


@dataclasses.dataclass(frozen=True)
class Sizes:
  seeds: int = 4
  steps: int = 160
  num_prompts: int = 8
  n: int = 8
  breadth: int = 4
  eval_every: int = 40
  eval_problems: int = 200
  eval_samples: int = 64
  hardest: int = 4  # difficulty bucket reported separately
  curve_prompts: int = 400  # cumulative-advantage analysis on the SFT policy
  base: dict = dataclasses.field(default_factory=dict)


# The smallest pass@k difference of interest: the margin of the equivalence claim ("no gain")
# and the effect the seed count is judged against. Declared with the switch to the statistics
# protocol (README "Verdict history"), after the committed run.
MIN_EFFECT = 0.02


def claims(sz: Sizes) -> list[harness.Claim]:
  """The paper's claims about trained arms, as data (one Holm family)."""
  kmax, base = max(_ks(sz)), f"grpo-n{sz.n}"
  return [
      harness.Claim("naive_n_no_passk_gain", f"naively larger N gives no pass@{kmax} gain",
                    f"pass@{kmax}", (f"grpo-n{2 * sz.n}", base), "equivalent", MIN_EFFECT,
                    "dars"),
      harness.Claim("dars_improves_passk", f"DARS improves pass@{kmax}", f"pass@{kmax}",
                    ("dars-et", base), family="dars"),
      harness.Claim("dars_b_improves_pass1", "DARS-B improves pass@1", "pass@1",
                    ("dars-b", base), family="dars"),
      harness.Claim("dars_b_improves_passk", f"DARS-B improves pass@{kmax}", f"pass@{kmax}",
                    ("dars-b", base), family="dars"),
  ]


def sizes(quick: bool) -> Sizes:
  if not quick:
    return Sizes()
  tiny = dict(rl_seeds.QUICK_BASE)
  return Sizes(seeds=2, steps=4, num_prompts=4, n=4, breadth=2, eval_every=4, eval_problems=8,
               eval_samples=8, hardest=2, curve_prompts=16, base=tiny)


def arms(sz: Sizes) -> dict:
  """{arm name: RLConfig overrides}."""
  p, n = sz.num_prompts, sz.n
  common = dict(recipe="dars", group_size=n, num_prompts=p, num_minibatches=2)
  stage2 = dict(dars_budget=p * n)  # on average one more N per prompt
  return {
      f"grpo-n{n}": dict(common),
      f"grpo-n{2 * n}": dict(common, group_size=2 * n),
      "dars-et": dict(common, dars_schedule="et", dars_n_max=4 * n, **stage2),
      "dars-hw": dict(common, dars_schedule="hw", dars_n_max=8 * n, **stage2),
      "dars-b": dict(common, dars_schedule="et", dars_n_max=4 * n, num_prompts=p * sz.breadth,
                     dars_budget=p * sz.breadth * n, num_minibatches=1, num_iterations=2,
                     steps=sz.steps // sz.breadth, eval_every=max(1, sz.eval_every // sz.breadth)),
  }


def base_config(sz: Sizes) -> dict:
  from experiments.grpo_arithmetic import CONFIG

  cfg = dict(CONFIG, steps=sz.steps, eval_every=sz.eval_every, eval_problems=sz.eval_problems,
             eval_samples=sz.eval_samples, checkpoint_every=10 ** 9)
  cfg.update(sz.base)
  return cfg


# ----------------------------------------------------------------- cumulative advantage curve
def cumulative_advantage_curve(trainer: rl.Trainer, sz: Sizes, *, seed: int = 0) -> dict:
  """Sum of |A_i| over a group against the group's accuracy, on the SFT policy.

  ``curve_prompts`` training prompts x N rollouts, scored with GRPO's advantage (mean and std)
  and Dr.GRPO / DARS's (mean only) from the library's recipes. Returns, per accuracy level
  j/N: the number of groups and the mean cumulative |A| under each advantage.
  """
  n, p = sz.n, sz.curve_prompts
  idx = jnp.repeat(jnp.arange(p, dtype=jnp.int32), n)
  ro = jax.jit(trainer.sample)(trainer.ref_params, idx, jax.random.key(seed))
  batch = O.RolloutBatch(group_id=jnp.repeat(jnp.arange(p, dtype=jnp.int32), n),
                         valid=jnp.ones((p * n,), bool), tokens=ro.tokens, token_mask=ro.mask,
                         rewards=ro.rewards)
  acc = np.asarray(ro.correct).reshape(p, n).mean(axis=1)
  out = {"accuracy": [j / n for j in range(n + 1)],
         "groups": [int(np.sum(np.isclose(acc, j / n))) for j in range(n + 1)]}
  for name in ("grpo", "dr_grpo"):
    kw = {} if name == "grpo" else {"max_length": trainer.max_new_tokens}
    adv, _ = O.compute_advantages(O.get_recipe(name, **kw).advantage, batch)
    cum = np.abs(np.asarray(adv.values)).reshape(p, n).sum(axis=1)
    out[name] = [float(cum[np.isclose(acc, j / n)].mean()) if np.any(np.isclose(acc, j / n))
                 else float("nan") for j in range(n + 1)]
  return out


# ---------------------------------------------------------------------------------- running
def get_config(quick: bool) -> dict:
  return dataclasses.asdict(sizes(quick))


def arm_configs(sz: Sizes) -> dict:
  """{arm name: full RLConfig dict}."""
  base = base_config(sz)
  return {name: dict(base, **kw) for name, kw in arms(sz).items()}


def units(config: dict) -> dict:
  sz = Sizes(**config)
  cfgs = arm_configs(sz)
  out = rl_seeds.arm_units(cfgs, list(range(sz.seeds)))
  grpo = cfgs[f"grpo-n{sz.n}"]
  out["curve"] = harness.Unit(
      {"curve": grpo, "n": sz.n, "prompts": sz.curve_prompts},
      lambda progress: cumulative_advantage_curve(rl.make_train(grpo, log=lambda s: None), sz))
  return out


def collect(config: dict, results: dict) -> dict:
  return {"arms": {k: v for k, v in results.items() if k != "curve"}, "curve": results["curve"]}


def _ks(sz: Sizes) -> list[int]:
  return [k for k in (1, 4, 16, 64) if k <= sz.eval_samples]


def summarize(report: dict) -> dict:
  sz = Sizes(**report["config"])
  results, curve = report["data"]["arms"], report["data"]["curve"]
  ks = _ks(sz)
  keys = [f"pass@{k}" for k in ks] + [f"pass@{k}/d{sz.hardest}" for k in ks]
  base_name = f"grpo-n{sz.n}"
  s = {"ks": ks, "keys": keys, "cells": {}, "vs_base": {}, "rescued": {}}
  first = results[base_name]["evals"][0]["per_seed"]
  s["start"] = {k: float(np.mean([e[k] for e in first])) for k in keys}
  final = {k: {name: rl_seeds.final_metric(arm, k) for name, arm in results.items()}
           for k in keys}
  for name, arm in results.items():
    s["cells"][name] = {k: harness.cell(final[k][name]) for k in keys}
    if name != base_name:
      s["vs_base"][name] = {k: harness.diff_cell(final[k][name], final[k][base_name])
                            for k in keys}
    tr = arm["train"]
    if "dars_rescued" in tr:
      s["rescued"][name] = {"all_wrong_per_step": float(np.mean(tr["dars_all_wrong_stage1"])),
                            "rescued_per_step": float(np.mean(tr["dars_rescued"]))}
  acc = np.asarray(curve["accuracy"])
  dr = np.asarray(curve["dr_grpo"], np.float64)
  peak = float(acc[np.nanargmax(dr)]) if np.any(np.isfinite(dr)) else float("nan")
  s["curve_peak_accuracy"] = peak
  judged = harness.judge_family(claims(sz), final)
  s["claims"] = [v.to_json() for v in judged]
  s["verdicts"] = {v.claim.id: v.verdict for v in judged}
  # A sanity check, not a claim: with A = r - mean and binary rewards the cumulative |A| of a
  # group of accuracy a is 2 N a (1 - a), which peaks at a = 0.5 by algebra.
  s["sanity"] = {"cumulative_advantage_peaks_at_half": (
      "inconclusive" if np.sum(np.isfinite(dr)) < 3  # too few accuracy levels observed
      else "holds" if abs(peak - 0.5) <= 1 / sz.n else "fails")}
  return s


def render(report: dict) -> str:
  s, curve, sz = report["summary"], report["data"]["curve"], Sizes(**report["config"])
  ks, keys = s["ks"], s["keys"]
  kmax = max(ks)
  head = [k.replace(f"/d{sz.hardest}", f" ({sz.hardest}-digit)") for k in keys]
  lines = ["# DARS / DARS-B at CPU scale", "",
           f"`{report['command']}`: {sz.seeds} seeds per arm; pass@k from {sz.eval_problems} test "
           f"problems x {sz.eval_samples} samples; {report['seconds'] / 60:.1f} min on this machine. "
           "Cells: mean [95% t interval over seeds]; differences: Welch intervals. SFT start: "
           + ", ".join(f"{h} {s['start'][k]:.3f}" for h, k in zip(head, keys)) + ".", "",
           "## Final test pass@k", "", "| arm | " + " | ".join(head) + " |",
           "| --- | " + " | ".join("---" for _ in keys) + " |"]
  for n, c in s["cells"].items():
    lines.append(f"| {n} | " + " | ".join(harness.fmt(c[k]) for k in keys) + " |")
  lines += ["", f"## Minus grpo-n{sz.n}", "", "| arm | " + " | ".join(head) + " |",
            "| --- | " + " | ".join("---" for _ in keys) + " |"]
  for n, c in s["vs_base"].items():
    lines.append(f"| {n} | " + " | ".join(harness.fmt(c[k]) for k in keys) + " |")
  lines += ["", "## Stage 2: all-wrong prompts rescued (mean per step)", "",
            "| arm | stage-1 all-wrong prompts | rescued (>= 1 correct in stage 2) |", "| --- | --- | --- |"]
  for n, r in s["rescued"].items():
    lines.append(f"| {n} | {r['all_wrong_per_step']:.2f} | {r['rescued_per_step']:.2f} |")
  lines += ["", f"## Cumulative |advantage| per group vs group accuracy (SFT policy, N={sz.n})", "",
            "| accuracy | " + " | ".join(f"{a:.3g}" for a in curve["accuracy"]) + " |",
            "| --- | " + " | ".join("---" for _ in curve["accuracy"]) + " |",
            "| groups | " + " | ".join(str(g) for g in curve["groups"]) + " |",
            "| sum abs(A), mean only | " + " | ".join(f"{v:.2f}" for v in curve["dr_grpo"]) + " |",
            "| sum abs(A), mean and std | " + " | ".join(f"{v:.2f}" for v in curve["grpo"]) + " |"]
  judged = s["claims"]
  lines += ["", "## Paper claims", "",
            f"Final-evaluation values, {sz.seeds} seeds per arm against grpo-n{sz.n}; one Holm "
            "family. Intervals exclude problem-sampling error (every arm is evaluated on the same "
            "fixed test problems with the same evaluation key).", "",
            *harness.verdict_rows(judged), "", harness.protocol_note(judged)]
  lines += ["", harness.rules_note(judged), "",
            "Sanity check (holds by algebra, not a reproduction): the mean-only cumulative "
            f"advantage peaks at accuracy 0.5: peak at {s['curve_peak_accuracy']:.3g}, "
            f"{s['sanity']['cumulative_advantage_peaks_at_half']}.", ""]
  return "\n".join(lines)


def plot(report: dict, out_dir: str) -> list[str]:
  s, curve, sz = report["summary"], report["data"]["curve"], Sizes(**report["config"])
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  ks = s["ks"]
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
  for ax, suffix, title in ((axes[0], "", "all problems"),
                            (axes[1], f"/d{sz.hardest}", f"{sz.hardest}-digit problems")):
    for n, c in s["cells"].items():
      harness.errorbars(ax, ks, [c[f"pass@{k}{suffix}"] for k in ks], label=n, capsize=2)
    ax.plot(ks, [s["start"][f"pass@{k}{suffix}"] for k in ks], "k:", label="SFT start")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_title(title)
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("final test pass@k")
  axes[0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "passk.png"), dpi=120)
  plt.close(fig)
  fig, ax = plt.subplots(figsize=(4.8, 3.4))
  ax.plot(curve["accuracy"], curve["dr_grpo"], "o-", label="A = r - mean")
  ax.plot(curve["accuracy"], curve["grpo"], "s--", label="A = (r - mean) / std")
  ax.set_xlabel("group accuracy")
  ax.set_ylabel("cumulative |advantage| of the group")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "cumulative_advantage.png"), dpi=120)
  plt.close(fig)
  return [os.path.join(out_dir, f) for f in ("passk.png", "cumulative_advantage.png")]


EXPERIMENT = harness.Experiment(name="dars", get_config=get_config, units=units,
                                summarize=summarize, render=render, plot=plot, collect=collect,
                                module="experiments.dars")
