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

`python scripts/reproduce.py ace`: 10 seeds per arm, 200 RL steps, G=8; pass@k from 200 test problems x 64 samples; 37.2 min on this machine. Cells: mean [95% bootstrap CI over seeds]. SFT start: pass@1 0.356, pass@2 0.439, pass@4 0.510, pass@8 0.577, pass@16 0.636, pass@32 0.685, pass@64 0.730, token entropy 0.755.

## Paper claims (main arm, pre-declared: ace-softplus-mul-0.5)

| claim (paper) | ours | verdict |
| --- | --- | --- |
| pass@k gains grow with k | (pass@64 - pass@1) ACE minus GRPO: +0.004 [-0.010, +0.020] | inconclusive |
| pass@64 improves | +0.008 [-0.008, +0.024] | inconclusive |
| pass@1 holds (no loss beyond 1 point) | +0.004 [-0.011, +0.019] | inconclusive |
| fewer overconfident errors | -0.002 [-0.014, +0.009] | inconclusive |
| slower entropy collapse (higher final token entropy) | +0.004 [-0.006, +0.013] | inconclusive |

Rules: reproduced when the 95% interval lies on the claimed side of 0 (for pass@1: above -0.01), not reproduced when on the other side, inconclusive otherwise.

(end of generated results)
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import numpy as np
from tqdm.auto import tqdm

from experiments import rl_seeds
from experiments.averaging.report import ci, fmt, verdict

MAIN = "ace-softplus-mul-0.5"


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


def run(args) -> dict:
  t0 = time.perf_counter()
  sz = sizes(args.quick)
  if args.seeds:
    sz = dataclasses.replace(sz, seeds=args.seeds)
  os.makedirs(args.out, exist_ok=True)
  base = base_config(sz)
  seeds = list(range(sz.seeds))
  spec = arms(sz)
  bar = tqdm(total=sz.steps * len(spec), desc="ace", disable=args.no_progress, dynamic_ncols=True)
  results = {}
  for name, kw in spec.items():
    bar.set_postfix(arm=name)
    results[name] = rl_seeds.run_arm(arm_config(base, kw), seeds,
                                     cache_dir=os.path.join(args.out, "cache"), on_step=bar.update)
  bar.close()
  summary = summarize(results, sz)
  command = "python scripts/reproduce.py ace" + (" --quick" if args.quick else "") + (
      f" --seeds {args.seeds}" if args.seeds else "")
  report = {"command": command, "sizes": dataclasses.asdict(sz), "base_config": base,
            "seconds": time.perf_counter() - t0, "summary": summary, "arms": results}
  with open(os.path.join(args.out, "results.json"), "w") as f:
    json.dump(report, f, indent=1, default=float)
  table = render(summary, sz, report)
  with open(os.path.join(args.out, "table.md"), "w") as f:
    f.write(table)
  plot(results, summary, sz, args.out)
  print(table)
  return report


def _ks(sz: Sizes) -> list[int]:
  return [k for k in (1, 2, 4, 8, 16, 32, 64) if k <= sz.eval_samples]


def _final(arm: dict, key: str) -> np.ndarray:
  return rl_seeds.final_metric(arm, key)


def _train_mean(arm: dict, key: str) -> np.ndarray:
  """[S] mean of a training metric over the second half of training, per seed."""
  v = np.asarray(arm["train"][key])  # [steps, S]
  return v[len(v) // 2:].mean(axis=0)


def summarize(results: dict, sz: Sizes) -> dict:
  ks = _ks(sz)
  main = f"ace-softplus-mul-{sz.main_alpha}"
  s = {"ks": ks, "cells": {}, "gain": {}, "start": {}}
  first = results["grpo"]["evals"][0]["per_seed"]
  for k in ks:
    s["start"][f"pass@{k}"] = float(np.mean([e[f"pass@{k}"] for e in first]))
  s["start"]["token_entropy"] = float(np.mean([e["token_entropy"] for e in first]))
  for name, arm in results.items():
    cell = {f"pass@{k}": ci(_final(arm, f"pass@{k}")) for k in ks}
    cell["token_entropy"] = ci(_final(arm, "token_entropy"))
    cell["overconfident_errors"] = ci(_train_mean(arm, "overconfident_errors"))
    s["cells"][name] = cell
    if name != "grpo":
      s["gain"][name] = {
          key: rl_seeds.diff_ci_unpaired(_final(arm, key), _final(results["grpo"], key))
          for key in [f"pass@{k}" for k in ks] + ["token_entropy"]}
      s["gain"][name]["overconfident_errors"] = rl_seeds.diff_ci_unpaired(
          _train_mean(arm, "overconfident_errors"), _train_mean(results["grpo"], "overconfident_errors"))
  g = s["gain"][main]
  kmax = max(ks)
  # Does the gain grow with k? The per-seed difference of gains is not paired across arms,
  # so compare pass@kmax - pass@1 per seed between the arms.
  spread = lambda arm: _final(arm, f"pass@{kmax}") - _final(arm, "pass@1")
  s["gain_growth"] = rl_seeds.diff_ci_unpaired(spread(results[main]), spread(results["grpo"]))
  neg = lambda c: dict(c, mean=-c["mean"], lo=-c["hi"], hi=-c["lo"])
  s["verdicts"] = {
      "passk_gain_grows_with_k": verdict(s["gain_growth"]),
      "pass_at_kmax_improves": verdict(g[f"pass@{kmax}"]),
      "pass1_holds": ("reproduced" if g["pass@1"]["lo"] > -0.01 else
                      "not reproduced" if g["pass@1"]["hi"] < -0.01 else "inconclusive")
      if g["pass@1"]["n"] >= 2 else "inconclusive",
      "fewer_overconfident_errors": verdict(neg(g["overconfident_errors"])),
      "slower_entropy_collapse": verdict(g["token_entropy"]),
  }
  s["main"] = main
  return s


def render(s: dict, sz: Sizes, report: dict) -> str:
  ks = s["ks"]
  names = list(s["cells"])
  lines = ["# ACE at CPU scale", "",
           f"`{report['command']}`: {sz.seeds} seeds per arm, {sz.steps} RL steps, G={sz.group_size}; "
           f"pass@k from {sz.eval_problems} test problems x {sz.eval_samples} samples; "
           f"{report['seconds'] / 60:.1f} min on this machine. Cells: mean [95% bootstrap CI over "
           "seeds]. SFT start: " + ", ".join(f"pass@{k} {s['start'][f'pass@{k}']:.3f}" for k in ks)
           + f", token entropy {s['start']['token_entropy']:.3f}.", "",
           "## Final test pass@k", "",
           "| arm | " + " | ".join(f"pass@{k}" for k in ks) + " | token entropy | overconfident errors (2nd half) |",
           "| --- | " + " | ".join("---" for _ in ks) + " | --- | --- |"]
  for n in names:
    c = s["cells"][n]
    lines.append(f"| {n} | " + " | ".join(fmt(c[f"pass@{k}"]) for k in ks)
                 + f" | {fmt(c['token_entropy'])} | {fmt(c['overconfident_errors'])} |")
  lines += ["", "## ACE minus GRPO", "",
            "| arm | " + " | ".join(f"pass@{k}" for k in ks) + " | token entropy | overconfident errors |",
            "| --- | " + " | ".join("---" for _ in ks) + " | --- | --- |"]
  for n, g in s["gain"].items():
    lines.append(f"| {n} | " + " | ".join(fmt(g[f"pass@{k}"]) for k in ks)
                 + f" | {fmt(g['token_entropy'])} | {fmt(g['overconfident_errors'])} |")
  v, g, kmax = s["verdicts"], s["gain"][s["main"]], max(ks)
  lines += ["", f"## Paper claims (main arm, pre-declared: {s['main']})", "",
            "| claim (paper) | ours | verdict |", "| --- | --- | --- |",
            f"| pass@k gains grow with k | (pass@{kmax} - pass@1) ACE minus GRPO: "
            f"{fmt(s['gain_growth'])} | {v['passk_gain_grows_with_k']} |",
            f"| pass@{kmax} improves | {fmt(g[f'pass@{kmax}'])} | {v['pass_at_kmax_improves']} |",
            f"| pass@1 holds (no loss beyond 1 point) | {fmt(g['pass@1'])} | {v['pass1_holds']} |",
            f"| fewer overconfident errors | {fmt(g['overconfident_errors'])} | "
            f"{v['fewer_overconfident_errors']} |",
            f"| slower entropy collapse (higher final token entropy) | {fmt(g['token_entropy'])} | "
            f"{v['slower_entropy_collapse']} |", "",
            "Rules: reproduced when the 95% interval lies on the claimed side of 0 (for pass@1: "
            "above -0.01), not reproduced when on the other side, inconclusive otherwise.", ""]
  return "\n".join(lines)


def plot(results: dict, s: dict, sz: Sizes, out_dir: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  ks = s["ks"]
  fig, ax = plt.subplots(figsize=(5.5, 3.6))
  for n, c in s["cells"].items():
    ax.plot(ks, [c[f"pass@{k}"]["mean"] for k in ks], "o-", label=n,
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
