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

The numbers this table last produced are in ``results/averaging/table.md``, and copied into the
results section of ``experiments/averaging/README.md`` by ``experiments/docsync.py``.
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
