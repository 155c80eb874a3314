"""T5: weight averaging applied to RL (GRPO) checkpoints: pass@1 level and step-to-step volatility.

Command:  python scripts/reproduce.py averaging_rl [--quick] [--seeds N] [--out DIR]
Hardware: CPU (2 cores). Each seed trains GRPO on 1-4 digit addition from the shared cached SFT
policy (``experiments/grpo_arithmetic.py``'s setup) for 300 steps, evaluating every 25 steps the raw
policy and, beside it, LAWA (k = 5 snapshots every 10 steps) and an EMA (decay 0.95 per step)
carried in the run loop (``RLConfig.averaging``). Each evaluation: 200 test problems x 8 samples.

Metrics per seed and policy: pass@1 at the last step, mean pass@1 over the second half of the run,
and volatility = the standard deviation of the change in pass@1 between successive evaluations.
The verdicts compare averaged - raw, paired by seed, with 95% bootstrap intervals.

Outputs in ``--out`` (default ``results/averaging_rl``): ``table.md``, ``results.json``,
``pass1_curves.png``; per-seed run directories under ``runs/`` (finished seeds are not rerun).
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

from rlpost.eval import metrics as evm

AVERAGING = "lawa:k=5,every=10,as=lawa;ema:decay=0.95,as=ema"
POLICIES = ("raw", "lawa", "ema")


def _config(quick: bool) -> dict:
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


def _curves(evals: list[dict]) -> dict:
  """{policy: (steps, pass@1)} from a run's evaluations (step 0 has no average yet)."""
  out = {}
  for pol in POLICIES:
    key = "pass@1" if pol == "raw" else f"avg/{pol}/pass@1"
    pts = [(e["step"], e[key]) for e in evals if key in e and e["step"] > 0]
    out[pol] = (np.array([p[0] for p in pts]), np.array([p[1] for p in pts]))
  return out


def _summaries(curves: dict) -> dict:
  res = {}
  for pol, (steps, vals) in curves.items():
    half = vals[len(vals) // 2:]
    res[pol] = {"final": float(vals[-1]), "second_half_mean": float(half.mean()),
                "volatility": float(np.std(np.diff(vals))) if len(vals) > 2 else float("nan")}
  return res


def _verdict(lo: float, hi: float, better: str) -> str:
  good = lo > 0 if better == "higher" else hi < 0
  bad = hi < 0 if better == "higher" else lo > 0
  return "reproduced" if good else "not reproduced" if bad else "inconclusive"


def run(args) -> dict:
  from rlpost.train import loop, rl

  quick = bool(getattr(args, "quick", False))
  seeds = int(getattr(args, "seeds", None) or (1 if quick else 3))
  out_dir = getattr(args, "out", None) or os.path.join("results", "averaging_rl")
  os.makedirs(out_dir, exist_ok=True)
  t0 = time.perf_counter()
  per_seed = []
  for seed in range(seeds):
    cfg = dict(_config(quick), seed=seed)
    trainer = rl.make_train(cfg, log=lambda s: None)
    res = loop.run(trainer, os.path.join(out_dir, "runs", f"s{seed}"),
                   progress=not getattr(args, "no_progress", False))
    curves = _curves(res["evals"])
    per_seed.append({"seed": seed, "summary": _summaries(curves),
                     "curves": {p: [c[0].tolist(), c[1].tolist()] for p, c in curves.items()}})

  table, claims = {}, []
  lines = ["| policy | final pass@1 | 2nd-half mean pass@1 | volatility (sd of eval-to-eval change) |",
           "|---|---|---|---|"]
  for pol in POLICIES:
    row = {}
    for metric in ("final", "second_half_mean", "volatility"):
      row[metric] = evm.mean_ci([s["summary"][pol][metric] for s in per_seed])
    table[pol] = row
    lines.append(f"| {pol} | " + " | ".join(f"{m:.3f} [{lo:.3f}, {hi:.3f}]"
                                             for m, lo, hi in row.values()) + " |")
  for pol in ("lawa", "ema"):
    for metric, better, claim in (
        ("second_half_mean", "higher", "averaging RL checkpoints raises the pass@1 level"),
        ("volatility", "lower", "averaging RL checkpoints damps step-to-step volatility")):
      d = evm.paired_difference_ci([s["summary"][pol][metric] for s in per_seed],
                                   [s["summary"]["raw"][metric] for s in per_seed])
      verdict = _verdict(d[1], d[2], better)
      claims.append({"policy": pol, "metric": metric, "claim": claim, "difference": d,
                     "verdict": verdict})
  lines.append("")
  for c in claims:
    m, lo, hi = c["difference"]
    lines.append(f"- **{c['verdict']}** ({c['policy']}) {c['claim']}: {c['policy']} - raw = "
                 f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}] ({c['metric']}, paired over {seeds} seeds)")
  seconds = time.perf_counter() - t0
  mode = "quick" if quick else "full"
  cmd = "python scripts/reproduce.py averaging_rl" + (" --quick" if quick else "")
  text = (f"## T5: averaging GRPO checkpoints ({mode} run)\n\nCommand: `{cmd}`  \n"
          f"Seeds: {seeds}; runtime {seconds:.0f} s; averages: `{AVERAGING}`\n\n" + "\n".join(lines))
  with open(os.path.join(out_dir, "table.md"), "w") as f:
    f.write(text + "\n")
  payload = {"command": cmd, "mode": mode, "config": _config(quick), "seeds": list(range(seeds)),
             "seconds": seconds, "per_seed": per_seed, "table": table, "claims": claims}
  with open(os.path.join(out_dir, "results.json"), "w") as f:
    json.dump(payload, f, indent=1)
  _plot(per_seed, os.path.join(out_dir, "pass1_curves.png"))
  print(text)
  return payload


def _plot(per_seed, path):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6, 3.5))
  colors = {"raw": "tab:gray", "lawa": "tab:blue", "ema": "tab:red"}
  for s in per_seed:
    for pol, (steps, vals) in s["curves"].items():
      ax.plot(steps, vals, color=colors[pol], alpha=0.6,
              label=pol if s["seed"] == 0 else None)
  ax.set_xlabel("RL step")
  ax.set_ylabel("test pass@1")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
