"""Where one RL table arm's wall time goes: building, compiling, training steps and evaluations.

An arm of an RL table (``experiments/rl_seeds.run_arm``) builds its trainer, compiles the
vmapped step and the evaluation, then runs ``steps`` vmapped steps over its seeds and evaluates
each seed every ``eval_every`` steps (the step-0 evaluation once). This probe times each part on
the table's own configuration for a few steps and extrapolates to the arm's design:

    python -m scripts.benchmarks.arm_profile [--table mc_grpo] [--arm G2-mean] [--steps 6]
        [--quick] [--out results/bench/arm_profile.json]

It also counts the arm's compilations (``Trainer.num_traces`` for the step, one evaluation
program per (rows, greedy) pair) and splits one single-seed step into sampling and update
(``rlpost.train.profile.time_split``). Run it alone on the machine: it measures wall time.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time

import jax

from scripts.benchmarks.common import host_record


TABLES = ("mc_grpo", "ace", "dars")


def arm_setup(table: str, arm: str, quick: bool = False) -> tuple[dict, list[int]]:
  """(RLConfig dict, seeds) of ``arm`` of RL table ``table``; KeyError names the arms."""
  from experiments import rl_table

  mod = importlib.import_module(f"experiments.{table}")
  design = mod.design(quick)
  cfgs = rl_table.arm_configs(mod.base_config(design), mod.arms(design))
  if arm not in cfgs:
    raise KeyError(f"--arm {arm}: not an arm of {table} (one of {', '.join(cfgs)})")
  return dict(cfgs[arm]), design.seed_list()


def profile_arm(cfg: dict, seeds: list[int], steps: int) -> dict:
  from experiments import rl_seeds
  from rlpost.train import profile, rl

  t0 = time.perf_counter()
  trainer = rl.make_train(dict(cfg, steps=steps, eval_every=steps), log=lambda s: None)
  build = time.perf_counter() - t0
  states = rl_seeds.stack_states(trainer, seeds)
  step = rl_seeds.vmapped_step(trainer, states)
  params0 = rl_seeds.unstack(states.params, 0)

  def timed(fn, *args):
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t

  eval_first = timed(trainer.evaluate, params0)
  evals = [timed(trainer.evaluate, params0) for _ in range(2)]
  step_times = []
  for _ in range(steps):
    t = time.perf_counter()
    states, metrics = step(states)
    jax.device_get(metrics)
    step_times.append(time.perf_counter() - t)
  compilations = trainer.num_traces  # before time_split compiles the parts on their own
  step_s, eval_s = statistics.median(step_times[1:]), statistics.median(evals)
  n_steps, every = cfg["steps"], cfg["eval_every"]
  n_evals = len(seeds) * len({s for s in range(every, n_steps + 1, every)} | {n_steps})
  parts = {"build": build, "step compilation": step_times[0] - step_s,
           "evaluation compilation": eval_first - eval_s, "steps": n_steps * step_s,
           "evaluations": (n_evals + 1) * eval_s}
  total = sum(parts.values())
  split = profile.time_split(trainer, repeats=10)
  return {"seeds": len(seeds), "design_steps": n_steps,
          "design_evaluations": n_evals + 1, "timed_steps": steps,
          "step_s": step_s, "step_spread_s": (max(step_times[1:]) - min(step_times[1:])) / 2,
          "evaluation_s": eval_s, "parts_s": parts, "arm_s_extrapolated": total,
          "shares": {k: v / total for k, v in parts.items()},
          "step_compilations": compilations,
          "single_seed_split_s": {k: split[k] for k in ("sample_s", "score_s", "update_s",
                                                        "fused_step_s")}}


def report(r: dict) -> str:
  lines = [f"{r['table']} arm {r['arm']}: {r['seeds']} seeds x {r['design_steps']} steps, "
           f"{r['design_evaluations']} evaluations; vmapped step {r['step_s']:.3f} s "
           f"(+-{r['step_spread_s']:.3f}), one evaluation {r['evaluation_s']:.3f} s, "
           f"{r['step_compilations']} step compilation(s)",
           f"extrapolated arm time {r['arm_s_extrapolated'] / 60:.1f} min:",
           "| part | s | share |", "|---|---:|---:|"]
  lines += [f"| {k} | {v:.1f} | {r['shares'][k]:.0%} |" for k, v in r["parts_s"].items()]
  s = r["single_seed_split_s"]
  lines.append(f"one seed's step alone: sampling {s['sample_s'] * 1e3:.1f} ms, scoring "
               f"{s['score_s'] * 1e3:.2f} ms, update {s['update_s'] * 1e3:.1f} ms, fused step "
               f"{s['fused_step_s'] * 1e3:.1f} ms")
  return "\n".join(lines)


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--table", default="mc_grpo", choices=TABLES)
  ap.add_argument("--arm", default="G2-mean")
  ap.add_argument("--steps", type=int, default=6, help="steps timed (the first compiles)")
  ap.add_argument("--quick", action="store_true", help="the table's --quick design (seconds)")
  ap.add_argument("--out", default=None, help="write the JSON here (never over a file)")
  args = ap.parse_args(argv)
  if args.steps < 3:
    ap.error("--steps must be >= 3 (the first compiles; the median needs two more)")
  if args.out and os.path.exists(args.out):
    ap.error(f"--out {args.out} exists; not overwritten")
  if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
    ap.error(f"--out {args.out}: its directory does not exist")
  try:
    cfg, seeds = arm_setup(args.table, args.arm, args.quick)
  except KeyError as e:
    ap.error(e.args[0])
  machine = host_record()
  r = {"table": args.table, "arm": args.arm, **profile_arm(cfg, seeds, args.steps)}
  text = report(r)
  print(text)
  if args.out:
    given = sys.argv[1:] if argv is None else argv
    command = "python -m scripts.benchmarks.arm_profile " + " ".join(given)
    with open(args.out, "x") as f:  # never over a file written meanwhile
      json.dump({"command": command.strip(), "machine": machine, **r, "report": text}, f,
                indent=1)
  return r


if __name__ == "__main__":
  main()
