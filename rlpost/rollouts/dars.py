"""DARS rollout allocation (Difficulty Adaptive Rollout Sampling), with static shapes.

Stage 1 samples N rollouts per prompt; a = the group's mean binary reward. Prompts with a < 0.5
get extra stage-2 rollouts so that their cumulative |advantage| approaches the peak a group
reaches at a = 0.5 (official code: yangzhch6/DARS, ``ray_dars_trainer.py``, ``schedule_ET`` and
``schedule_HW``):

  a <= 1e-6  ->  a = 0.5 / N        (an all-wrong group still gets a budget)
  a >= 0.5   ->  no extra rollouts
  without std (the official default): S = 2 a (1 - a), P = N / 2;  with std: S = 2 sqrt(a(1-a)), P = N
  equal treatment:     extra = min(ceil((P - N S) / S), n_max - N)
  hardness weighted:   extra = min(ceil((2 (1 - a) P - N S) / S), n_max - N)

Stage-2 rollouts merge into the prompt's group; merged groups whose accuracy is 0 or 1 are
dropped from the update (``rlpost.rollouts.allocate.dars`` does both with static shapes).

Shapes: P prompts, N stage-1 rollouts per prompt, n_max the largest merged group.
"""

from __future__ import annotations

import jax.numpy as jnp


def extra_rollouts(accuracy, n: int, n_max: int, *, schedule: str = "et", use_std: bool = False):
  """Stage-2 rollouts per prompt. accuracy: [P] float32 stage-1 mean reward -> [P] int32."""
  if schedule not in ("et", "hw"):
    raise ValueError(f"DARS schedule must be 'et' or 'hw', got {schedule!r}")
  if n_max < n:
    raise ValueError(f"DARS n_max ({n_max}) must be >= the stage-1 group size N ({n})")
  a = jnp.asarray(accuracy, jnp.float32)
  a_eff = jnp.where(a <= 1e-6, 0.5 / n, a)
  if use_std:
    s = 2.0 * jnp.sqrt(a_eff * (1.0 - a_eff))
    peak = float(n)
  else:
    s = 2.0 * a_eff * (1.0 - a_eff)
    peak = n / 2.0
  target = peak if schedule == "et" else 2.0 * (1.0 - a_eff) * peak
  # A small tolerance keeps exact ratios (e.g. 3.0000001) from rounding up by float error.
  extra = jnp.ceil((target - n * s) / s - 1e-5)
  extra = jnp.clip(extra, 0, n_max - n)
  return jnp.where(a >= 0.5, 0, extra).astype(jnp.int32)

