"""``bench.py seeds``: K seeds of the GRPO step in one vmapped program vs one seed at a time.

The paper tables train every seed of an arm as one program (``experiments/rl_seeds.py``:
``jax.vmap`` of ``Trainer``'s step over stacked states). This benchmark measures what that buys on
the table-sized setting (the calibrated testbed of ``experiments/calibrate.py``: the 0.4M-parameter
character decoder, 64 prompts x G, 2-3 digit addition, KL 0, AdamW), for K = 1, 2, 4, 8:

  vmapped ms        median wall time of one call of the vmapped step over K stacked states
  per seed-step ms  vmapped ms / K
  vs one seed       vmapped ms / (the median time of ``Trainer.step`` on one state): the cost of
                    K seeds in one program in units of one seed's step. K separate runs cost K.
  temp MB           XLA temporaries of the compiled vmapped step (memory analysis)
  state MB          bytes of the K stacked train states (parameters, optimizer moments, keys)

Both programs are measured in the same process, alternating call by call (one single-seed step,
then one vmapped call, ``repeats`` times), so machine load affects both alike. The weights are the
random initialisation (``sft_steps=0``): every completion runs to ``max_new_tokens``, the most
expensive case, the same in both programs. The states advance between calls (a real run), so each
timed call is a different step of the same program; the first call of each program (its
compilation) is not timed.
"""

from __future__ import annotations

import statistics
import time

import jax
import numpy as np


def add_args(p) -> None:
  p.add_argument("--quick", action="store_true", help="toy model and batch (seconds)")
  p.add_argument("--seeds", default="1,2,4,8", help="comma-separated K values")
  p.add_argument("--prompts", type=int, default=64)
  p.add_argument("--group-size", type=int, default=8)
  p.add_argument("--repeats", type=int, default=5, help="timed calls per program")
  p.add_argument("--data-dir", default=None, help="task data directory (default: the trainer's)")


def _config(args) -> dict:
  from experiments import rl_seeds
  from experiments.grpo_arithmetic import CONFIG

  if args.quick:
    cfg = dict(rl_seeds.QUICK_BASE, task="arithmetic", recipe="grpo", sft_steps=0,
               num_prompts=args.prompts, group_size=args.group_size, lr=1e-4,
               recipe_args={"kl_coef": 0.0})
  else:
    cfg = dict(CONFIG, task_spec=dict(min_digits=2, max_digits=3, terms=2), sft_steps=0,
               num_prompts=args.prompts, group_size=args.group_size, lr=1e-4,
               recipe_args={"kl_coef": 0.0}, eval_problems=0)
  if args.data_dir:
    cfg["data_dir"] = args.data_dir
  return cfg


def _nbytes(tree) -> int:
  return sum(x.nbytes for x in jax.tree.leaves(tree))


def _timed(fn, state):
  t = time.perf_counter()
  state, metrics = fn(state)
  jax.block_until_ready((state, metrics))
  return time.perf_counter() - t, state


def _measure(trainer, k: int, repeats: int) -> dict:
  from experiments import rl_seeds

  single = trainer.init_state()
  states = rl_seeds.stack_states(trainer, list(range(k)))
  vm = rl_seeds.vmapped_step(trainer, states)
  compiled = jax.jit(jax.vmap(trainer.fns.step, in_axes=(0, None, None))).lower(
      states, trainer.train_data, trainer.ref_params).compile()
  mem = compiled.memory_analysis()
  # Compile both, untimed; then alternate one timed call of each.
  _, single = _timed(trainer.step, single)
  _, states = _timed(vm, states)
  t_one, t_vm = [], []
  for _ in range(repeats):
    t, single = _timed(trainer.step, single)
    t_one.append(t)
    t, states = _timed(vm, states)
    t_vm.append(t)
  one, vmapped = statistics.median(t_one), statistics.median(t_vm)
  spread = lambda ts: (max(ts) - min(ts)) / 2  # noqa: E731
  return {"K": k, "single_s": one, "single_spread_s": spread(t_one), "vmapped_s": vmapped,
          "vmapped_spread_s": spread(t_vm), "per_seed_step_s": vmapped / k,
          "vs_one_seed": vmapped / one,
          "temp_bytes": None if mem is None else int(mem.temp_size_in_bytes),
          "state_bytes": _nbytes(states)}


def format_table(rows: list[dict]) -> str:
  lines = ["| K | one seed ms | vmapped ms | per seed-step ms | vs one seed (K runs: K) | "
           "temp MB | state MB |", "|---:|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    temp = "-" if r["temp_bytes"] is None else f"{r['temp_bytes'] / 2 ** 20:.1f}"
    lines.append(f"| {r['K']} | {r['single_s'] * 1e3:.1f} (±{r['single_spread_s'] * 1e3:.0f}) | "
                 f"{r['vmapped_s'] * 1e3:.1f} (±{r['vmapped_spread_s'] * 1e3:.0f}) | "
                 f"{r['per_seed_step_s'] * 1e3:.1f} | {r['vs_one_seed']:.2f} | {temp} | "
                 f"{r['state_bytes'] / 2 ** 20:.2f} |")
  return "\n".join(lines)


def run(args) -> dict:
  from rlpost.train import rl

  if args.quick:
    args.prompts, args.group_size, args.repeats = 4, 4, 2
    ks = [1, 2]
  else:
    ks = [int(k) for k in str(args.seeds).split(",")]
  cfg = _config(args)
  trainer = rl.make_train(cfg, log=lambda s: None)
  rows = []
  for k in ks:
    rows.append(_measure(trainer, k, args.repeats))
    r = rows[-1]
    print(f"K={k}: vmapped {r['vmapped_s'] * 1e3:.1f} ms, one seed {r['single_s'] * 1e3:.1f} ms, "
          f"{r['vs_one_seed']:.2f}x one seed", flush=True)
  print()
  print(format_table(rows))
  params = int(sum(np.prod(x.shape) for x in jax.tree.leaves(trainer.init_state().params)))
  return {"benchmark": "seeds",
          "settings": {"quick": bool(args.quick), "seeds": ks, "prompts": args.prompts,
                       "group_size": args.group_size, "repeats": args.repeats,
                       "params": params, "config": cfg},
          "results": rows, "target": "8 seeds in one program <= 3x one seed"}
