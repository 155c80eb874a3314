"""``bench.py scaling``: RL step time vs batch, sequence length and model size; compilations.

Each sweep varies one factor of ``rlpost.train.rl.Trainer``'s GRPO step around a base setting
(the ``train`` benchmark's: 16 prompts x G=8, 64 new tokens, the 0.81M-parameter policy, random
weights, KL 0.04) and reports the median seconds per fused step and the seconds per token
(rollouts x (prompt + new tokens)). "vs linear" is the measured time over the time that scaling
the sweep's first point linearly in tokens (in parameters x tokens for the model sweep) would
predict: 1.0 is linear; below 1 the step amortises fixed costs, above 1 it grows faster than its
work.

Compilations: one run of 20 steps per setting, counting XLA backend compilations with a
``jax.monitoring`` listener (every ``jit`` in the process, not only the step) and the step's own
trace count. A fused step must compile once per distinct shape and never again.

With random weights almost every row runs to the token limit, so the sampler's decode loop runs
its full length in every setting (the mean completion length is reported).
"""

from __future__ import annotations

import statistics
import time

import jax
import numpy as np

from scripts.benchmarks.train import POLICY, TOY_POLICY

_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"


def add_args(p) -> None:
  p.add_argument("--quick", action="store_true", help="toy sweeps (seconds)")
  p.add_argument("--prompts", default="4,8,16,32", help="prompts per step (G fixed)")
  p.add_argument("--new-tokens", default="16,32,64,128", help="completion lengths")
  p.add_argument("--hidden", default="64,128,256", help="model widths (layers fixed at 4)")
  p.add_argument("--group-size", type=int, default=8)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--compile-steps", type=int, default=20)
  p.add_argument("--data-dir", default=None)


class CompileCounter:
  """Counts XLA backend compilations in this process while active."""

  def __init__(self):
    self.count = 0
    self.seconds = 0.0
    self.active = False
    jax.monitoring.register_event_duration_secs_listener(self._listen)

  def _listen(self, event: str, duration: float, **_) -> None:
    if self.active and event == _BACKEND_COMPILE:
      self.count += 1
      self.seconds += duration


def _config(args, prompts: int, new_tokens: int, hidden: int | None) -> dict:
  model = dict(TOY_POLICY if args.quick else POLICY)
  if hidden is not None:
    model.update(hidden_size=hidden, intermediate_size=3 * hidden,
                 num_heads=max(2, hidden // 32), num_kv_heads=max(1, hidden // 64))
  cfg = dict(task="arithmetic", graded_reward=True, sft_steps=0, recipe="grpo",
             num_prompts=prompts, group_size=args.group_size, max_new_tokens=new_tokens,
             model=model, num_train=2000 if not args.quick else 200, num_test=40,
             eval_every=10 ** 6, eval_problems=0)
  if args.data_dir:
    cfg["data_dir"] = args.data_dir
  return cfg


def _measure(cfg: dict, repeats: int, counter: CompileCounter) -> dict:
  from rlpost.train import rl

  trainer = rl.make_train(cfg, log=lambda s: None)
  state = trainer.init_state()
  counter.count, counter.seconds, counter.active = 0, 0.0, True
  t0 = time.perf_counter()
  state, metrics = trainer.step(state)
  jax.block_until_ready(state)
  first = time.perf_counter() - t0
  compiles_first = counter.count
  times, lengths = [], []
  for _ in range(repeats):
    t0 = time.perf_counter()
    state, metrics = trainer.step(state)
    jax.block_until_ready((state, metrics))
    times.append(time.perf_counter() - t0)
    lengths.append(float(metrics["response_length"]))
  counter.active = False
  tp = int(trainer.train_data.prompt_tokens.shape[1])
  rollouts = cfg["num_prompts"] * cfg["group_size"]
  tokens = rollouts * (tp + trainer.max_new_tokens)
  med = statistics.median(times)
  return {"prompts": cfg["num_prompts"], "group_size": cfg["group_size"],
          "new_tokens": trainer.max_new_tokens, "prompt_len": tp,
          "hidden": trainer.model_cfg.hidden_size, "params": trainer.model_cfg.num_params(),
          "rollouts": rollouts, "tokens": tokens, "median_s": med,
          "spread": (max(times) - min(times)) / med, "seconds": times,
          "us_per_token": med / tokens * 1e6, "mean_completion": float(np.mean(lengths)),
          "first_step_s": first, "compiles_first_step": compiles_first,
          "compiles_later": counter.count - compiles_first, "step_traces": trainer.num_traces}


def _sweep(name: str, rows: list[dict], work_key) -> list[dict]:
  base = rows[0]
  for r in rows:
    r["sweep"] = name
    r["vs_linear"] = (r["median_s"] / base["median_s"]) / (work_key(r) / work_key(base))
  return rows


def _compile_run(cfg: dict, steps: int, counter: CompileCounter) -> dict:
  """Compilations and time over ``steps`` steps of one setting, from a fresh trainer."""
  from rlpost.train import rl

  counter.count, counter.seconds, counter.active = 0, 0.0, True
  trainer = rl.make_train(cfg, log=lambda s: None)
  state = trainer.init_state()
  per_step = []
  for _ in range(steps):
    before = counter.count
    state, metrics = trainer.step(state)
    jax.block_until_ready((state, metrics))
    per_step.append(counter.count - before)
  counter.active = False
  return {"steps": steps, "compilations_per_step": per_step,
          "compilations_after_first": int(sum(per_step[1:])),
          "backend_compile_s": counter.seconds, "step_traces": trainer.num_traces}


def run(args) -> dict:
  if args.quick:
    prompts, new_tokens, hidden = [2, 4], [4, 8], [16, 32]
    args.group_size, repeats, steps = 2, 2, 3
  else:
    prompts = [int(x) for x in args.prompts.split(",")]
    new_tokens = [int(x) for x in args.new_tokens.split(",")]
    hidden = [int(x) for x in args.hidden.split(",")]
    repeats, steps = args.repeats, args.compile_steps
  base_p, base_n = prompts[len(prompts) // 2], new_tokens[len(new_tokens) // 2]
  counter = CompileCounter()
  rows = []
  rows += _sweep("batch", [_measure(_config(args, p, base_n, None), repeats, counter)
                           for p in prompts], lambda r: r["tokens"])
  _print(rows[-len(prompts):])
  rows += _sweep("sequence", [_measure(_config(args, base_p, n, None), repeats, counter)
                              for n in new_tokens], lambda r: r["tokens"])
  _print(rows[-len(new_tokens):])
  rows += _sweep("model", [_measure(_config(args, base_p, base_n, h), repeats, counter)
                           for h in hidden], lambda r: r["tokens"] * r["params"])
  _print(rows[-len(hidden):])
  compiles = _compile_run(_config(args, base_p, base_n, None), steps, counter)
  print(f"\ncompilations over {steps} steps of one setting: {compiles['compilations_per_step']} "
        f"(XLA backend compiles per step, all jits in the process); step traced "
        f"{compiles['step_traces']} time(s); backend compile {compiles['backend_compile_s']:.1f} s")
  print()
  print(format_table(rows))
  return {"benchmark": "scaling",
          "settings": {"quick": bool(args.quick), "prompts": prompts, "new_tokens": new_tokens,
                       "hidden": hidden, "group_size": args.group_size, "repeats": repeats,
                       "base": {"prompts": base_p, "new_tokens": base_n},
                       "base_config": _config(args, base_p, base_n, None)},
          "results": rows, "compilations": compiles}


def _print(rows: list[dict]) -> None:
  for r in rows:
    print(f"{r['sweep']:>8}: {r['rollouts']:4d} rollouts x {r['prompt_len']}+{r['new_tokens']} "
          f"tokens, {r['params'] / 1e6:.2f}M params: {r['median_s'] * 1e3:8.1f} ms/step "
          f"({r['us_per_token']:.2f} us/token, x{r['vs_linear']:.2f} of linear), first step "
          f"{r['first_step_s']:.1f} s with {r['compiles_first_step']} compiles, "
          f"{r['compiles_later']} later", flush=True)


def format_table(rows: list[dict]) -> str:
  lines = ["| sweep | rollouts | prompt+new tokens | params | ms/step (spread) | us/token | "
           "vs linear | first step s | compiles (first, later) |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    lines.append(
        f"| {r['sweep']} | {r['rollouts']} | {r['prompt_len']}+{r['new_tokens']} | "
        f"{r['params'] / 1e6:.2f}M | {r['median_s'] * 1e3:,.1f} ({r['spread']:.0%}) | "
        f"{r['us_per_token']:.2f} | {r['vs_linear']:.2f} | {r['first_step_s']:.1f} | "
        f"{r['compiles_first_step']}, {r['compiles_later']} |")
  return "\n".join(lines)
