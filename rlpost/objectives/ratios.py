"""Importance ratios at token, sequence and prefix level, and truncated importance weights.

Shape legend: B rollouts, T tokens. ``logp`` is the differentiable log-prob of the current
policy [B, T] float32; ``old_logp`` the behaviour/``pi_old`` log-probs [B, T] float32, treated as
constants (``stop_gradient``); ``token_mask`` [B, T] bool. Every function returns log-ratios
(exponentiate with ``jnp.exp``): they are 0 (ratio 1) on padding tokens and carry no gradient
there, and they are clamped to ``[-max_log_ratio, max_log_ratio]`` before exponentiation for
numerical safety (verl clamps token log-ratios at 20 and GSPO's at 10).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

__all__ = [
    "token_log_ratio",
    "sequence_log_ratio",
    "sequence_token_log_ratio",
    "prefix_log_ratio",
    "log_ratio",
    "truncated_importance_weights",
]


def _check(logp, old_logp, token_mask):
  chex.assert_rank([logp, old_logp, token_mask], 2)
  chex.assert_equal_shape([logp, old_logp, token_mask])


def _masked_diff(logp, old_logp, token_mask):
  return jnp.where(token_mask, logp - jax.lax.stop_gradient(old_logp), 0.0)


def token_log_ratio(
    logp: jax.Array, old_logp: jax.Array, token_mask: jax.Array, *, max_log_ratio: float = 20.0
) -> jax.Array:
  """PPO's per-token log ratio: log rho_t = logp_t - old_logp_t.

  Returns:
    [B, T] float32.
  """
  _check(logp, old_logp, token_mask)
  return jnp.clip(_masked_diff(logp, old_logp, token_mask), -max_log_ratio, max_log_ratio)


def _seq_mean_log_ratio(logp, old_logp, token_mask):
  d = _masked_diff(logp, old_logp, token_mask)
  n = jnp.maximum(jnp.sum(token_mask, axis=-1, dtype=jnp.float32), 1.0)
  return jnp.sum(d, axis=-1) / n  # [B]


def sequence_log_ratio(
    logp: jax.Array, old_logp: jax.Array, token_mask: jax.Array, *, max_log_ratio: float = 10.0
) -> jax.Array:
  """GSPO's sequence ratio (Zheng et al. 2025): log s_i = (1/|y_i|) sum_t (logp_t - old_t).

  Broadcast to every token of the sequence; the gradient flows through the mean, so every
  token of sequence i receives s_i / |y_i| times its score.

  Returns:
    [B, T] float32 (constant along T on valid tokens, 0 on padding).
  """
  _check(logp, old_logp, token_mask)
  s = jnp.clip(_seq_mean_log_ratio(logp, old_logp, token_mask), -max_log_ratio, max_log_ratio)
  return jnp.where(token_mask, s[:, None], 0.0)


def sequence_token_log_ratio(
    logp: jax.Array, old_logp: jax.Array, token_mask: jax.Array, *, max_log_ratio: float = 10.0
) -> jax.Array:
  """GSPO-token: s_{i,t} = sg[s_i] * pi_t / sg[pi_t], i.e.
  log s_{i,t} = sg[log s_i] + logp_t - sg[logp_t].

  Its value equals the sequence ratio s_i at every token while the gradient is per token
  (d log s_{i,t} / d logp_t = 1), so token-level advantages can differ along a sequence.

  Returns:
    [B, T] float32.
  """
  _check(logp, old_logp, token_mask)
  s = jax.lax.stop_gradient(_seq_mean_log_ratio(logp, old_logp, token_mask))
  per_token = logp - jax.lax.stop_gradient(logp)
  out = jnp.clip(s[:, None] + per_token, -max_log_ratio, max_log_ratio)
  return jnp.where(token_mask, out, 0.0)


def prefix_log_ratio(
    logp: jax.Array, old_logp: jax.Array, token_mask: jax.Array, *, max_log_ratio: float = 20.0
) -> jax.Array:
  """PNPO's prefix-normalised ratio: the geometric mean of token ratios over the causal prefix,

      log rho_{i,t} = (1 / n_t) sum_{s <= t, s valid} (logp_s - old_s),  n_t = #valid s <= t.

  (No public code; this follows the abstract.)

  Returns:
    [B, T] float32 (0 on padding).
  """
  _check(logp, old_logp, token_mask)
  d = _masked_diff(logp, old_logp, token_mask)
  csum = jnp.cumsum(d, axis=-1)
  cnt = jnp.maximum(jnp.cumsum(token_mask.astype(jnp.float32), axis=-1), 1.0)
  out = jnp.clip(csum / cnt, -max_log_ratio, max_log_ratio)
  return jnp.where(token_mask, out, 0.0)


def log_ratio(
    level: str,
    logp: jax.Array,
    old_logp: jax.Array,
    token_mask: jax.Array,
    *,
    max_log_ratio: float,
) -> jax.Array:
  """Dispatches on ``level``: "token", "sequence", "sequence_token" or "prefix" -> [B, T]."""
  fns = {
      "token": token_log_ratio,
      "sequence": sequence_log_ratio,
      "sequence_token": sequence_token_log_ratio,
      "prefix": prefix_log_ratio,
  }
  if level not in fns:
    raise ValueError(f"unknown ratio level {level!r}; expected one of {sorted(fns)}")
  return fns[level](logp, old_logp, token_mask, max_log_ratio=max_log_ratio)


def truncated_importance_weights(
    trainer_logp: jax.Array,
    sampler_logp: jax.Array,
    token_mask: jax.Array,
    *,
    cap: float,
    level: str = "token",
) -> jax.Array:
  """Truncated importance sampling (TIS) for sampler/trainer mismatch (Yao et al. 2025; verl).

      token:    w_{i,t} = min(exp(trainer_t - sampler_t), cap)
      sequence: w_i     = min(exp(sum_t (trainer_t - sampler_t)), cap), broadcast along T
  Always stop-gradient; multiplies the policy-gradient term of each token.

  Args:
    trainer_logp: [B, T] float32, the trainer's log-probs of the batch (``current_logp``).
    sampler_logp: [B, T] float32, the sampler's log-probs (``behaviour_logp``).
    token_mask: [B, T] bool.
    cap: truncation C (e.g. 2.0).
    level: "token" or "sequence".

  Returns:
    [B, T] float32 weights (1 on padding).
  """
  _check(trainer_logp, sampler_logp, token_mask)
  d = jnp.where(token_mask, trainer_logp - sampler_logp, 0.0)
  if level == "token":
    lw = d
  elif level == "sequence":
    lw = jnp.broadcast_to(jnp.sum(d, axis=-1, keepdims=True), d.shape)
  else:
    raise ValueError(f"TIS level must be 'token' or 'sequence', got {level!r}")
  w = jnp.exp(jnp.minimum(lw, jnp.log(cap)))
  return jax.lax.stop_gradient(jnp.where(token_mask, w, 1.0))
