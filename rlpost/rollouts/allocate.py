"""Rollout allocation: which prompts get how many rollouts, with static shapes.

Each rule is a pure function of a ``sample`` function, a ``prompts`` stream and a PRNG key, and
returns an ``Allocation``: the sampled rows, their group ids and validity, how many prompts of
the stream it consumed, and its metrics. Nothing here knows the model, the task or the trainer:

    sample(idx [R] int32, key) -> Rollouts of R rows (one completion per row for prompt idx[r])
    prompts(n) -> [n] int32, the indices of the next n prompts of the training stream

Rules (shape legend: P prompts per step, G group size, R rows):

* ``plain``: P prompts x G rollouts; R = P * G, every row valid.
* ``dynamic_sampling`` (DAPO): P * k groups sampled, the first P with mixed outcomes kept in
  sampling order (0 < #correct < G); if fewer than P are mixed, the remaining groups are filled
  with unmixed ones and marked invalid. R = P * G; consumes P * k prompts.
* ``dars`` (DARS, DARS-B): P * G stage-1 rows, then a fixed budget of stage-2 rows assigned to
  prompts by the schedule (``rlpost.rollouts.dars.extra_rollouts``) and merged into their
  groups; merged groups whose accuracy is 0 or 1 are invalid. R = P * G + budget. DARS-B is
  this with a budget below the schedule's need (the breadth variant takes a larger P).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from rlpost.rollouts import dars as dars_schedule


class Rollouts(NamedTuple):
  """Sampled and scored rows: prompt ids [R] int32, prompts [R, Tp] int32 / bool, the sampler's
  output (``rlpost.sampling.SampleOutput``: tokens, mask, policy_logprobs, finish_reason of R
  rows), rewards [R] float32 and correctness [R] bool."""

  idx: jax.Array
  prompts: jax.Array
  pmask: jax.Array
  sample: Any
  rewards: jax.Array
  correct: jax.Array

  @property
  def tokens(self) -> jax.Array:
    """[R, N] int32 completion tokens."""
    return self.sample.tokens

  @property
  def mask(self) -> jax.Array:
    """[R, N] bool, True on generated tokens."""
    return self.sample.mask

  @property
  def logp(self) -> jax.Array:
    """[R, N] float32 log-probs under the sampling policy (0 where masked)."""
    return self.sample.policy_logprobs


class Allocation(NamedTuple):
  """rollouts (R rows), group_id [R] int32 in [0, P), valid [R] bool, consumed (prompts of the
  stream used: a Python int, an int32 [] array when returned from ``jit``), metrics (dict of
  [] arrays)."""

  rollouts: Rollouts
  group_id: jax.Array
  valid: jax.Array
  consumed: int
  metrics: dict


Sample = Callable[[jax.Array, jax.Array], Rollouts]
Prompts = Callable[[int], jax.Array]


def plain(sample: Sample, prompts: Prompts, key: jax.Array, *, num_prompts: int,
          group_size: int) -> Allocation:
  """P prompts x G rollouts, all valid."""
  p, g = num_prompts, group_size
  k1, _ = jax.random.split(key)
  ro = sample(jnp.repeat(prompts(p), g), k1)
  group = jnp.repeat(jnp.arange(p, dtype=jnp.int32), g)
  return Allocation(ro, group, jnp.ones((p * g,), bool), p, {})


def dynamic_sampling(sample: Sample, prompts: Prompts, key: jax.Array, *, num_prompts: int,
                     group_size: int, factor: int,
                     constrain: Callable = lambda x: x) -> Allocation:
  """DAPO dynamic sampling: keep the first P of P * factor groups with mixed outcomes.

  ``constrain`` re-applies the rows' sharding after the selection (identity by default).
  Metrics: kept_groups (share of the kept P that are mixed), mixed_fraction_sampled.
  """
  p, g, k = num_prompts, group_size, factor
  if k == 1:
    return plain(sample, prompts, key, num_prompts=p, group_size=g)
  k1, _ = jax.random.split(key)
  ro = sample(jnp.repeat(prompts(p * k), g), k1)
  right = ro.correct.reshape(p * k, g).sum(axis=1)
  mixed = (right > 0) & (right < g)
  chosen = jnp.argsort(~mixed, stable=True)[:p]  # mixed groups first, in sampling order
  rows = (chosen[:, None] * g + jnp.arange(g)[None, :]).reshape(-1)
  ro = jax.tree.map(lambda x: constrain(x[rows]) if x.ndim >= 1 else x, ro)
  group = jnp.repeat(jnp.arange(p, dtype=jnp.int32), g)
  valid = jnp.repeat(mixed[chosen], g)
  metrics = dict(kept_groups=jnp.mean(mixed[chosen].astype(jnp.float32)),
                 mixed_fraction_sampled=jnp.mean(mixed.astype(jnp.float32)))
  return Allocation(ro, group, valid, p * k, metrics)


def dars(sample: Sample, prompts: Prompts, key: jax.Array, *, num_prompts: int, group_size: int,
         n_max: int, schedule: str, budget: int) -> Allocation:
  """DARS: stage-1 groups of G, then ``budget`` stage-2 rows by ``schedule`` ("et" or "hw").

  Stage-2 rows go to prompts in order, each taking its schedule's extra rollouts until the
  budget runs out (rows past the need are invalid). Metrics: dars_extra_rollouts,
  dars_budget_used, dars_all_wrong_stage1, dars_rescued (all-wrong prompts with a right
  stage-2 rollout), kept_groups (share of merged groups that are mixed).
  """
  p, g = num_prompts, group_size
  k1, k2 = jax.random.split(key)
  pidx = prompts(p)
  r1 = sample(jnp.repeat(pidx, g), k1)
  acc = r1.rewards.reshape(p, g).mean(axis=1)
  extra = dars_schedule.extra_rollouts(acc, g, n_max, schedule=schedule)
  cum = jnp.cumsum(extra)
  owner = jnp.searchsorted(cum, jnp.arange(budget), side="right")  # [budget]
  valid2 = jnp.arange(budget) < cum[-1]
  owner = jnp.minimum(owner, p - 1)
  r2 = sample(pidx[owner], k2)
  ro = jax.tree.map(lambda a, b: jnp.concatenate([a, b]) if a.ndim >= 1 else jnp.maximum(a, b),
                    r1, r2)
  group = jnp.concatenate([jnp.repeat(jnp.arange(p), g), owner]).astype(jnp.int32)
  valid = jnp.concatenate([jnp.ones((p * g,), bool), valid2])
  n_valid = jax.ops.segment_sum(valid.astype(jnp.int32), group, p)
  n_right = jax.ops.segment_sum((valid & ro.correct).astype(jnp.int32), group, p)
  mixed = (n_right > 0) & (n_right < n_valid)
  stage2_right = jax.ops.segment_sum((valid2 & r2.correct).astype(jnp.int32), owner, p)
  used = jnp.minimum(cum[-1], budget)
  metrics = dict(
      dars_extra_rollouts=used.astype(jnp.float32),
      dars_budget_used=used / max(budget, 1),
      dars_all_wrong_stage1=jnp.sum(acc == 0).astype(jnp.float32),
      dars_rescued=jnp.sum((acc == 0) & (stage2_right > 0)).astype(jnp.float32),
      kept_groups=jnp.mean(mixed.astype(jnp.float32)))
  return Allocation(ro, group, valid & mixed[group], p, metrics)
