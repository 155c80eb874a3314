"""Time split of one RL step: sampling, scoring, update, and the fused step.

The training step is one jitted program, so its parts are timed by compiling each part on its
own with the same inputs (sampling the rollouts; scoring them; reference log-probs, advantages
and the optimizer epochs) and, separately, the fused step. The parts' sum minus the fused time is
what fusion saves (or costs).
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp

from rlpost.rollouts import allocate
from rlpost.train.rl import RLState, Trainer


def _median_time(fn, *args, repeats: int) -> tuple[float, float]:
  jax.block_until_ready(fn(*args))  # compile
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  spread = (max(times) - min(times)) / 2 if len(times) > 1 else 0.0
  return statistics.median(times), spread


def time_split(trainer: Trainer, state: RLState | None = None, *, repeats: int = 5,
               memory: bool = False) -> dict:
  """Median seconds (and half-range spread) of each part of one RL step and of the fused step.

  ``memory``: also ``update_temp_bytes``, the XLA temporary buffers of the compiled update part
  (activations, gradients, optimizer moments in flight), None where the backend has no memory
  analysis.
  """
  state = trainer.init_state() if state is None else state
  cfg = trainer.cfg
  data = trainer.train_data
  p, g = cfg.num_prompts, cfg.group_size
  key = jax.random.key(0)
  idx = jnp.repeat(jnp.arange(p, dtype=jnp.int32), g)

  @jax.jit
  def sample(params, key):
    return trainer.sample(params, idx, key)

  ro = sample(state.params, key)

  @jax.jit
  def score(tokens, mask):
    return trainer.reward(tokens, mask, idx, data)

  collected = allocate.Allocation(ro, idx // g, jnp.ones((p * g,), bool), p, {})
  k_adv, k_mb = jax.random.split(key)

  @jax.jit
  def update(st, collected):
    return trainer.fns.update(st, collected, trainer.ref_params, k_adv, k_mb)

  out = {}
  out["sample"] = _median_time(sample, state.params, key, repeats=repeats)
  out["score"] = _median_time(score, ro.tokens, ro.mask, repeats=repeats)
  out["update"] = _median_time(update, state, collected, repeats=repeats)
  out["fused_step"] = _median_time(trainer.step, state, repeats=repeats)
  tokens = int(jnp.sum(ro.mask))
  if memory:
    stats = update.lower(state, collected).compile().memory_analysis()
    out_memory = {"update_temp_bytes": None if stats is None else int(stats.temp_size_in_bytes)}
  else:
    out_memory = {}
  return {
      **out_memory,
      **{f"{k}_s": v[0] for k, v in out.items()},
      **{f"{k}_spread_s": v[1] for k, v in out.items()},
      "rollouts": p * g,
      "completion_tokens": tokens,
  }
