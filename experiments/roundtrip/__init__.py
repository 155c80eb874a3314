"""Round-trip consistency: bidirectional diffusion rollouts predict their own errors (CPU scale).

Paper: "Round-Trip Consistency: Bidirectional Diffusion Models Can Predict Their Own Rollout
Errors" (arXiv 2608.00675; definitions as read from its abstract, ``/work/shared/specs``'s
round-trip spec mirrored in ``README.md``).

Command:  python scripts/reproduce.py roundtrip [--quick] [--seeds N] [--out DIR]
Hardware: CPU (2 cores). For each system (kdv1d and ns2d: fair tests; ks1d: stress test) and
seed, one bidirectional flow-matching stepper is trained (``rlpost.dynamics.train``), rolled out
from held-out test starts, training starts and OOD starts, and round-tripped
(``rlpost.dynamics.rollout.round_trip``); on kdv1d, forward-only and backward-only specialists and
an undertrained model are trained beside it. Statistics: ``analysis.py``; claims and the rules
that decide them: ``claims.py``; tables and plots: ``report.py``; plans: ``config.py``.

Outputs in ``--out`` (default ``results/roundtrip``): ``table.md``, ``results.json`` (every number,
seed, config, the command, hardware and runtime), ``scatter.png``, ``risk_coverage.png``,
``calibration.png``, ``directions.png``. Finished (system, seed, model) units are cached under
``<out>/cache/`` and never recomputed, so an interrupted run resumes where it stopped. A full run
also rewrites the generated results section of ``experiments/roundtrip/README.md``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
import time
from typing import Any

from experiments.roundtrip import analysis as A
from experiments.roundtrip import claims as CL
from experiments.roundtrip import config as cfg_lib
from experiments.roundtrip import report as rep
from experiments.roundtrip import unit as U

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "README.md")


def config_for(args) -> cfg_lib.ExperimentConfig:
  seeds = getattr(args, "seeds", None)
  if getattr(args, "quick", False):
    return cfg_lib.quick_config(seeds)
  return cfg_lib.full_config(seeds)


def _log(enabled: bool, msg: str) -> None:
  if enabled:
    print(msg, flush=True)


def run_system(plan: cfg_lib.SystemPlan, cfg: cfg_lib.ExperimentConfig, cache_dir: str,
               progress: bool) -> tuple[dict[str, Any], dict[str, dict]]:
  """Every unit of one system (cached or computed) and its per-seed statistics.

  Returns (info, units of the first seed by kind); info holds the per-seed statistics, their
  summary over seeds, the units' metadata and descriptions for the report.
  """
  from rlpost.dynamics import data as data_lib
  from rlpost.dynamics import systems as systems_lib

  data = data_lib.load_all(plan.name, seed=cfg.data_seed)
  sys_obj = systems_lib.get_system(plan.name)
  windows = U.unit_data(plan, data)
  per_seed, metas, first_units = [], [], None
  cached = 0
  for seed in range(cfg.seeds):
    units = {}
    for kind in plan.kinds():
      hit = U.load_cached(cache_dir, plan, kind, seed)
      if hit is None:
        t0 = time.perf_counter()
        arrays, meta = U.run_unit(kind, plan, data, seed)
        U.save_cached(cache_dir, plan, kind, seed, arrays, meta)
        _log(progress, f"[roundtrip] {plan.name} seed {seed} {kind}: "
                       f"{time.perf_counter() - t0:.0f} s (train {meta['seconds']['train']:.0f} s,"
                       f" evaluate {meta['seconds']['evaluate']:.0f} s)")
      else:
        arrays, meta = hit
        cached += 1
        _log(progress, f"[roundtrip] {plan.name} seed {seed} {kind}: cached")
      units[kind] = arrays
      metas.append(meta)
    n_test = len(U._take(data["test"], plan.num_test_traj))
    per_seed.append(A.seed_metrics(units, plan.depths, num_test_traj=n_test,
                                   num_starts=len(windows["starts"]),
                                   ood_every=plan.ood_start_every, coverage=cfg.coverage))
    if first_units is None:
      first_units = units
  bidir = [m for m in metas if m["kind"] == "bidir"]
  model = plan.train.model
  info = {
      "role": plan.role, "depths": list(plan.depths), "description": sys_obj.description,
      "ood_description": sys_obj.ood_description, "per_seed": per_seed,
      "summary": A.summarize(per_seed), "units": metas, "num_params": bidir[0]["num_params"],
      "model": (f"{'latent' if model.latent else 'field'} diffusion, width {model.width}, "
                f"{model.num_blocks} blocks"),
      "steps": plan.train.num_steps, "batch_size": plan.train.batch_size,
      "sampler": (f"{plan.sampler_steps} Euler steps from zero noise for E_i and C_i; "
                  f"M = {plan.num_samples} samples from Gaussian noise for the spread"),
      "rollouts": (f"{windows['test'].shape[0]} test windows ({len(windows['starts'])} start "
                   f"times x {windows['test'].shape[0] // len(windows['starts'])} trajectories), "
                   f"{windows['train'].shape[0]} training windows (calibrator), "
                   f"{windows['ood'].shape[0]} OOD windows"),
      "num_cached": cached,
  }
  return info, first_units


def run(args) -> dict:
  """Run (or resume) every unit, compute the tables and verdicts, write the outputs."""
  cfg = config_for(args)
  quick = bool(getattr(args, "quick", False))
  out_dir = getattr(args, "out", None) or os.path.join("results", "roundtrip")
  cache_dir = os.path.join(out_dir, "cache")
  progress = not getattr(args, "no_progress", False)
  os.makedirs(out_dir, exist_ok=True)
  t0 = time.perf_counter()
  systems, first_units = {}, {}
  for plan in cfg.plans:
    systems[plan.name], first_units[plan.name] = run_system(plan, cfg, cache_dir, progress)
  claims = CL.judge_all({n: s["summary"] for n, s in systems.items()},
                        {n: s["role"] for n, s in systems.items()},
                        {n: tuple(s["depths"]) for n, s in systems.items()})
  import jax

  units = [m for s in systems.values() for m in s["units"]]
  meta = {
      "mode": "quick" if quick else "full",
      "command": "python scripts/reproduce.py roundtrip" + (" --quick" if quick else "")
                 + (f" --seeds {args.seeds}" if getattr(args, "seeds", None) else ""),
      "hardware": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, "
                  f"jax {jax.__version__} on {jax.devices()[0].platform}",
      "python": sys.version.split()[0], "seeds": cfg.seeds, "data_seed": cfg.data_seed,
      "num_units": len(units), "num_cached": sum(s["num_cached"] for s in systems.values()),
      "seconds": {"total": time.perf_counter() - t0,
                  "units": float(sum(m["seconds"]["train"] + m["seconds"]["evaluate"]
                                     for m in units))},
  }
  text = rep.markdown(meta, systems, claims, cfg.coverage)
  with open(os.path.join(out_dir, "table.md"), "w") as f:
    f.write(text + "\n")
  files = rep.plots(systems, first_units, out_dir)
  meta["seconds"]["total"] = time.perf_counter() - t0
  payload = {"meta": meta, "config": dataclasses.asdict(cfg), "claims": claims,
             "systems": systems, "plots": [os.path.basename(p) for p in files]}
  with open(os.path.join(out_dir, "results.json"), "w") as f:
    json.dump(rep.jsonable(payload), f, indent=1)
  if not quick and getattr(args, "update_readme", True):
    from experiments.averaging import update_readme

    update_readme(text, path=README)
  _log(progress, text)
  _log(progress, f"\nwrote {out_dir}/table.md, results.json and {len(files)} plots in "
                 f"{meta['seconds']['total']:.0f} s")
  return payload


def verdict_counts(payload: dict) -> dict[str, int]:
  """How many paper claims got each overall verdict (for logs and tests)."""
  out: dict[str, int] = {}
  for c in payload["claims"]:
    if not c["control"]:
      out[c["verdict"]] = out.get(c["verdict"], 0) + 1
  return out
