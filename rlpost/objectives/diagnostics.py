"""Diagnostics: pure, jittable scalar statistics for training metrics and analyses.

Shape legend: B rollouts with group ids [B] int32 in ``[0, B)`` and masks [B] bool, T tokens,
K difficulty buckets. All outputs are float32 (0 when their denominator is empty).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp

from rlpost.objectives import groups
from rlpost.objectives.base import AdvantageTransform, compute_advantages
from rlpost.objectives.parts import safe_divide
from rlpost.objectives.losses import clip_indicators
from rlpost.types import RolloutBatch

__all__ = [
    "SignFlipRates",
    "sign_flip_rates",
    "fresh_group_sign_flips",
    "zero_variance_fraction",
    "zero_advantage_fraction",
    "per_prompt_mean",
    "ClipFractions",
    "clip_fractions",
    "EffectiveSampleSize",
    "effective_sample_size",
    "overconfident_error_fraction",
    "DifficultyBuckets",
    "advantage_by_difficulty",
]


class SignFlipRates(NamedTuple):
  """Attributes (scalars):
  opposite: fraction of rollouts whose advantage has the opposite sign of the reference.
  zeroed: fraction whose advantage is 0 (|A| <= atol) while the reference is not.
  count: number of rollouts in the denominator (mask and nonzero reference advantage).
  """

  opposite: jax.Array
  zeroed: jax.Array
  count: jax.Array

  def to_json(self) -> dict:
    """{"opposite", "zeroed", "correct" (the rest; 0 when nothing is counted), "count"} as
    Python numbers (host side)."""
    opp, zero, count = float(self.opposite), float(self.zeroed), int(self.count)
    return {"opposite": opp, "zeroed": zero, "correct": 1.0 - opp - zero if count else 0.0,
            "count": count}


def sign_flip_rates(
    advantages: jax.Array,
    rewards: jax.Array,
    reference_baseline: jax.Array,
    mask: jax.Array,
    *,
    atol: float = 0.0,
) -> SignFlipRates:
  """Advantage sign flips against a reference baseline (MC-GRPO's diagnosis).

  The reference advantage is r_i - b_i with b_i e.g. the prompt's true pass rate estimated
  from a large group. Over rollouts with ``mask`` and a nonzero reference advantage:
  ``opposite`` = share with sign(A_i) = -sign(r_i - b_i) and |A_i| > atol; ``zeroed`` = share
  with |A_i| <= atol.

  Args:
    advantages: [B] float32 small-group advantages.
    rewards: [B] float32.
    reference_baseline: [B] float32 reference baseline of each rollout's prompt.
    mask: [B] bool rollouts to count (e.g. ``weights > 0`` to leave out excluded pivots).
    atol: tolerance under which an advantage counts as zero.
  """
  chex.assert_rank([advantages, rewards, reference_baseline, mask], 1)
  chex.assert_equal_shape([advantages, rewards, reference_baseline, mask])
  ref = jnp.sign(rewards - reference_baseline)
  counted = mask & (ref != 0)
  zero = jnp.abs(advantages) <= atol
  opposite = counted & ~zero & (jnp.sign(advantages) == -ref)
  zeroed = counted & zero
  n = jnp.sum(counted, dtype=jnp.float32)
  return SignFlipRates(
      opposite=safe_divide(jnp.sum(opposite, dtype=jnp.float32), n),
      zeroed=safe_divide(jnp.sum(zeroed, dtype=jnp.float32), n),
      count=n,
  )


def fresh_group_sign_flips(
    advantage: AdvantageTransform,
    rewards: jax.Array,
    reference_baseline: jax.Array,
    group_size: int,
    *,
    key: Optional[jax.Array] = None,
) -> SignFlipRates:
  """Sign flips of an advantage transform's small-group advantages against a reference baseline,
  over fresh groups (MC-GRPO's diagnosis of small-group baselines).

  Each prompt's M rollouts are cut into M // ``group_size`` disjoint groups (the last M mod
  ``group_size`` left out) and scored by ``advantage`` alone (e.g. a recipe's ``advantage``);
  ``sign_flip_rates`` then compares each advantage with r - b, b its prompt's reference baseline,
  over the rollouts the loss weighs (weight > 0: pivots and dropped members are not counted).
  The reference should come from other rollouts than ``rewards`` (fresh groups).

  Args:
    advantage: an AdvantageTransform of rewards only (its batch has one dummy token per row).
    rewards: [P, M] float32 rewards of M rollouts of each of P prompts.
    reference_baseline: [P] float32 reference baseline of each prompt.
    group_size: rollouts per group.
    key: PRNG key for transforms that sample (a random member dropped), or None.
  """
  chex.assert_rank(rewards, 2)
  p, m = rewards.shape
  per = m // group_size
  r = jnp.asarray(rewards[:, :per * group_size], jnp.float32).reshape(-1)
  batch = RolloutBatch(
      group_id=jnp.repeat(jnp.arange(p * per, dtype=jnp.int32), group_size),
      valid=jnp.ones(r.shape, bool), tokens=jnp.zeros((r.size, 1), jnp.int32),
      token_mask=jnp.ones((r.size, 1), bool), rewards=r)
  adv, _ = compute_advantages(advantage, batch, key=key)
  b = jnp.repeat(jnp.asarray(reference_baseline, jnp.float32), per * group_size)
  return sign_flip_rates(adv.values, batch.rewards, b, adv.weights > 0)


def zero_variance_fraction(rewards: jax.Array, group_id: jax.Array, valid: jax.Array) -> jax.Array:
  """Fraction of non-empty groups whose valid rewards are all equal (no learning signal).

  Groups of size 1 count as zero-variance.

  Args:
    rewards: [B] float32.
    group_id: [B] int32.
    valid: [B] bool.

  Returns:
    [] float32.
  """
  eq = groups.group_all_equal(rewards, group_id, valid)
  first = groups.group_first(valid, group_id, valid)  # one representative per group
  return safe_divide(jnp.sum(first & eq, dtype=jnp.float32), jnp.sum(first, dtype=jnp.float32))


def zero_advantage_fraction(values: jax.Array, weights: jax.Array, token_mask: jax.Array,
                            group_id: jax.Array) -> jax.Array:
  """Fraction of the step's groups (every group id with a row, valid or not) in which no
  rollout the loss weighs has a nonzero advantage: nothing to learn from the group, whatever
  its rewards (shaped advantages count), and a group an allocation dropped counts as such.

  Args:
    values: [B] or [B, T] float32 advantages (``Advantages.values``).
    weights: [B] float32 loss weights (0 on invalid rows).
    token_mask: [B, T] bool (used with [B, T] values).
    group_id: [B] int32.

  Returns:
    [] float32.
  """
  rows = jnp.ones(group_id.shape, bool)
  nonzero = values != 0 if values.ndim == 1 else jnp.any((values != 0) & token_mask, axis=1)
  signal = groups.group_sum((nonzero & (weights > 0)).astype(jnp.float32), group_id, rows) > 0
  first = groups.group_first(rows, group_id, rows)
  return safe_divide(jnp.sum(first & ~signal, dtype=jnp.float32),
                     jnp.sum(first, dtype=jnp.float32))


def per_prompt_mean(values: jax.Array, group_id: jax.Array, valid: jax.Array) -> jax.Array:
  """The mean over non-empty groups of each group's mean of ``values`` [B] over its valid rows:
  every prompt counts once, however many rollouts an allocation gave it. [] float32."""
  first = groups.group_first(valid, group_id, valid)
  mean = groups.group_sum(values.astype(jnp.float32), group_id, valid) / jnp.maximum(
      groups.group_count(group_id, valid), 1.0)
  return safe_divide(jnp.sum(jnp.where(first, mean, 0.0)), jnp.sum(first, dtype=jnp.float32))


class ClipFractions(NamedTuple):
  """Token fractions (scalars) where the low clip, the high clip and the dual clip are active."""

  low: jax.Array
  high: jax.Array
  dual: jax.Array


def clip_fractions(
    log_ratio: jax.Array,
    advantages: jax.Array,
    token_mask: jax.Array,
    *,
    eps_low: float,
    eps_high: float,
    dual_clip: Optional[float] = None,
) -> ClipFractions:
  """Fractions of valid tokens clipped below (A < 0, rho < 1 - eps_low), above (A > 0,
  rho > 1 + eps_high) and by the dual clip (A < 0, rho > c).

  Args:
    log_ratio: [B, T] float32.
    advantages: [B] or [B, T] float32.
    token_mask: [B, T] bool.
    eps_low, eps_high, dual_clip: as in ``ppo_clip_token_loss``.
  """
  chex.assert_equal_shape([log_ratio, token_mask])
  c = clip_indicators(
      log_ratio, advantages, eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip
  )
  n = jnp.sum(token_mask, dtype=jnp.float32)

  def frac(x):
    return safe_divide(jnp.sum(x & token_mask, dtype=jnp.float32), n)

  return ClipFractions(low=frac(c.low), high=frac(c.high), dual=frac(c.dual))


class EffectiveSampleSize(NamedTuple):
  """ess: (sum w)^2 / sum w^2; fraction: ess / number of valid weights, in (0, 1]."""

  ess: jax.Array
  fraction: jax.Array


def effective_sample_size(log_weights: jax.Array, mask: jax.Array) -> EffectiveSampleSize:
  """Kish's effective sample size of importance weights w = exp(log_weights) (VCPO, M2PO).

  Computed stably from log weights (shifted by their max). For sequence-level weights pass
  ``sum_t (logp - behaviour_logp)`` per rollout; token level, flatten [B, T] with the token mask.

  Args:
    log_weights: [N] float32 (any rank; flattened).
    mask: same shape, bool.
  """
  chex.assert_equal_shape([log_weights, mask])
  lw = jnp.ravel(log_weights).astype(jnp.float32)
  m = jnp.ravel(mask)
  mx = jnp.max(jnp.where(m, lw, -jnp.inf))
  mx = jnp.where(jnp.isfinite(mx), mx, 0.0)
  w = jnp.where(m, jnp.exp(lw - mx), 0.0)
  ess = safe_divide(jnp.square(jnp.sum(w)), jnp.sum(jnp.square(w)))
  return EffectiveSampleSize(ess=ess, fraction=safe_divide(ess, jnp.sum(m, dtype=jnp.float32)))


def overconfident_error_fraction(
    shift: jax.Array, correct: jax.Array, valid: jax.Array
) -> jax.Array:
  """ACE's overconfident errors: fraction of valid rollouts with c_i > 0 that are wrong.

  Args:
    shift: [B] float32 confidence shifts c_i = sum_t (logp - ref_logp) (``confidence_shift``).
    correct: [B] bool grader verdicts.
    valid: [B] bool.

  Returns:
    [] float32 (#valid & c > 0 & ~correct) / #valid.
  """
  chex.assert_rank([shift, correct, valid], 1)
  chex.assert_equal_shape([shift, correct, valid])
  bad = valid & (shift > 0) & ~correct
  return safe_divide(jnp.sum(bad, dtype=jnp.float32), jnp.sum(valid, dtype=jnp.float32))


class DifficultyBuckets(NamedTuple):
  """Per-bucket statistics, each [K] float32.

  Attributes:
    mean_abs_advantage: mean |A_i| over the rollouts of the bucket's groups.
    cumulative_advantage: mean over the bucket's groups of sum_i |A_i| (DARS's cumulative
      advantage of a group).
    num_groups: number of non-empty groups in the bucket.
  """

  mean_abs_advantage: jax.Array
  cumulative_advantage: jax.Array
  num_groups: jax.Array


def advantage_by_difficulty(
    advantages: jax.Array,
    correct: jax.Array,
    group_id: jax.Array,
    valid: jax.Array,
    *,
    num_buckets: int,
) -> DifficultyBuckets:
  """|advantage| per difficulty bucket (DARS's cumulative-advantage analysis).

  A group's difficulty is its pass rate a = mean of ``correct`` over valid members; bucket k
  holds groups with a in [k/K, (k+1)/K) (a = 1 falls in the last bucket).

  Args:
    advantages: [B] float32.
    correct: [B] bool.
    group_id: [B] int32.
    valid: [B] bool.
    num_buckets: K.
  """
  chex.assert_rank([advantages, correct, group_id, valid], 1)
  chex.assert_equal_shape([advantages, correct, group_id, valid])
  n = groups.group_count(group_id, valid)
  acc = safe_divide(groups.group_sum(correct.astype(jnp.float32), group_id, valid), n)
  bucket = jnp.clip(jnp.floor(acc * num_buckets).astype(jnp.int32), 0, num_buckets - 1)
  bucket = jnp.where(valid, bucket, num_buckets)  # invalid rows go to a dropped segment
  a = jnp.where(valid, jnp.abs(advantages), 0.0)
  k = num_buckets + 1
  sum_abs = jax.ops.segment_sum(a, bucket, num_segments=k)[:num_buckets]
  cnt = jax.ops.segment_sum(valid.astype(jnp.float32), bucket, num_segments=k)[:num_buckets]
  first = groups.group_first(valid, group_id, valid).astype(jnp.float32)
  ngroups = jax.ops.segment_sum(first, bucket, num_segments=k)[:num_buckets]
  return DifficultyBuckets(
      mean_abs_advantage=safe_divide(sum_abs, cnt),
      cumulative_advantage=safe_divide(sum_abs, ngroups),
      num_groups=ngroups,
  )
