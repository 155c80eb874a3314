"""Policy-loss pieces: PPO clipping, KL estimators, entropy, aggregation, loss terms and
``policy_loss``.

Shape legend: B rollouts, T tokens, V vocabulary. ``logp`` [B, T] float32 are the current
policy's differentiable log-probs of the batch's tokens; advantages [B] (or [B, T] token-level)
float32 and sample weights [B] float32 are constants (``stop_gradient``). Losses are to be
minimised.

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

Loss terms
----------
``policy_loss`` is a sum of per-token terms, aggregated once:

    x     = loss_inputs(logp, batch, advantages, sample_weight, entropy=entropy)  # masked inputs
    terms = policy_terms(x, batch, config=config)   # pg (x TIS weights), KL, entropy
    loss, metrics = sum_terms(terms, x, aggregation=..., max_length=...)

A :class:`Term` is ``(values [B, T] float32, metrics {name: [B, T]}, report)``: ``values`` are
added to the per-token loss, each metric is reported as its token mean, and ``report`` (if set)
names a metric holding the term's own aggregated loss (``"pg_loss"``). The standard terms are
:func:`policy_gradient_term`, :func:`truncated_importance_term` (multiplies the policy-gradient
term), :func:`kl_term` and :func:`entropy_term`. A fork adds a term by writing it as a function
and a loss function that appends it to the standard ones::

    def length_term(token_mask, *, coef):
      '''coef per valid token (a length cost): [B, T] bool -> Term(values [B, T] float32).'''
      cost = coef * token_mask.astype(jnp.float32)
      return Term(values=cost, metrics={"length_cost": cost})

    def my_loss(logp, batch, advantages, sample_weight, *, config, entropy=None, coef=1e-3):
      x = loss_inputs(logp, batch, advantages, sample_weight, entropy=entropy)
      terms = policy_terms(x, batch, config=config) + (length_term(x.token_mask, coef=coef),)
      return sum_terms(terms, x, aggregation=config.aggregation, max_length=config.max_length)

    recipe = make_recipe("grpo_len", advantage_chain, PolicyLossConfig(), loss=my_loss)

``recipe.loss_fn`` is then ``my_loss`` with ``config`` bound, and ``get_recipe`` overrides of
``PolicyLossConfig`` fields keep ``my_loss``. Term hyperparameters that are not
``PolicyLossConfig`` fields are keyword arguments of the loss function (bind them with
``functools.partial`` before ``make_recipe``).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional, Sequence

import chex
import jax
import jax.numpy as jnp
from flax import struct

from rlpost.objectives.parts import LossParts, safe_divide
from rlpost.objectives.ratios import log_ratio, truncated_importance_weights
from rlpost.types import RolloutBatch, check_shapes

__all__ = [
    "ppo_clip_token_loss",
    "clip_indicators",
    "ClipIndicators",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "geo_mean_policy_term",
    "kl_abs",
    "kl_k1_plus",
    "kl_k3_plus",
    "kl_estimate",
    "token_entropy",
    "aggregate",
    "AGGREGATIONS",
    "PolicyLossConfig",
    "LossInputs",
    "loss_inputs",
    "Term",
    "policy_gradient_term",
    "truncated_importance_term",
    "kl_term",
    "entropy_term",
    "policy_terms",
    "token_means",
    "sum_terms",
    "policy_loss",
]

AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_sum_const_len")
RATIO_LEVELS = ("token", "sequence", "sequence_token", "prefix", "geo_mean")
KL_ESTIMATORS = ("k1", "k2", "k3", "abs", "k1+", "k2+", "k3+")


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


def kl_abs(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """|d| = |logp - ref_logp| (verl "abs"), with gradient sign(d): 0 at d = 0, as torch's
  ``abs`` (``jnp.abs`` would give 1). Shapes [B, T] float32 -> [B, T]."""
  d = kl_k1(logp, ref_logp)
  return d * jax.lax.stop_gradient(jnp.sign(d))


def _k2_gradient(value_fn):
  """The estimator with ``value_fn``'s value and k2's gradient (verl's "+" forms, 0.9.1):
  ``k2 - sg[k2] + sg[value]``. k1 and k3 are unbiased for the KL's value but their expected
  gradient is not the KL's; k2's gradient d is."""

  def fn(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    k2 = kl_k2(logp, ref_logp)
    return k2 - jax.lax.stop_gradient(k2) + jax.lax.stop_gradient(value_fn(logp, ref_logp))

  fn.__name__ = f"{value_fn.__name__}_plus"
  fn.__doc__ = (f"``{value_fn.__name__}``'s value with k2's gradient d = logp - ref_logp "
                "(verl's straight-through '+' form). Shapes [B, T] float32 -> [B, T].")
  return fn


kl_k1_plus = _k2_gradient(kl_k1)
kl_k3_plus = _k2_gradient(kl_k3)

# verl 0.9.1 ``kl_penalty`` names; "k2+" is k2 itself (as in verl, the "+" changes nothing).
_KL_FNS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3, "abs": kl_abs, "k1+": kl_k1_plus,
           "k2+": kl_k2, "k3+": kl_k3_plus}


def kl_estimate(logp: jax.Array, ref_logp: jax.Array, *, estimator: str) -> jax.Array:
  """Dispatches an estimator name of ``KL_ESTIMATORS`` -> [B, T] float32 per-token KL
  estimates."""
  if estimator not in _KL_FNS:
    raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {sorted(_KL_FNS)}")
  return _KL_FNS[estimator](logp, ref_logp)


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
      "sequence_token" (GSPO-token), "prefix" (PNPO) or "geo_mean" (GMPO: the geometric mean
      of token ratios clipped in log space, :func:`geo_mean_policy_term`; it needs
      aggregation "seq_mean_token_mean" and no dual clip).
    eps_low, eps_high: PPO clip ranges.
    dual_clip: dual-clip constant c (> 1) or None.
    aggregation: "token_mean", "seq_mean_token_mean" or "seq_sum_const_len".
    max_length: L_max for "seq_sum_const_len".
    kl_coef: coefficient of the KL-to-reference term (0 disables it; needs ``ref_logp``).
    kl_estimator: one of ``KL_ESTIMATORS``: "k1", "k2", "k3", "abs", or a "+" form ("k1+",
      "k3+": the value of k1 / k3 with k2's gradient, verl 0.9.1; "k2+" is k2).
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
    if self.ratio == "geo_mean" and (self.aggregation != "seq_mean_token_mean"
                                     or self.dual_clip is not None):
      raise ValueError("ratio 'geo_mean' (GMPO) is a per-sequence loss: it needs aggregation "
                       f"'seq_mean_token_mean' and no dual clip (got {self.aggregation!r}, "
                       f"dual_clip {self.dual_clip})")
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


# Loss terms --------------------------------------------------------------------------------------


class LossInputs(NamedTuple):
  """The inputs of the loss terms, masked once (see :func:`loss_inputs`).

  Padding may hold anything (even NaN) in the batch; here it is 0, so neither a value nor a
  gradient can see it.

  Attributes:
    logp: [B, T] float32 current log-probs (differentiable), 0 off ``token_mask``.
    old_logp: [B, T] float32 log-probs of PPO's pi_old (``batch.old_logp``), 0 off the mask.
    advantages: [B] or [B, T] float32, stop-gradient; 0 on invalid rows (and, when [B, T], on
      masked tokens).
    sample_weight: [B] float32, stop-gradient; 0 on invalid rows.
    token_mask: [B, T] bool, ``batch.token_mask & batch.valid[:, None]``.
    entropy: [B, T] float32 per-token entropies (differentiable), 0 off the mask, or None.
  """

  logp: jax.Array
  old_logp: jax.Array
  advantages: jax.Array
  sample_weight: jax.Array
  token_mask: jax.Array
  entropy: Optional[jax.Array] = None


def loss_inputs(
    logp: jax.Array,
    batch: RolloutBatch,
    advantages: jax.Array,
    sample_weight: jax.Array,
    *,
    entropy: Optional[jax.Array] = None,
) -> LossInputs:
  """Checks the shapes of a loss's arguments and masks them (see :class:`LossInputs`).

  Args:
    logp: [B, T] float32, the current policy's log-probs of ``batch.tokens``.
    batch: RolloutBatch of B rollouts, T tokens.
    advantages: [B] or [B, T] float32.
    sample_weight: [B] float32.
    entropy: [B, T] float32 or None.

  Returns:
    LossInputs. Raises ValueError naming an argument of the wrong shape.
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
  return LossInputs(
      logp=jnp.where(tm, logp, 0.0),
      old_logp=jnp.where(tm, batch.old_logp, 0.0),
      advantages=adv,
      sample_weight=w,
      token_mask=tm,
      entropy=None if entropy is None else jnp.where(tm, entropy, 0.0),
  )


@struct.dataclass
class Term:
  """One per-token term of a loss (a pytree; ``report`` is static).

  Attributes:
    values: [B, T] float32, added to the per-token loss l_{b,t} (0 off the mask or masked later
      by the aggregation).
    metrics: dict name -> [B, T] array (float or bool, carrying no gradient), each reported as
      its token mean over valid tokens (a LossParts pair).
    report: None, or a metric name under which ``sum_terms`` reports this term's own
      aggregated loss (same aggregation as the loss), e.g. "pg_loss".
  """

  values: jax.Array
  metrics: dict
  report: Optional[str] = struct.field(pytree_node=False, default=None)


def policy_gradient_term(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    token_mask: jax.Array,
    *,
    ratio: str = "token",
    eps_low: float,
    eps_high: float,
    dual_clip: Optional[float] = None,
    max_log_ratio: Optional[float] = None,
) -> Term:
  """The clipped policy-gradient term (PPO; clip-higher, DAPO; dual clip, Ye et al. 2020).

      l_t = ppo_clip(rho_t, A)   with   log rho_t = log_ratio(ratio, logp, old_logp)

  Args:
    logp: [B, T] float32 current log-probs (differentiable).
    old_logp: [B, T] float32 pi_old log-probs (stop-gradient).
    advantages: [B] or [B, T] float32 (stop-gradient).
    token_mask: [B, T] bool valid tokens (padding is zeroed before any arithmetic).
    ratio: "token", "sequence" (GSPO), "sequence_token" (GSPO-token) or "prefix" (PNPO).
    eps_low, eps_high, dual_clip: see :func:`ppo_clip_token_loss`.
    max_log_ratio: clamp of log ratios; None takes 10 for sequence ratios, 20 otherwise.

  Returns:
    Term(values [B, T] token losses, metrics "ratio", "clip_frac_low", "clip_frac_high" and,
    with a dual clip, "dual_clip_frac", report "pg_loss").
  """
  logp = jnp.where(token_mask, logp, 0.0)
  old_logp = jnp.where(token_mask, old_logp, 0.0)
  if max_log_ratio is None:
    max_log_ratio = 10.0 if ratio in ("sequence", "sequence_token") else 20.0
  lr = log_ratio(ratio, logp, old_logp, token_mask, max_log_ratio=max_log_ratio)
  pg = ppo_clip_token_loss(
      lr, advantages, eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip
  )
  clips = clip_indicators(
      lr, advantages, eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip
  )
  metrics = {
      "ratio": jax.lax.stop_gradient(jnp.exp(lr)),
      "clip_frac_low": clips.low,
      "clip_frac_high": clips.high,
  }
  if dual_clip is not None:
    metrics["dual_clip_frac"] = clips.dual
  return Term(values=pg, metrics=metrics, report="pg_loss")


def geo_mean_policy_term(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    token_mask: jax.Array,
    *,
    eps_low: float,
    eps_high: float,
    max_log_ratio: Optional[float] = None,
) -> Term:
  """GMPO's policy term (Zhao et al. 2025, "Geometric-Mean Policy Optimization"; verl 0.9.1
  ``compute_policy_loss_geo_mean``): the geometric mean of token ratios, each clipped in log
  space on the side its advantage's sign makes pessimistic.

      d_t = logp_t - old_t,   c_t = clip(d_t, -eps_low, eps_high),   s_t = sign(A_t)
      m_t = s_t * min(s_t d_t, s_t c_t)
      L_b = -mean_t(A_t) * exp(mean_t m_t)          (means over the row's valid tokens)

  The row loss L_b is written on each of its valid tokens, so aggregation
  "seq_mean_token_mean" gives verl's mean over rows. Deviation: d_t is first clamped to
  +-``max_log_ratio`` (None: 20, as the token ratios here), against overflow; verl does not.

  Args:
    logp: [B, T] float32 current log-probs (differentiable).
    old_logp: [B, T] float32 pi_old log-probs (stop-gradient).
    advantages: [B] or [B, T] float32 (stop-gradient).
    token_mask: [B, T] bool valid tokens.
    eps_low, eps_high: the log-space clip range (GMPO: 0.4 and 0.4).
    max_log_ratio: clamp of d_t.

  Returns:
    Term(values [B, T], metrics "ratio" (the row's geometric-mean ratio on its tokens),
    "clip_frac_low" (clipped tokens with A < 0), "clip_frac_high" (with A > 0); report
    "pg_loss").
  """
  m = token_mask
  a = jnp.where(m, _broadcast_adv(advantages, logp), 0.0)
  limit = 20.0 if max_log_ratio is None else max_log_ratio
  d = jnp.clip(jnp.where(m, logp - jax.lax.stop_gradient(old_logp), 0.0), -limit, limit)
  c = jnp.clip(d, -eps_low, eps_high)
  sgn = jnp.sign(a)
  d_min = sgn * jnp.minimum(sgn * d, sgn * c)
  n = jnp.sum(m, axis=-1, dtype=jnp.float32)
  seq_log_ratio = safe_divide(jnp.sum(jnp.where(m, d_min, 0.0), axis=-1), n)
  seq_adv = safe_divide(jnp.sum(a, axis=-1), n)
  row_loss = -seq_adv * jnp.exp(seq_log_ratio)
  clipped = jax.lax.stop_gradient(m & (d != c))
  ratio = jax.lax.stop_gradient(jnp.exp(seq_log_ratio))
  return Term(
      values=jnp.where(m, row_loss[:, None], 0.0),
      metrics={"ratio": jnp.broadcast_to(ratio[:, None], m.shape),
               "clip_frac_low": clipped & (a < 0), "clip_frac_high": clipped & (a > 0)},
      report="pg_loss",
  )


def truncated_importance_term(
    term: Term,
    current_logp: jax.Array,
    behaviour_logp: jax.Array,
    token_mask: jax.Array,
    *,
    cap: float,
    level: str = "token",
) -> Term:
  """Multiplies ``term`` by truncated importance weights (TIS, sampler/trainer mismatch).

      l_t <- w_t l_t,   w = truncated_importance_weights(current, behaviour, cap, level)

  Args:
    term: the Term to weight (the policy-gradient term).
    current_logp: [B, T] float32 trainer log-probs (``batch.current_logp``).
    behaviour_logp: [B, T] float32 sampler log-probs (``batch.behaviour_logp``).
    token_mask: [B, T] bool.
    cap: truncation C > 0.
    level: "token" or "sequence".

  Returns:
    ``term`` with values [B, T] multiplied by w (stop-gradient) and the metric "tis_weight".
  """
  tis = truncated_importance_weights(current_logp, behaviour_logp, token_mask, cap=cap, level=level)
  return term.replace(values=term.values * tis, metrics={**term.metrics, "tis_weight": tis})


def kl_term(
    logp: jax.Array, ref_logp: jax.Array, token_mask: jax.Array, *, coef: float, estimator: str
) -> Term:
  """KL-to-reference penalty: l_t = coef * KL_t with KL_t = kl_estimate(logp, ref_logp).

  Args:
    logp: [B, T] float32 current log-probs (differentiable), 0 off the mask.
    ref_logp: [B, T] float32 reference log-probs (stop-gradient; padding zeroed here).
    token_mask: [B, T] bool.
    coef: the KL coefficient (GRPO 0.04).
    estimator: "k1", "k2" or "k3".

  Returns:
    Term(values [B, T] = coef * KL, metrics "kl": the unscaled KL estimate).
  """
  kl = kl_estimate(logp, jnp.where(token_mask, ref_logp, 0.0), estimator=estimator)
  return Term(values=coef * kl, metrics={"kl": jax.lax.stop_gradient(kl)})


def entropy_term(entropy: jax.Array, token_mask: jax.Array, *, coef: float) -> Term:
  """Entropy bonus: l_t = -coef * H_t (coef 0 reports the entropy and adds nothing).

  Args:
    entropy: [B, T] float32 per-token entropies (differentiable; ``token_entropy(logits)``).
    token_mask: [B, T] bool (padding is zeroed).
    coef: the entropy coefficient (DARS 0.001).

  Returns:
    Term(values [B, T] = -coef * H (zeros when coef is 0), metrics "entropy": H).
  """
  h = jnp.where(token_mask, entropy, 0.0)
  values = jnp.zeros_like(h) if coef == 0.0 else -(coef * h)
  return Term(values=values, metrics={"entropy": jax.lax.stop_gradient(h)})


def policy_terms(x: LossInputs, batch: RolloutBatch, *, config: PolicyLossConfig) -> tuple:
  """The terms of :func:`policy_loss`, in order: policy gradient (times TIS weights when
  ``config.tis_cap`` is set), KL (when ``config.kl_coef != 0``), entropy (when ``x.entropy`` is
  given; it adds to the loss only when ``config.entropy_coef != 0``).

  Args:
    x: LossInputs from :func:`loss_inputs`.
    batch: the RolloutBatch (``ref_logp``, ``current_logp``, ``behaviour_logp`` where needed).
    config: PolicyLossConfig.

  Returns:
    A tuple of Terms.
  """
  clip = dict(eps_low=config.eps_low, eps_high=config.eps_high,
              max_log_ratio=config.max_log_ratio)
  if config.ratio == "geo_mean":
    pg = geo_mean_policy_term(x.logp, x.old_logp, x.advantages, x.token_mask, **clip)
  else:
    pg = policy_gradient_term(x.logp, x.old_logp, x.advantages, x.token_mask,
                              ratio=config.ratio, dual_clip=config.dual_clip, **clip)
  if config.tis_cap is not None:
    batch.require("current_logp", "behaviour_logp")
    pg = truncated_importance_term(
        pg,
        batch.current_logp,
        batch.behaviour_logp,
        x.token_mask,
        cap=config.tis_cap,
        level=config.tis_level,
    )
  terms = [pg]
  if config.kl_coef != 0.0:
    batch.require("ref_logp")
    terms.append(
        kl_term(
            x.logp, batch.ref_logp, x.token_mask, coef=config.kl_coef, estimator=config.kl_estimator
        )
    )
  if config.entropy_coef != 0.0 and x.entropy is None:
    raise ValueError(
        f"entropy_coef = {config.entropy_coef} needs per-token entropy [B, T]: "
        "pass entropy=token_entropy(logits)"
    )
  if x.entropy is not None:
    terms.append(entropy_term(x.entropy, x.token_mask, coef=config.entropy_coef))
  return tuple(terms)


def token_means(metrics: dict, token_mask: jax.Array, sample_weight: jax.Array) -> dict:
  """Each [B, T] metric as its weighted token mean, a LossParts pair ("token_mean").

  Args:
    metrics: dict name -> [B, T] float or bool array.
    token_mask: [B, T] bool.
    sample_weight: [B] float32.

  Returns:
    dict name -> LossParts(sum [], denominator []).
  """
  return {
      k: aggregate(v.astype(jnp.float32), token_mask, sample_weight, mode="token_mean")
      for k, v in metrics.items()
  }


def sum_terms(
    terms: Sequence[Term],
    x: LossInputs,
    *,
    aggregation: str,
    max_length: Optional[int] = None,
) -> tuple[LossParts, dict]:
  """Sums the terms per token and aggregates once.

      l_{b,t} = sum_k terms[k].values_{b,t},   loss = aggregate(l, mode=aggregation)

  Args:
    terms: Terms with [B, T] values.
    x: LossInputs (token mask and sample weights).
    aggregation: "token_mean", "seq_mean_token_mean" or "seq_sum_const_len".
    max_length: L_max for "seq_sum_const_len".

  Returns:
    (LossParts(sum, denominator), metrics): every term's metrics as token means, and each
    term's ``report`` name mapped to its own aggregated loss; all values are LossParts.
  """
  terms = list(terms)
  if not terms:
    raise ValueError("sum_terms needs at least one Term")
  tm, w = x.token_mask, x.sample_weight
  metrics = {}
  total = None
  for term in terms:
    chex.assert_equal_shape([term.values, tm])
    total = term.values if total is None else total + term.values
    if term.report is not None:
      metrics[term.report] = aggregate(
          term.values, tm, w, mode=aggregation, max_length=max_length
      )
    metrics.update(token_means(term.metrics, tm, w))
  loss = aggregate(total, tm, w, mode=aggregation, max_length=max_length)
  return loss, metrics


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
  stop-gradient; only ``logp`` (and ``entropy``) carry gradients. Composed as
  ``sum_terms(policy_terms(loss_inputs(...), batch, config=config), ...)`` (module docstring).

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
  x = loss_inputs(logp, batch, advantages, sample_weight, entropy=entropy)
  terms = policy_terms(x, batch, config=config)
  return sum_terms(terms, x, aggregation=config.aggregation, max_length=config.max_length)
