"""``bench.py lora``: memory and step time of LoRA against full fine-tuning on the same model.

One process builds the same GRPO run twice (the ``train`` benchmark's setting: 16 prompts x G=8,
64 new tokens, random weights, KL 0.04, so the reference forward runs too), once with full
fine-tuning and once with ``lora_rank`` adapters on every projection (q/k/v/o, gate/up/down),
and reports side by side:

  params            every parameter of the policy (with LoRA: base + adapters)
  trainable         the parameters the optimizer updates
  param / opt MB    bytes of the train state's parameters and of the optimizer state (AdamW:
                    two moments per trainable parameter and a count)
  update temp MB    the optimizer part's XLA temporary buffers (activations, gradients,
                    moments in flight) from the compiled program's memory analysis
  update / step ms  median time of the optimizer part (reference log-probs, advantages, loss,
                    gradient, AdamW) and of the fused RL step (sampling included), each jitted
                    on its own (``rlpost.train.profile.time_split``)

The base weights stay in the parameters in both modes (the policy samples with them); what LoRA
removes is their gradients and their optimizer moments. Sampling costs the same in both (slightly
more with adapters: one extra low-rank matmul pair per projection).
"""

from __future__ import annotations

import jax

from scripts.benchmarks.train import POLICY, TOY_POLICY

# A wider model than the train benchmark's 0.81M one, so the optimizer state is not noise.
MODEL = dict(POLICY, hidden_size=256, intermediate_size=768, num_heads=8, num_kv_heads=4)


def add_args(p) -> None:
  p.add_argument("--quick", action="store_true", help="toy model and batch (seconds)")
  p.add_argument("--rank", type=int, default=8, help="LoRA rank")
  p.add_argument("--alpha", type=float, default=16.0, help="LoRA alpha")
  p.add_argument("--prompts", type=int, default=16)
  p.add_argument("--group-size", type=int, default=8)
  p.add_argument("--new-tokens", type=int, default=64)
  p.add_argument("--repeats", type=int, default=5, help="timed calls per part and mode")
  p.add_argument("--data-dir", default=None, help="task data directory (default: the trainer's)")


def _config(args, rank: int) -> dict:
  cfg = dict(task="arithmetic", graded_reward=True, sft_steps=0, recipe="grpo",
             recipe_args={"kl_coef": 0.04}, num_prompts=args.prompts,
             group_size=args.group_size, max_new_tokens=args.new_tokens, lr=1e-4,
             model=dict(TOY_POLICY if args.quick else MODEL), num_train=2000, num_test=40,
             eval_problems=0, lora_rank=rank, lora_alpha=args.alpha)
  if args.quick:
    cfg.update(num_train=200)
  if args.data_dir:
    cfg["data_dir"] = args.data_dir
  return cfg


def _nbytes(tree) -> int:
  return sum(x.nbytes for x in jax.tree.leaves(tree))


def _measure(args, rank: int) -> dict:
  from rlpost.models import lora
  from rlpost.train import profile, rl

  trainer = rl.make_train(_config(args, rank), log=lambda s: None)
  state = trainer.init_state()
  total, adapters = lora.count(state.params)
  split = profile.time_split(trainer, state, repeats=args.repeats, memory=True)
  return {"mode": f"lora r={rank}" if rank else "full", "rank": rank, "params": total,
          "trainable": adapters if rank else total,
          "param_bytes": _nbytes(state.params), "opt_state_bytes": _nbytes(state.opt_state),
          "update_temp_bytes": split["update_temp_bytes"],
          "update_s": split["update_s"], "update_spread_s": split["update_spread_s"],
          "step_s": split["fused_step_s"], "step_spread_s": split["fused_step_spread_s"],
          "sample_s": split["sample_s"]}


def format_table(rows: list[dict]) -> str:
  mb = lambda b: "-" if b is None else f"{b / 2 ** 20:.2f}"  # noqa: E731
  lines = ["| mode | params | trainable | param MB | opt state MB | update temp MB | "
           "update ms | step ms |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    lines.append(f"| {r['mode']} | {r['params']:,} | {r['trainable']:,} "
                 f"({r['trainable'] / r['params']:.1%}) | {mb(r['param_bytes'])} | "
                 f"{mb(r['opt_state_bytes'])} | {mb(r['update_temp_bytes'])} | "
                 f"{r['update_s'] * 1e3:.1f} | {r['step_s'] * 1e3:.1f} |")
  return "\n".join(lines)


def run(args) -> dict:
  if args.quick:
    args.prompts, args.group_size, args.new_tokens, args.repeats = 4, 4, 8, 2
  rows = []
  for rank in (0, args.rank):
    rows.append(_measure(args, rank))
    r = rows[-1]
    print(f"{r['mode']}: {r['trainable']:,} of {r['params']:,} parameters trained, optimizer "
          f"state {r['opt_state_bytes'] / 2 ** 20:.2f} MB, update {r['update_s'] * 1e3:.1f} ms, "
          f"step {r['step_s'] * 1e3:.1f} ms", flush=True)
  full, adapted = rows
  ratios = {"opt_state": adapted["opt_state_bytes"] / full["opt_state_bytes"],
            "update_time": adapted["update_s"] / full["update_s"],
            "step_time": adapted["step_s"] / full["step_s"]}
  if full["update_temp_bytes"] and adapted["update_temp_bytes"]:
    ratios["update_temp"] = adapted["update_temp_bytes"] / full["update_temp_bytes"]
  print()
  print(format_table(rows))
  return {"benchmark": "lora",
          "settings": {"quick": bool(args.quick), "rank": args.rank, "alpha": args.alpha,
                       "targets": "q,k,v,o,gate,up,down projections",
                       "prompts": args.prompts, "group_size": args.group_size,
                       "new_tokens": args.new_tokens, "repeats": args.repeats,
                       "config": _config(args, args.rank)},
          "results": rows, "lora_over_full": ratios}
