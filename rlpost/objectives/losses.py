"""Policy-loss pieces: PPO clipping, KL estimators, entropy, aggregation, and ``policy_loss``.

Shape legend: B rollouts, T tokens, V vocabulary. ``logp`` [B, T] float32 are the current
policy's differentiable log-probs of the batch's tokens; advantages [B] float32 and sample
weights [B] float32 are constants (``stop_gradient``). Losses are to be minimised.

Aggregation (``aggregate``) returns a ``LossParts(sum, denominator)`` pair whose denominator does
not depend on the parameters. Combine pairs from micro-batches, accumulation steps or
data-parallel shards (each a disjoint set of whole rollouts) by adding sums and denominators and
dividing once: ``total_sum / total_denominator``. The result and its gradient then equal the
full-batch loss whatever the split or the padding.

    mode                 sum over rows b                       denominator
    token_mean           sum_b w_b sum_t m_bt l_bt             sum_b w_b n_b
    seq_mean_token_mean  sum_b w_b (sum_t m_bt l_bt) / n_b     sum_b w_b
    seq_sum_const_len    sum_b w_b sum_t m_bt l_bt             L_max sum_b w_b

    token_mean:          DAPO; TRL "dapo"; verl "token-mean".
    seq_mean_token_mean: original GRPO; TRL "grpo"; verl "seq-mean-token-mean" (n_b >= 1 assumed;
                         an empty sequence contributes 0 to the sum and 1 to the denominator).
    seq_sum_const_len:   Dr.GRPO, DARS; TRL "dr_grpo"; verl "seq-mean-token-sum-norm".

with m the token mask, n_b = sum_t m_bt, w_b the sample weight (0 for padded members and
excluded pivots, so they enter neither sum nor denominator) and L_max a constant length.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp

from rlpost.objectives.base import LossParts, safe_divide
from rlpost.objectives.ratios import log_ratio, truncated_importance_weights
from rlpost.types import RolloutBatch, check_shapes

__all__ = [
    "ppo_clip_token_loss",
    "clip_indicators",
    "ClipIndicators",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_estimate",
    "token_entropy",
    "aggregate",
    "AGGREGATIONS",
    "PolicyLossConfig",
    "policy_loss",
]

AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_sum_const_len")
RATIO_LEVELS = ("token", "sequence", "sequence_token", "prefix")
KL_ESTIMATORS = ("k1", "k2", "k3")


def _broadcast_adv(advantages: jax.Array, like: jax.Array) -> jax.Array:
  chex.assert_rank(advantages, {1, 2})
  if advantages.ndim == 1:
    chex.assert_axis_dimension(advantages, 0, like.shape[0])
    return advantages[:, None]
  chex.assert_equal_shape([advantages, like])
  return advantages


def ppo_clip_token_loss(
    log_ratio: jax.Array,
    advantages: jax.Array,
    *,
    eps_low: float,
    eps_high: float,
    dual_clip: Optional[float] = None,
) -> jax.Array:
  """Per-token clipped surrogate loss (PPO, Schulman et al. 2017; clip-higher, DAPO;
  dual clip, Ye et al. 2020 as in verl's "vanilla" loss).

      l_t = max(-A rho_t, -A clip(rho_t, 1 - eps_low, 1 + eps_high))
      dual clip (A < 0 only): l_t <- min(l_t, -c A)

  Args:
    log_ratio: [B, T] float32 log importance ratios (any level, see ``ratios``).
    advantages: [B] float32 (broadcast along T) or [B, T]; stop-gradient is applied.
    eps_low: lower clip range (0.2; DAPO 0.2; GSPO 3e-4).
    eps_high: upper clip range (0.2; DAPO 0.28; GSPO 4e-4).
    dual_clip: c > 1 (verl uses 3.0) or None.

  Returns:
    [B, T] float32 token losses (not masked).
  """
  chex.assert_rank(log_ratio, 2)
  a = jax.lax.stop_gradient(_broadcast_adv(advantages, log_ratio))
  ratio = jnp.exp(log_ratio)
  l1 = -a * ratio
  l2 = -a * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
  loss = jnp.maximum(l1, l2)
  if dual_clip is not None:
    if dual_clip <= 1.0:
      raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    loss = jnp.where(a < 0, jnp.minimum(loss, -dual_clip * a), loss)
  return loss


class ClipIndicators(NamedTuple):
  """[B, T] bool indicators of tokens whose gradient a clip removed.

  Attributes:
    low: A < 0 and rho < 1 - eps_low.
    high: A > 0 and rho > 1 + eps_high.
    dual: A < 0 and rho > c (dual clip active).
  """

  low: jax.Array
  high: jax.Array
  dual: jax.Array


def clip_indicators(
    log_ratio: jax.Array,
    advantages: jax.Array,
    *,
    eps_low: float,
    eps_high: float,
    dual_clip: Optional[float] = None,
) -> ClipIndicators:
  """Which tokens are clipped (see :class:`ClipIndicators`); shapes as ``ppo_clip_token_loss``."""
  a = jax.lax.stop_gradient(_broadcast_adv(advantages, log_ratio))
  ratio = jax.lax.stop_gradient(jnp.exp(log_ratio))
  low = (a < 0) & (ratio < 1.0 - eps_low)
  high = (a > 0) & (ratio > 1.0 + eps_high)
  if dual_clip is None:
    dual = jnp.zeros_like(low)
  else:
    dual = (a < 0) & (ratio > dual_clip)
  return ClipIndicators(low=low, high=high, dual=dual)


# KL estimators (Schulman, "Approximating KL divergence", 2020), d = logp - ref_logp ---------------


def kl_k1(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """k1 = d = logp - ref_logp. Shapes [B, T] float32 -> [B, T]."""
  chex.assert_equal_shape([logp, ref_logp])
  return logp - jax.lax.stop_gradient(ref_logp)


def kl_k2(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """k2 = d^2 / 2 (verl "mse"). Shapes [B, T] float32 -> [B, T]."""
  return 0.5 * jnp.square(kl_k1(logp, ref_logp))


def kl_k3(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """k3 = exp(-d) + d - 1 >= 0 (GRPO's estimator; verl "low_var_kl").

  As verl: -d is clamped to [-20, 20] before exponentiation and k3 to [-10, 10].
  Gradient w.r.t. logp: 1 - exp(-d), positive when logp > ref_logp (pulls logp down).
  Shapes [B, T] float32 -> [B, T].
  """
  neg_d = jnp.clip(-kl_k1(logp, ref_logp), -20.0, 20.0)
  return jnp.clip(jnp.exp(neg_d) - neg_d - 1.0, -10.0, 10.0)


def kl_estimate(logp: jax.Array, ref_logp: jax.Array, *, estimator: str) -> jax.Array:
  """Dispatches "k1", "k2" or "k3" -> [B, T] float32 per-token KL estimates."""
  fns = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}
  if estimator not in fns:
    raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {sorted(fns)}")
  return fns[estimator](logp, ref_logp)


def token_entropy(logits: jax.Array) -> jax.Array:
  """Per-token entropy H_t = -sum_v p_v log p_v of the policy's next-token distribution.

  Args:
    logits: [B, T, V] float (the logits that predict each completion token).

  Returns:
    [B, T] float32.
  """
  chex.assert_rank(logits, 3)
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def aggregate(
    token_values: jax.Array,
    token_mask: jax.Array,
    sample_weight: jax.Array,
    *,
    mode: str,
    max_length: Optional[int] = None,
) -> LossParts:
  """Reduces per-token values to a (sum, denominator) pair; see the module docstring table.

  Args:
    token_values: [B, T] float32 per-token losses.
    token_mask: [B, T] bool valid tokens.
    sample_weight: [B] float32 per-rollout weights (0 excludes a rollout entirely).
    mode: "token_mean", "seq_mean_token_mean" or "seq_sum_const_len".
    max_length: L_max, required by "seq_sum_const_len".

  Returns:
    LossParts(sum [] float32, denominator [] float32).
  """
  chex.assert_rank([token_values, token_mask, sample_weight], [2, 2, 1])
  chex.assert_equal_shape([token_values, token_mask])
  chex.assert_axis_dimension(sample_weight, 0, token_values.shape[0])
  w = jax.lax.stop_gradient(sample_weight.astype(jnp.float32))
  m = token_mask
  row_sum = jnp.sum(jnp.where(m, token_values, 0.0), axis=-1)
  n = jnp.sum(m, axis=-1, dtype=jnp.float32)
  if mode == "token_mean":
    return LossParts(jnp.sum(w * row_sum), jnp.sum(w * n))
  if mode == "seq_mean_token_mean":
    return LossParts(jnp.sum(w * safe_divide(row_sum, n)), jnp.sum(w))
  if mode == "seq_sum_const_len":
    if max_length is None or max_length <= 0:
      raise ValueError("aggregation 'seq_sum_const_len' needs max_length = L_max > 0")
    return LossParts(jnp.sum(w * row_sum), float(max_length) * jnp.sum(w))
  raise ValueError(f"unknown aggregation {mode!r}; expected one of {AGGREGATIONS}")


@dataclasses.dataclass(frozen=True)
class PolicyLossConfig:
  """Explicit hyperparameters of :func:`policy_loss` (hashable: usable as a static argument).

  Attributes:
    ratio: importance-ratio level: "token" (PPO/GRPO/DAPO), "sequence" (GSPO),
      "sequence_token" (GSPO-token) or "prefix" (PNPO).
    eps_low, eps_high: PPO clip ranges.
    dual_clip: dual-clip constant c (> 1) or None.
    aggregation: "token_mean", "seq_mean_token_mean" or "seq_sum_const_len".
    max_length: L_max for "seq_sum_const_len".
    kl_coef: coefficient of the KL-to-reference term (0 disables it; needs ``ref_logp``).
    kl_estimator: "k1", "k2" or "k3".
    entropy_coef: coefficient of the entropy bonus (0 disables it; needs ``entropy``).
    tis_cap: truncated-importance-sampling cap C for sampler/trainer mismatch, or None
      (needs both ``current_logp`` and ``behaviour_logp``).
    tis_level: "token" or "sequence".
    max_log_ratio: clamp of log ratios; None takes 20 for token/prefix ratios and 10 for
      sequence ratios (verl's values).
  """

  ratio: str = "token"
  eps_low: float = 0.2
  eps_high: float = 0.2
  dual_clip: Optional[float] = None
  aggregation: str = "seq_mean_token_mean"
  max_length: Optional[int] = None
  kl_coef: float = 0.0
  kl_estimator: str = "k3"
  entropy_coef: float = 0.0
  tis_cap: Optional[float] = None
  tis_level: str = "token"
  max_log_ratio: Optional[float] = None

  def __post_init__(self):
    if self.ratio not in RATIO_LEVELS:
      raise ValueError(f"unknown ratio {self.ratio!r}; expected one of {RATIO_LEVELS}")
    if self.aggregation not in AGGREGATIONS:
      raise ValueError(f"unknown aggregation {self.aggregation!r}; expected one of {AGGREGATIONS}")
    if self.aggregation == "seq_sum_const_len" and not self.max_length:
      raise ValueError("aggregation 'seq_sum_const_len' needs max_length = L_max")
    if self.kl_estimator not in KL_ESTIMATORS:
      raise ValueError(
          f"unknown kl_estimator {self.kl_estimator!r}; expected one of {KL_ESTIMATORS}"
      )
    if self.eps_low < 0 or self.eps_high < 0:
      raise ValueError("clip ranges eps_low and eps_high must be >= 0")
    if self.dual_clip is not None and self.dual_clip <= 1.0:
      raise ValueError(f"dual_clip must be > 1 or None, got {self.dual_clip}")
    if self.tis_cap is not None and self.tis_cap <= 0:
      raise ValueError(f"tis_cap must be > 0 or None, got {self.tis_cap}")
    if self.tis_level not in ("token", "sequence"):
      raise ValueError(f"tis_level must be 'token' or 'sequence', got {self.tis_level!r}")

  @property
  def needs_ref_logp(self) -> bool:
    """Whether the loss reads ``batch.ref_logp``."""
    return self.kl_coef != 0.0

  @property
  def needs_entropy(self) -> bool:
    """Whether the loss needs the ``entropy`` argument."""
    return self.entropy_coef != 0.0


def policy_loss(
    logp: jax.Array,
    batch: RolloutBatch,
    advantages: jax.Array,
    sample_weight: jax.Array,
    *,
    config: PolicyLossConfig,
    entropy: Optional[jax.Array] = None,
) -> tuple[LossParts, dict]:
  """The GRPO-family policy loss, as a (sum, denominator) pair plus metrics.

      l_{i,t} = w^TIS_{i,t} ppo_clip(rho_{i,t}, A_i) + kl_coef KL_{i,t} - entropy_coef H_{i,t}
      loss    = aggregate(l, mode=config.aggregation)

  with rho at ``config.ratio`` level against ``batch.old_logp`` (``current_logp``, else
  ``behaviour_logp``), KL against ``batch.ref_logp``, TIS weights exp(current - behaviour)
  truncated at ``config.tis_cap``. Advantages, old/ref log-probs and TIS weights are
  stop-gradient; only ``logp`` (and ``entropy``) carry gradients.

  Args:
    logp: [B, T] float32, the current policy's log-probs of ``batch.tokens`` (differentiable).
    batch: RolloutBatch of B rollouts (any row subset of the logical batch).
    advantages: [B] float32 (or [B, T] token-level), e.g. ``compute_advantages(...)[0].values``.
    sample_weight: [B] float32, e.g. ``compute_advantages(...)[0].weights``; multiplied by
      ``batch.valid``.
    config: PolicyLossConfig.
    entropy: [B, T] float32 per-token entropies (``token_entropy(logits)``); required when
      ``config.entropy_coef != 0``.

  Returns:
    (LossParts(sum, denominator), metrics): metrics maps names to LossParts (combine them like
    the loss, read them with ``finalize``/``finalize_metrics``): "pg_loss" (same aggregation as
    the loss), and token means "kl", "entropy", "ratio", "clip_frac_low", "clip_frac_high",
    "dual_clip_frac", "tis_weight" where applicable.
  """
  check_shapes(batch)
  b, t = batch.batch_size, batch.seq_len
  for name, x, want in (
      ("logp", logp, [(b, t)]),
      ("advantages", advantages, [(b,), (b, t)]),
      ("sample_weight", sample_weight, [(b,)]),
      ("entropy", entropy, [(b, t)]),
  ):
    if x is not None and tuple(jnp.shape(x)) not in want:
      raise ValueError(
          f"policy_loss: {name} has shape {tuple(jnp.shape(x))}, expected "
          f"{' or '.join(map(str, want))} for a batch of B = {b} rollouts, T = {t} tokens"
      )
  tm = batch.token_mask & batch.valid[:, None]
  w = jax.lax.stop_gradient(jnp.where(batch.valid, sample_weight.astype(jnp.float32), 0.0))
  adv = jax.lax.stop_gradient(advantages.astype(jnp.float32))
  if adv.ndim == 2:
    adv = jnp.where(tm, adv, 0.0)
  else:
    adv = jnp.where(batch.valid, adv, 0.0)

  # Padding may hold anything (even NaN): zero it before any arithmetic so that neither the
  # value nor the gradient can see it.
  logp = jnp.where(tm, logp, 0.0)
  old_logp = jnp.where(tm, batch.old_logp, 0.0)

  max_lr = config.max_log_ratio
  if max_lr is None:
    max_lr = 10.0 if config.ratio in ("sequence", "sequence_token") else 20.0
  lr = log_ratio(config.ratio, logp, old_logp, tm, max_log_ratio=max_lr)
  pg = ppo_clip_token_loss(
      lr, adv, eps_low=config.eps_low, eps_high=config.eps_high, dual_clip=config.dual_clip
  )
  metrics = {}

  def token_mean(x):
    return aggregate(x.astype(jnp.float32), tm, w, mode="token_mean")

  if config.tis_cap is not None:
    batch.require("current_logp", "behaviour_logp")
    tis = truncated_importance_weights(
        batch.current_logp,
        batch.behaviour_logp,
        tm,
        cap=config.tis_cap,
        level=config.tis_level,
    )
    pg = pg * tis
    metrics["tis_weight"] = token_mean(tis)
  total = pg
  metrics["pg_loss"] = aggregate(pg, tm, w, mode=config.aggregation, max_length=config.max_length)
  if config.kl_coef != 0.0:
    batch.require("ref_logp")
    kl = kl_estimate(logp, jnp.where(tm, batch.ref_logp, 0.0), estimator=config.kl_estimator)
    total = total + config.kl_coef * kl
    metrics["kl"] = token_mean(jax.lax.stop_gradient(kl))
  if config.entropy_coef != 0.0 and entropy is None:
    raise ValueError(
        f"entropy_coef = {config.entropy_coef} needs per-token entropy [B, T]: "
        "pass entropy=token_entropy(logits)"
    )
  if entropy is not None:
    entropy = jnp.where(tm, entropy, 0.0)
    if config.entropy_coef != 0.0:
      total = total - config.entropy_coef * entropy
    metrics["entropy"] = token_mean(jax.lax.stop_gradient(entropy))

  clips = clip_indicators(
      lr, adv, eps_low=config.eps_low, eps_high=config.eps_high, dual_clip=config.dual_clip
  )
  metrics["ratio"] = token_mean(jax.lax.stop_gradient(jnp.exp(lr)))
  metrics["clip_frac_low"] = token_mean(clips.low)
  metrics["clip_frac_high"] = token_mean(clips.high)
  if config.dual_clip is not None:
    metrics["dual_clip_frac"] = token_mean(clips.dual)
  loss = aggregate(total, tm, w, mode=config.aggregation, max_length=config.max_length)
  return loss, metrics
