"""Checkpoint averaging on a small language model: LAWA, EMA, SWA, post-hoc EMA, MWA.

Command:  python scripts/reproduce.py averaging [--quick] [--seeds N] [--out DIR] [--rejudge]
Hardware: CPU (2 cores); every run of the sweep is trained side by side in one jitted, vmapped
program (``sweep.py``), one ``harness.Unit`` whose result keeps every per-run evaluation point.
Data: an order-2 Markov language (vocabulary 64, sequences of 64) with a known entropy floor
(``lm.py``). Tables: T1 ``t1_lr_gain.py``, T2 ``t2_spacing.py``, T3 ``t3_methods.py``, T4
``t4_mwa.py``. T5 (averaging RL checkpoints) is ``t5_rl.py``, run by
``python scripts/reproduce.py averaging_rl`` into ``results/averaging_rl``.

Claims are ``harness.Claim`` data judged by ``harness.judge_family``, one Holm family per paper
(Kaddour 2022, Sanyal et al. 2023, Karras et al. 2024, Choi & Yu 2025). The pre-declared metric of
every claim is the excess loss at the final evaluation (nats above the entropy floor, exact KL on
the fixed held-out sequences), per seed; an averaged policy against the raw one (or two averages)
of the same runs is a paired comparison (``paired=True``); comparisons across learning rates are
Welch.

Outputs in ``--out`` (default ``results/averaging``): ``table.md``, ``results.json`` (the config,
the machine, the runtime and every per-run evaluation point, so ``--rejudge`` and the plots need
nothing else), ``curves.png``, ``t1_gain_vs_lr.png``, ``t2_gain_vs_nu.png``, ``t4_mwa.png``.

Results on this CPU (generated from results/averaging/table.md; do not edit by hand):

`python scripts/reproduce.py averaging`: 48 runs, 8 seeds per setting (8 from power: pilot SD 0.0041, minimum effect 0.01, 80% power, alpha 0.05; floor 8), 1000 steps each; model 49,344 parameters; entropy floor 1.8198 nats/token; Bayes next-token accuracy 0.4718. Wall time: 32.6 min of training and evaluation over all arms (this invocation 32.6 min; cached arms are not rerun). Run on AMD EPYC, 2 CPU cores, jax 0.10.2 on cpu at commit c5b6483 with uncommitted changes, from starts made within the run (nothing pinned: seeded initialisation, generated data). Minimum detectable effect of the claims: 9.24e-05-0.00481. Cells: mean [95% t interval over seeds]; a difference of two policies of the same runs: paired t interval; accuracy: the expected next-token accuracy (mean P_true of the model's argmax).

## Paper claims

Pre-declared metric: the excess loss at the final evaluation (step 1000), and for Kaddour's accuracy claims the expected next-token accuracy there, 8 seeds; one Holm family per paper. Intervals cover seed-to-seed variation (initialisation and data order) only: every run and policy is scored on the same fixed 64 held-out sequences (exact KL to and expected accuracy under the true next-token distribution, no target sampling), so they exclude evaluation-data sampling error.

| claim (paper) | ours: a - b [interval] | SESOI | p (Holm) | permutation p | seeds | min. detectable | declared | verdict |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
| Kaddour 2022: the average of the k latest checkpoints has a lower loss than the raw run (constant LR 0.001) | LAWA k=5 nu=50, LR 0.001: -0.025 [-0.027, -0.022] | 0.01 | 6.05e-08 (1.21e-07) | 0.00391 | 8 vs 8 | 0.003 | 59d6211 (exploratory) | reproduced |
| Kaddour 2022: the average of the k latest checkpoints has a lower loss than the raw run (constant LR 0.003) | LAWA k=5 nu=50, LR 0.003: -0.046 [-0.049, -0.042] | 0.01 | 2.89e-09 (1.73e-08) | 0.00391 | 8 vs 8 | 0.004 | 59d6211 (exploratory) | reproduced |
| Kaddour 2022: the average of the k latest checkpoints has a lower loss than the raw run (constant LR 0.01) | LAWA k=5 nu=50, LR 0.01: -0.064 [-0.067, -0.061] | 0.01 | 1.02e-10 (7.15e-10) | 0.00391 | 8 vs 8 | 0.004 | 59d6211 (exploratory) | reproduced |
| Kaddour 2022: the average of the k latest checkpoints has a lower loss than the raw run (constant LR 0.03) | LAWA k=5 nu=50, LR 0.03: -0.081 [-0.084, -0.079] | 0.01 | 1.19e-11 (9.52e-11) | 0.00391 | 8 vs 8 | 0.003 | 59d6211 (exploratory) | reproduced |
| Kaddour 2022: the average of the k latest checkpoints has a higher next-token accuracy than the raw run (constant LR 0.001) | LAWA k=5 nu=50, LR 0.001: +0.008 [+0.008, +0.009] | 0 | 1.15e-08 (4.6e-08) | 0.00391 | 8 vs 8 | 0.001 | 65e36fb (exploratory) | reproduced |
| Kaddour 2022: the average of the k latest checkpoints has a higher next-token accuracy than the raw run (constant LR 0.003) | LAWA k=5 nu=50, LR 0.003: +0.012 [+0.010, +0.014] | 0 | 6.68e-07 (6.68e-07) | 0.00391 | 8 vs 8 | 0.002 | 65e36fb (exploratory) | reproduced |
| Kaddour 2022: the average of the k latest checkpoints has a higher next-token accuracy than the raw run (constant LR 0.01) | LAWA k=5 nu=50, LR 0.01: +0.015 [+0.014, +0.017] | 0 | 2.07e-08 (6.21e-08) | 0.00391 | 8 vs 8 | 0.002 | 65e36fb (exploratory) | reproduced |
| Kaddour 2022: the average of the k latest checkpoints has a higher next-token accuracy than the raw run (constant LR 0.03) | LAWA k=5 nu=50, LR 0.03: +0.019 [+0.017, +0.020] | 0 | 4.63e-09 (2.31e-08) | 0.00391 | 8 vs 8 | 0.002 | 65e36fb (exploratory) | reproduced |
| Sanyal et al. 2023: higher learning rates give higher averaging gains (final LAWA gain, LR 0.03 vs 0.001) | gain at LR 0.03: +0.057 [+0.053, +0.060] | 0.01 | 2.08e-15 (1.04e-14) | 0.0001 | 8 vs 8 | 0.005 | 59d6211 (exploratory) | reproduced |
| Sanyal et al. 2023: larger spacing between averaged checkpoints amplifies the gain (LAWA nu=100 vs nu=10, LR 0.03) | LAWA nu=100, LR 0.03: -0.001 [-0.002, +0.000] | 0.01 | 0.0485 (0.097) | 0.0547 | 8 vs 8 | 0.002 | 59d6211 (exploratory) | not reproduced |
| Sanyal et al. 2023: LAWA outperforms EMA (decay 0.9 every step; LR 0.03) | LAWA, LR 0.03: -0.024 [-0.026, -0.022] | 0.01 | 4.16e-09 (1.25e-08) | 0.00391 | 8 vs 8 | 0.002 | 59d6211 (exploratory) | reproduced |
| Sanyal et al. 2023: LAWA outperforms SWA (every 10 steps; LR 0.03) | LAWA, LR 0.03: -0.022 [-0.024, -0.021] | 0.01 | 1.86e-09 (7.45e-09) | 0.00391 | 8 vs 8 | 0.002 | 59d6211 (exploratory) | reproduced |
| Sanyal et al. 2023: LAWA outperforms EMA (checked here against an EMA with its decay tuned, 0.9901, a stronger baseline; LR 0.03) | LAWA, LR 0.03: +0.013 [+0.012, +0.015] | 0.01 | 1 (1) | 1 | 8 vs 8 | 0.001 | 59d6211 (exploratory) | not reproduced |
| Karras et al. 2024: a post-hoc reconstructed EMA (sigma_rel 0.1) is as good as training with a tuned EMA, within 0.01 nats (LR 0.03) | post-hoc EMA, LR 0.03: -0.001 [-0.001, -0.000] | +-0.01 | 6.44e-16 (6.44e-16) | 0.00781 | 8 vs 8 | 0.000 | 59d6211 (exploratory) | reproduced; but a - b is significantly below 0 (95% interval [-0.001, -0.000]) |
| Choi & Yu 2025: loss-weighted MWA beats the uniform average of the same checkpoints (last 10; LR 0.001) | MWA loss p=8, last 10, LR 0.001: -0.003 [-0.003, -0.002] | 0.01 | 2.3e-07 (1.15e-06) | 0.00391 | 8 vs 8 | 0.000 | 65e36fb (exploratory) | trivial |
| Choi & Yu 2025: loss-weighted MWA beats the uniform average of the same checkpoints (last 10; LR 0.003) | MWA loss p=8, last 10, LR 0.003: -0.001 [-0.001, -0.001] | 0.01 | 3.96e-08 (2.77e-07) | 0.00391 | 8 vs 8 | 0.000 | 65e36fb (exploratory) | trivial |
| Choi & Yu 2025: loss-weighted MWA beats the uniform average of the same checkpoints (last 10; LR 0.01) | MWA loss p=8, last 10, LR 0.01: -0.000 [-0.001, -0.000] | 0.01 | 6.91e-07 (2.76e-06) | 0.00391 | 8 vs 8 | 0.000 | 65e36fb (exploratory) | trivial |
| Choi & Yu 2025: loss-weighted MWA beats the uniform average of the same checkpoints (last 10; LR 0.03) | MWA loss p=8, last 10, LR 0.03: -0.001 [-0.001, -0.000] | 0.01 | 3.22e-06 (9.65e-06) | 0.00391 | 8 vs 8 | 0.000 | 65e36fb (exploratory) | trivial |
| Choi & Yu 2025: loss-weighted MWA beats the uniform average of the same checkpoints (last 10; LR 0.003 (cosine)) | MWA loss p=8, last 10, LR 0.003 (cosine): -0.001 [-0.001, -0.001] | 0.01 | 7.52e-08 (4.51e-07) | 0.00391 | 8 vs 8 | 0.000 | 65e36fb (exploratory) | trivial |
| Choi & Yu 2025: loss-weighted MWA beats the uniform average of the same checkpoints (last 10; LR 0.01 (cosine)) | MWA loss p=8, last 10, LR 0.01 (cosine): -0.001 [-0.001, -0.001] | 0.01 | 2.91e-08 (2.33e-07) | 0.00391 | 8 vs 8 | 0.000 | 65e36fb (exploratory) | trivial |
| Choi & Yu 2025: loss-weighted MWA surpasses the final checkpoint (LR 0.03) | MWA loss p=8, last 10, LR 0.03: -0.085 [-0.087, -0.082] | 0.01 | 7.15e-12 (6.44e-11) | 0.00391 | 8 vs 8 | 0.003 | 65e36fb (exploratory) | reproduced |
| Choi & Yu 2025: loss-weighted MWA surpasses the final checkpoint (LR 0.003 (cosine)) | MWA loss p=8, last 10, LR 0.003 (cosine): +0.002 [+0.001, +0.003] | 0.01 | 1 (1) | 1 | 8 vs 8 | 0.001 | 65e36fb (exploratory) | not reproduced |
| Choi & Yu 2025: loss-weighted MWA surpasses the final checkpoint (LR 0.01 (cosine)) | MWA loss p=8, last 10, LR 0.01 (cosine): -0.003 [-0.004, -0.002] | 0.01 | 5.39e-05 (0.000108) | 0.00391 | 8 vs 8 | 0.001 | 65e36fb (exploratory) | trivial |

Statistics: TOST (paired t), margin 0.01; Welch interval and one-sided Welch test; paired t interval and one-sided paired t test at 95%, Holm-adjusted within each family; 8 seeds per arm; pooled seed SD up to 0.00388; minimum detectable effect (80% power) 9.24e-05-0.00481.

Rules (protocol v2, experiments/STATISTICS.md; `experiments/harness.py`): a directional claim is *reproduced* when its Holm-adjusted one-sided p is <= 0.05 and it is not equivalent to the threshold within +-SESOI (TOST, 90% interval), *trivial* when it is significant but equivalent (too small to matter), *not reproduced* when it is equivalent but not significant or its interval lies wholly on the other side, *inconclusive* otherwise (SESOI 0: the threshold is itself the effect of interest, no *trivial* outcome); an equivalence claim (margin 0.01) is *reproduced* when TOST rejects (Holm-adjusted), *not reproduced* when its 90% interval lies wholly outside the margin, *inconclusive* otherwise. An equivalence claim whose difference is significantly non-zero (95% interval), whatever its verdict, and a holding no-gain claim whose difference is, say so beside the verdict, and so does a verdict whose deciding bound lies within half a minimum detectable effect of its threshold (near its threshold: it can flip on another start or seed set). The permutation p (not adjusted) is reported beside the deciding test. Min. detectable: the difference a two-sided test at 80% power would find at these seeds and this seed SD. Declared: the commit that declared the claim; exploratory claims were declared after the run that motivated them and are kept out of the headline. Policies of the same runs are compared by paired t tests, learning rates by Welch tests. "Tuned" EMA decays and post-hoc widths are chosen on the same evaluation set (optimistic baselines); the MWA claims' penalty (p = 8) is pre-declared.

(end of generated results)
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from experiments import harness
from rlpost.eval import stats
from experiments.averaging import lm, sweep, t1_lr_gain, t2_spacing, t3_methods, t4_mwa
from experiments.averaging import report as R

TABLES = (("t1", t1_lr_gain), ("t2", t2_spacing), ("t3", t3_methods), ("t4", t4_mwa))
README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "README.md")
# What results.json keeps of the sweep (every per-run evaluation point).
DATA_KEYS = ("runs", "methods", "steps", "evals", "evals_acc", "train_loss", "posthoc_ema",
             "posthoc_ema_acc", "posthoc_sigma_rels", "mwa", "mwa_acc", "mwa_weights_run0",
             "entropy_floor", "bayes_accuracy", "num_params", "sweep_seconds")


def get_config(quick: bool) -> dict:
  cfg = sweep.quick_config() if quick else sweep.SweepConfig()
  return dict(dataclasses.asdict(cfg), model=cfg.model._asdict())


def sweep_config(config: dict) -> sweep.SweepConfig:
  kw = {k: tuple(v) if isinstance(v, list) else v for k, v in config.items() if k != "model"}
  return sweep.SweepConfig(**kw, model=lm.ModelConfig(**config["model"]))


def _run_sweep(config: dict, progress) -> dict:
  out = sweep.run_sweep(sweep_config(config), progress=False, on_block=progress)
  out["sweep_seconds"] = out.pop("seconds")  # the harness records the unit's own "seconds"
  return out


def units(config: dict) -> dict:
  cfg = sweep_config(config)
  return {"sweep": harness.Unit(config, lambda progress: _run_sweep(config, progress),
                                cfg.steps // cfg.eval_every)}


def collect(config: dict, results: dict) -> dict:
  return {k: results["sweep"][k] for k in DATA_KEYS}


def _arrays(data: dict) -> dict:
  """``data`` with the per-run evaluations as float arrays (JSON nulls as NaN)."""
  arr = lambda x: np.asarray(x, np.float64)
  return dict(data, evals=arr(data["evals"]), evals_acc=arr(data["evals_acc"]),
              train_loss=arr(data["train_loss"]), posthoc_ema=arr(data["posthoc_ema"]),
              posthoc_ema_acc=arr(data["posthoc_ema_acc"]),
              mwa={k: arr(v) for k, v in data["mwa"].items()},
              mwa_acc={k: arr(v) for k, v in data["mwa_acc"].items()})


def summarize(report: dict) -> dict:
  cfg, data = sweep_config(report["config"]), _arrays(report["data"])
  claims = R.Claims(sesoi=cfg.min_effect)
  tables = {name: mod.compute(data, cfg, claims) for name, mod in TABLES}
  judged = harness.judge_family(claims.claims, claims.values, table="averaging") if cfg.seeds >= 2 else []
  return {"tables": tables, "claims": [v.to_json() for v in judged],
          "verdicts": {v.claim.id: v.verdict for v in judged},
          "seeds_from_power": max(cfg.min_seeds, stats.seeds_needed(cfg.pilot_sd,
                                                                    cfg.min_effect))}


def render(report: dict) -> str:
  s, d, cfg = report["summary"], report["data"], sweep_config(report["config"])
  judged = s["claims"]
  mdes = [c["mde"] for c in judged]
  mde = f" Minimum detectable effect of the claims: {min(mdes):.3g}-{max(mdes):.3g}." if mdes else ""
  lines = ["# Checkpoint averaging on a small language model", "",
           f"`{report['command']}`: {len(d['runs'])} runs, "
           f"{harness.seeds_note(cfg, s['seeds_from_power']).replace('per arm', 'per setting')}, "
           f"{cfg.steps} steps each; model {d['num_params']:,} parameters; entropy floor "
           f"{d['entropy_floor']:.4f} nats/token; Bayes next-token accuracy "
           f"{d['bayes_accuracy']:.4f}. {harness.wall_time(report)}{mde} Cells: mean [95% t "
           "interval over "
           "seeds]; a difference of two policies of the same runs: paired t interval; accuracy: "
           "the expected next-token accuracy (mean P_true of the model's argmax).", "",
           "## Paper claims", "",
           f"Pre-declared metric: the excess loss at the final evaluation (step {cfg.steps}), and "
           "for Kaddour's accuracy claims the expected next-token accuracy there, "
           f"{cfg.seeds} seeds; one Holm family per paper. Intervals cover seed-to-seed variation "
           "(initialisation and data order) only: every run and policy is scored on the same "
           f"fixed {cfg.eval_seqs} held-out sequences (exact KL to and expected accuracy under "
           "the true next-token distribution, no target sampling), so they exclude "
           "evaluation-data sampling error.", ""]
  lines += R.verdict_section(judged)
  lines += [harness.rules_note(judged) + " Policies of the same runs are compared by paired t "
            "tests, learning rates by Welch tests. \"Tuned\" EMA decays and post-hoc widths are "
            "chosen on the same evaluation set (optimistic baselines); the MWA claims' penalty "
            f"(p = {cfg.mwa_p:g}) is pre-declared.", ""]
  for name, mod in TABLES:
    lines += [mod.markdown(s["tables"][name]), ""]
  return "\n".join(lines)


def _curve_cells(curves: np.ndarray) -> list[dict]:
  """[S, E] per-seed curves -> a t-interval cell per evaluation step."""
  nan = float("nan")
  return [harness.cell(c) if np.isfinite(c).all() else {"mean": nan, "lo": nan, "hi": nan}
          for c in curves.T]  # NaN: not recorded (converted results)


def plot(report: dict, out_dir: str) -> list[str]:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  s, cfg, data = report["summary"]["tables"], sweep_config(report["config"]), _arrays(report["data"])
  ev, steps = data["evals"], data["steps"]
  files = []
  rows = s["t3"]["rows"]
  fig, axes = plt.subplots(1, len(rows), figsize=(3.2 * len(rows), 3.2), sharey=True, squeeze=False)
  for ax, r in zip(axes[0], rows):
    idx = R.run_index(data, r["schedule"], r["lr"])
    tuned = r["ema_tuned"]
    curves = {"raw": ev[idx, :, 0],
              "lawa": ev[idx, :, R.method_index(data, f"lawa_nu{cfg.lawa_main_nu}")],
              "ema_tuned": ev[idx, :, R.method_index(data, tuned)],
              "swa": ev[idx, :, R.method_index(data, "swa")],
              "posthoc_ema": data["posthoc_ema"][idx, :, data["posthoc_sigma_rels"].index(
                  r["posthoc_sigma_rel"])]}
    for k, color in (("raw", "k"), ("lawa", "C0"), ("ema_tuned", "C1"), ("swa", "C2"),
                     ("posthoc_ema", "C3")):
      harness.errorbars(ax, steps, _curve_cells(curves[k]), color=color, label=k, lw=1.0,
                        marker=".", markersize=3, capsize=1.5)
    ax.set_title(f"LR {R.lr_label(r['schedule'], r['lr'])}", fontsize=9)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel("excess loss (nats; mean, 95% t interval)")
  axes[0][0].legend(fontsize=7)
  fig.tight_layout()
  files.append(os.path.join(out_dir, "curves.png"))
  fig.savefig(files[-1], dpi=110)
  plt.close(fig)

  fig, ax = plt.subplots(figsize=(4.5, 3.2))
  const = [r for r in s["t1"]["rows"] if r["schedule"] == "constant"]
  for f in const[0]["gain"]:
    harness.errorbars(ax, [r["lr"] for r in const], [r["gain"][f] for r in const],
                      label=f"at {f}")
  ax.axhline(0, color="k", lw=0.8)
  ax.set_xscale("log")
  ax.set_xlabel("peak LR")
  ax.set_ylabel("LAWA gain (nats; 95% t interval)")
  ax.legend(fontsize=8)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  files.append(os.path.join(out_dir, "t1_gain_vs_lr.png"))
  fig.savefig(files[-1], dpi=110)
  plt.close(fig)

  t2 = s["t2"]["rows"]
  lrs = sorted({r["lr"] for r in t2})
  fig, axes = plt.subplots(1, len(lrs), figsize=(3.2 * len(lrs), 3.0), sharey=True, squeeze=False)
  for ax, lr in zip(axes[0], lrs):
    sub = [r for r in t2 if r["lr"] == lr]
    for f in sub[0]["gain"]:
      harness.errorbars(ax, [r["nu"] for r in sub], [r["gain"][f] for r in sub], label=f"at {f}")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_title(f"LR {lr:g}", fontsize=9)
    ax.set_xlabel("spacing nu (steps)")
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel("LAWA gain (nats; 95% t interval)")
  axes[0][0].legend(fontsize=7)
  fig.tight_layout()
  files.append(os.path.join(out_dir, "t2_gain_vs_nu.png"))
  fig.savefig(files[-1], dpi=110)
  plt.close(fig)

  fig, ax = plt.subplots(figsize=(4.5, 3.2))
  last_k = cfg.mwa_last
  for r in s["t4"]["rows"]:
    pens = sorted([(float(k[len("last_loss_p"):]), k) for k in r["explore"]
                   if k.startswith("last_loss_p")] + [(0.0, "uniform"), (cfg.mwa_p, "mwa")])
    vals = [r["cells"][k] if k in ("uniform", "mwa") else r["explore"][k] for _, k in pens]
    bars = harness.errorbars(ax, [p for p, _ in pens], vals,
                             label=f"LR {R.lr_label(r['schedule'], r['lr'])}")
    ax.axhline(r["cells"]["last"]["mean"], ls=":", lw=0.8, color=bars.lines[0].get_color())
  ax.set_xlabel(f"MWA penalty p (loss-weighted, last {last_k}; dotted: last checkpoint)")
  ax.set_ylabel("excess loss (nats; 95% t interval)")
  ax.set_yscale("log")
  ax.legend(fontsize=7)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  files.append(os.path.join(out_dir, "t4_mwa.png"))
  fig.savefig(files[-1], dpi=110)
  plt.close(fig)
  return files


def replicate(config: dict, seeds: int, seed_offset: int) -> dict:
  """The committed sweep at fresh seeds (every setting: the claims compare settings and the
  averages of each run)."""
  return dict(config, seeds=seeds, seed_offset=seed_offset)


EXPERIMENT = harness.Experiment(name="averaging", get_config=get_config, units=units,
                                summarize=summarize, render=render, plot=plot, collect=collect,
                                module="experiments.averaging", readme=README,
                                replicate=replicate, pinned=False)
