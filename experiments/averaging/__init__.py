"""Checkpoint averaging on a small language model: LAWA, EMA, SWA, post-hoc EMA, MWA.

Command:  python scripts/reproduce.py averaging [--quick] [--seeds N] [--out DIR]
Hardware: CPU (2 cores); every run of the sweep is trained side by side in one jitted, vmapped
program (``sweep.py``). Data: an order-2 Markov language (vocabulary 64, sequences of 64) with a
known entropy floor (``lm.py``). Tables: T1 ``t1_lr_gain.py``, T2 ``t2_spacing.py``,
T3 ``t3_methods.py``, T4 ``t4_mwa.py``. T5 (averaging RL checkpoints) is ``t5_rl.py``, run by
``python scripts/reproduce.py averaging_rl`` into ``results/averaging_rl``.

Outputs in ``--out`` (default ``results/averaging``): ``table.md``, ``results.json`` (every number,
the config, the seeds, the command, the hardware and the runtime), ``curves.png``,
``t1_gain_vs_lr.png``, ``t2_gain_vs_nu.png``, ``t4_mwa.png``. A full run also rewrites the
generated results section of ``experiments/averaging/README.md`` from ``results.json``; the
numbers live there and in ``results.json`` only.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
import time

import numpy as np

from experiments.averaging import report as R
from experiments.averaging import sweep, t1_lr_gain, t2_spacing, t3_methods, t4_mwa

TABLES = (("t1", t1_lr_gain), ("t2", t2_spacing), ("t3", t3_methods), ("t4", t4_mwa))
README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "README.md")
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def config_for(args) -> sweep.SweepConfig:
  cfg = sweep.quick_config() if getattr(args, "quick", False) else sweep.SweepConfig()
  if getattr(args, "seeds", None):
    cfg = dataclasses.replace(cfg, seeds=int(args.seeds))
  return cfg


def _jsonable(x):
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if isinstance(x, np.ndarray):
    return _jsonable(x.tolist())
  if isinstance(x, (np.floating, float)):
    v = float(x)
    return None if np.isnan(v) else round(v, 6)
  if isinstance(x, np.integer):
    return int(x)
  return x


def claim_lines(results: dict) -> list[dict]:
  out = []
  for name, _ in TABLES:
    for c in results[name].get("claims", []):
      v = R.verdict(c["effect"], margin=c.get("margin", 0.0))
      out.append({"table": name.upper(), "id": c["id"], "verdict": v, "paper": c["paper"],
                  "ours": f"{R.fmt(R.signed(c['effect']))} nats ({c['where']})"})
  return out


def markdown(results: dict, meta: dict) -> str:
  parts = [f"## Results ({meta['mode']} run)\n",
           f"Command: `{meta['command']}`  \nHardware: {meta['hardware']}  \n"
           f"Runtime: {meta['seconds']['total']:.0f} s (compile and first block "
           f"{meta['seconds']['compile_and_first_block']:.0f} s)  \n"
           f"Runs: {meta['num_runs']} ({meta['seeds']} seeds per setting), {meta['steps']} steps "
           f"each; model {meta['num_params']:,} parameters; entropy floor "
           f"{meta['entropy_floor']:.4f} nats/token.\n",
           "### Claims\n"]
  for c in results["claims"]:
    parts.append(f"- **{c['verdict']}** ({c['table']}) {c['paper']}. Ours: {c['ours']}.")
  parts.append("")
  for name, mod in TABLES:
    parts.append(mod.markdown(results[name]) + "\n")
  return "\n".join(parts)


def plots(data: dict, results: dict, cfg, out_dir: str) -> list[str]:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  files = []
  rows = results["t3"]["rows"]
  fig, axes = plt.subplots(1, len(rows), figsize=(3.2 * len(rows), 3.2), sharey=True, squeeze=False)
  for ax, r in zip(axes[0], rows):
    for k, style in (("raw", "k-"), ("lawa", "C0-"), ("ema_tuned", "C1--"), ("swa", "C2:"),
                     ("posthoc_ema", "C3-.")):
      if k in r["curves_mean"]:
        ax.plot(data["steps"], r["curves_mean"][k], style, label=k, lw=1.2)
    ax.set_title(f"LR {R.lr_label(r['schedule'], r['lr'])}", fontsize=9)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel("excess loss (nats, seed mean)")
  axes[0][0].legend(fontsize=7)
  fig.tight_layout()
  files.append(os.path.join(out_dir, "curves.png"))
  fig.savefig(files[-1], dpi=110)
  plt.close(fig)

  fig, ax = plt.subplots(figsize=(4.5, 3.2))
  const = [r for r in results["t1"]["rows"] if r["schedule"] == "constant"]
  for f in const[0]["gain"]:
    m = np.array([r["gain"][f]["mean"] for r in const])
    lo = np.array([r["gain"][f]["lo"] for r in const])
    hi = np.array([r["gain"][f]["hi"] for r in const])
    x = [r["lr"] for r in const]
    ax.errorbar(x, m, yerr=[m - lo, hi - m] if np.all(np.isfinite(lo)) else None, marker="o",
                capsize=3, label=f"at {f}")
  ax.axhline(0, color="k", lw=0.8)
  ax.set_xscale("log")
  ax.set_xlabel("peak LR")
  ax.set_ylabel("LAWA gain (nats)")
  ax.legend(fontsize=8)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  files.append(os.path.join(out_dir, "t1_gain_vs_lr.png"))
  fig.savefig(files[-1], dpi=110)
  plt.close(fig)

  t2 = results["t2"]["rows"]
  lrs = sorted({r["lr"] for r in t2})
  fig, axes = plt.subplots(1, len(lrs), figsize=(3.2 * len(lrs), 3.0), sharey=True, squeeze=False)
  for ax, lr in zip(axes[0], lrs):
    sub = [r for r in t2 if r["lr"] == lr]
    for f in sub[0]["gain"]:
      ax.plot([r["nu"] for r in sub], [r["gain"][f]["mean"] for r in sub], "o-", label=f"at {f}")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_title(f"LR {lr:g}", fontsize=9)
    ax.set_xlabel("spacing nu (steps)")
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel("LAWA gain (nats)")
  axes[0][0].legend(fontsize=7)
  fig.tight_layout()
  files.append(os.path.join(out_dir, "t2_gain_vs_nu.png"))
  fig.savefig(files[-1], dpi=110)
  plt.close(fig)

  fig, ax = plt.subplots(figsize=(4.5, 3.2))
  for r in results["t4"]["rows"]:
    if r["schedule"] != "constant":
      continue
    keys = ["uniform"] + sorted([k for k in r["cells"] if k.startswith("loss_p")],
                                key=lambda k: float(k[6:]))
    ps = [0.0] + [float(k[6:]) for k in keys[1:]]
    ax.plot(ps, [r["cells"][k]["mean"] for k in keys], "o-", label=f"LR {r['lr']:g}")
    ax.axhline(r["cells"]["last"]["mean"], ls=":", lw=0.8, color=ax.lines[-1].get_color())
  ax.set_xlabel("MWA penalty p (loss-weighted; dotted: last checkpoint)")
  ax.set_ylabel("excess loss (nats)")
  ax.set_yscale("log")
  ax.legend(fontsize=7)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  files.append(os.path.join(out_dir, "t4_mwa.png"))
  fig.savefig(files[-1], dpi=110)
  plt.close(fig)
  return files


def update_readme(text: str, path: str = README) -> None:
  with open(path) as f:
    doc = f.read()
  if BEGIN not in doc or END not in doc:
    raise ValueError(f"{path} has no {BEGIN} ... {END} section")
  head, rest = doc.split(BEGIN, 1)
  _, tail = rest.split(END, 1)
  with open(path, "w") as f:
    f.write(head + BEGIN + "\n" + text.strip() + "\n" + END + tail)


def run(args) -> dict:
  """Run the sweep, build T1-T4, write table.md, results.json and plots into ``args.out``."""
  cfg = config_for(args)
  quick = bool(getattr(args, "quick", False))
  out_dir = getattr(args, "out", None) or os.path.join("results", "averaging")
  os.makedirs(out_dir, exist_ok=True)
  t0 = time.perf_counter()
  data = sweep.run_sweep(cfg, progress=not getattr(args, "no_progress", False))
  results = {name: mod.compute(data, cfg) for name, mod in TABLES}
  results["claims"] = claim_lines(results)
  import jax

  meta = {
      "mode": "quick" if quick else "full",
      "command": "python scripts/reproduce.py averaging" + (" --quick" if quick else "")
                 + (f" --seeds {args.seeds}" if getattr(args, "seeds", None) else ""),
      "hardware": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, "
                  f"jax {jax.__version__} on {jax.devices()[0].platform}",
      "python": sys.version.split()[0],
      "seconds": dict(data["seconds"], total=time.perf_counter() - t0),
      "num_runs": len(data["runs"]), "seeds": cfg.seeds, "steps": cfg.steps,
      "num_params": data["num_params"], "entropy_floor": data["entropy_floor"],
  }
  cfg_json = dataclasses.asdict(cfg)
  cfg_json["model"] = cfg.model._asdict()
  text = markdown(results, meta)
  with open(os.path.join(out_dir, "table.md"), "w") as f:
    f.write(text + "\n")
  files = plots(data, results, cfg, out_dir)
  payload = {"meta": meta, "config": cfg_json, "runs": data["runs"], "steps": data["steps"],
             "methods": data["methods"], "evals": np.round(data["evals"], 6),
             "train_loss": np.round(data["train_loss"], 6), "tables": {k: results[k] for k, _ in TABLES},
             "claims": results["claims"], "plots": [os.path.basename(p) for p in files]}
  with open(os.path.join(out_dir, "results.json"), "w") as f:
    json.dump(_jsonable(payload), f, indent=1)
  if not quick and getattr(args, "update_readme", True):
    update_readme(text)
  print(text)
  print(f"\nwrote {out_dir}/table.md, results.json and {len(files)} plots "
        f"in {meta['seconds']['total']:.0f} s")
  return payload
