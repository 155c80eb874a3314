"""``bench.py layers``: layers stored stacked (``stacked_layers``) against one by one, on CPU.

Stacking is what makes the full-size rows fit (``scripts/benchmarks/full_memory.py``: the remat
scan reads stacked weights in place); this benchmark measures what it costs or saves where the
tables run, both storages measured in one process, alternating call by call:

  step        the GRPO step of the table-sized setting (the calibrated testbed of
              ``experiments/calibrate.py``, as ``bench.py seeds``), with and without remat. Both
              trainers start from the same weights (the stacked one restacked).
  sampler     the KV-cache sampler alone on the ~10M-parameter model of ``bench.py sampler``
              (prompt 32, 128 new tokens, temperature 1); the sampler slices stacked layers
              into layers once per call, before its decode loop.

Medians and half-ranges of ``repeats`` calls each (the order within a round alternates); the
first call of each program (its compilation) is not timed. Ratios are stacked / stored (below 1: stacking is faster): of the
medians, and per round (the two calls of a round ran back to back, under the same load).
"""

from __future__ import annotations

import statistics

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from scripts.benchmarks import common


def add_args(p) -> None:
  p.add_argument("--quick", action="store_true", help="toy model and batch (seconds)")
  p.add_argument("--prompts", type=int, default=64)
  p.add_argument("--group-size", type=int, default=8)
  p.add_argument("--sampler-batch", type=int, default=64)
  p.add_argument("--repeats", type=int, default=7, help="timed calls per program")
  p.add_argument("--data-dir", default=None, help="task data directory (default: the trainer's)")


def _alternate(calls: dict, repeats: int) -> dict:
  """{name: (fn, state)} with fn(state) -> state: the untimed first call of each, then
  ``repeats`` rounds of one timed call of each, in turn, the order reversed every other round;
  {name: [seconds]}."""
  states = {k: jax.block_until_ready(fn(s)) for k, (fn, s) in calls.items()}
  times: dict[str, list[float]] = {k: [] for k in calls}
  clocked = {k: common.timed(fn, times[k], block=True) for k, (fn, _) in calls.items()}
  for i in range(repeats):
    for k in list(calls)[::-1 if i % 2 else 1]:
      states[k] = clocked[k](states[k])
  return times


def _row(what: str, times: dict) -> dict:
  med = {k: statistics.median(v) for k, v in times.items()}
  half = {k: (max(v) - min(v)) / 2 for k, v in times.items()}
  # Calls alternate, so round i's two calls ran under the same load: their ratio is paired.
  paired = [b / a for a, b in zip(times["stored"], times["stacked"])]
  return {"what": what, "stored_s": med["stored"], "stored_spread_s": half["stored"],
          "stacked_s": med["stacked"], "stacked_spread_s": half["stacked"],
          "stacked_over_stored": med["stacked"] / med["stored"],
          "paired_ratios": paired, "paired_ratio_median": statistics.median(paired)}


def _steps(args, remat: bool) -> dict:
  from rlpost.models import transformer as tfm
  from rlpost.train import rl
  from scripts.benchmarks import seeds

  cfg = dict(seeds._config(args), remat=remat)
  stored = rl.make_train(cfg, log=lambda s: None)
  stacked = rl.make_train(dict(cfg, model=dict(cfg.get("model") or {}, stacked_layers=True)),
                          log=lambda s: None)
  s0, t0 = stored.init_state(), stacked.init_state()
  # The character model is initialised with its layers stored and restacked: the same start.
  restacked = nnx.state(tfm.with_layers_stacked(nnx.merge(stored.policy.graphdef, s0.params)))
  assert all(bool(jnp.array_equal(a, b)) for a, b in zip(jax.tree.leaves(restacked),
                                                          jax.tree.leaves(t0.params)))
  step = lambda tr: (lambda s: tr.step(s)[0])  # noqa: E731
  return _row(f"GRPO step, remat={remat}",
              _alternate({"stored": (step(stored), s0), "stacked": (step(stacked), t0)},
                         args.repeats))


def _sampler(args) -> dict:
  from rlpost import sampling
  from rlpost.models import transformer as tfm

  name = "toy" if args.quick else "10m"
  model = tfm.init_model(common.MODELS[name], seed=0)
  batch, tp, n = (4, 8, 8) if args.quick else (args.sampler_batch, 32, 128)
  scfg = sampling.SamplingConfig(max_new_tokens=n, temperature=1.0)
  rng = np.random.default_rng(0)
  toks = jnp.asarray(rng.integers(1, common.MODELS[name].vocab_size, (batch, tp)), jnp.int32)
  mask = jnp.ones((batch, tp), bool)

  def call(m):
    sampler, params = sampling.Sampler(m, scfg), nnx.state(m)

    def fn(key):  # samples, then hands the next call a new key
      jax.block_until_ready(sampler(params, toks, mask, key).tokens)
      return jax.random.fold_in(key, 1)
    return fn, jax.random.key(0)

  calls = {"stored": call(model), "stacked": call(tfm.with_layers_stacked(model))}
  return _row(f"sampler, {name} model, batch {batch}, {tp} + {n} tokens",
              _alternate(calls, args.repeats))


def format_table(rows: list[dict]) -> str:
  lines = ["| what | stored ms | stacked ms | stacked / stored | per round: median (range) |",
           "|---|---:|---:|---:|---|"]
  for r in rows:
    p = r["paired_ratios"]
    lines.append(f"| {r['what']} | {r['stored_s'] * 1e3:.1f} (±{r['stored_spread_s'] * 1e3:.0f}) "
                 f"| {r['stacked_s'] * 1e3:.1f} (±{r['stacked_spread_s'] * 1e3:.0f}) | "
                 f"{r['stacked_over_stored']:.2f} | {r['paired_ratio_median']:.2f} "
                 f"({min(p):.2f}-{max(p):.2f}) |")
  return "\n".join(lines)


def run(args) -> dict:
  if args.quick:
    args.prompts, args.group_size, args.repeats = 4, 4, 2
  rows = [_steps(args, remat) for remat in (False, True)] + [_sampler(args)]
  for r in rows:
    print(f"{r['what']}: stored {r['stored_s'] * 1e3:.1f} ms, stacked "
          f"{r['stacked_s'] * 1e3:.1f} ms ({r['stacked_over_stored']:.2f}x)", flush=True)
  print()
  print(format_table(rows))
  return {"benchmark": "layers",
          "settings": {"quick": bool(args.quick), "prompts": args.prompts,
                       "group_size": args.group_size, "sampler_batch": args.sampler_batch,
                       "repeats": args.repeats},
          "results": rows}
