"""Scoring with the decoder: logits and log-probs of padded rows, without a KV cache.

``forward`` gives the logits of padded sequences; ``completion_scores`` gives what a
policy-gradient loss needs of prompt + completion rows (log-probs, optionally the entropy) at
bounded memory; ``scores_from_hidden`` is its LM-head half, shared with the packed pass of
``rlpost.models.packing``. Masks follow ``rlpost.models.attention`` (``attention.padded``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlpost.models import attention as attention_lib
from rlpost.models.transformer import Transformer


def forward(model: Transformer, tokens: jax.Array, mask: jax.Array) -> jax.Array:
  """Full (uncached) forward pass over padded sequences.

  tokens: [B, T] int32; mask: [B, T] bool (True for real tokens, any padding layout).
  Returns logits [B, T, V] float32.
  """
  logits, _ = model(tokens, attention_lib.padded(mask))
  return logits


def sequence_logprobs(model: Transformer, tokens: jax.Array, mask: jax.Array) -> jax.Array:
  """log p(tokens[:, t] | tokens[:, :t]) for t >= 1, from one full forward pass.

  tokens: [B, T] int32; mask: [B, T] bool. Returns [B, T-1] float32 (entry t-1 scores token t;
  entries whose target is padding are meaningless and should be masked by the caller).
  """
  logits = forward(model, tokens, mask)[:, :-1]
  logp = jax.nn.log_softmax(logits, axis=-1)
  return jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]


def completion_logprobs(model: Transformer, prompt_tokens: jax.Array, prompt_mask: jax.Array,
                        completion_tokens: jax.Array, completion_mask: jax.Array,
                        *, return_logits: bool = False):
  """Log-probs of completion tokens given their prompts, from one uncached forward pass.

  prompt_tokens, prompt_mask: [B, Tp] (any padding layout); completion_tokens, completion_mask:
  [B, N] as returned by the sampler. Returns logp [B, N] float32 (0 where the completion is
  masked) and, with ``return_logits``, the predicting logits [B, N, V]. Completion token 0 is
  predicted at the last valid prompt token (which is not slot Tp-1 for right-padded rows);
  token j > 0 at slot Tp + j - 1. This is what the trainer recomputes under its parameters and
  what the sampler's ``policy_logprobs`` must equal.
  """
  h = _completion_hidden(model, prompt_tokens, prompt_mask, completion_tokens, completion_mask)
  logits = model.logits(h)  # [B, N, V]
  logp = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), completion_tokens[..., None],
                             axis=-1)[..., 0]
  logp = jnp.where(completion_mask, logp, 0.0)
  return (logp, logits) if return_logits else logp


def _completion_hidden(model: Transformer, prompt_tokens, prompt_mask, completion_tokens,
                       completion_mask, *, remat: bool = False) -> jax.Array:
  """Final-norm hidden states [B, N, E] of the positions that predict each completion token."""
  tp, n = prompt_tokens.shape[1], completion_tokens.shape[1]
  tokens = jnp.concatenate([prompt_tokens, completion_tokens], axis=1)
  mask = jnp.concatenate([prompt_mask.astype(bool), completion_mask.astype(bool)], axis=1)
  last = tp - 1 - jnp.argmax(prompt_mask[:, ::-1].astype(bool), axis=-1)  # [B]
  follow = jnp.broadcast_to(tp + jnp.arange(n - 1), (tokens.shape[0], n - 1))
  slots = jnp.concatenate([last[:, None], follow], axis=1)  # [B, N]
  h, _ = model.hidden(tokens, attention_lib.padded(mask), select=slots, remat=remat)
  return h


def _score_chunk(model: Transformer, h: jax.Array, tokens: jax.Array,
                 entropy: bool) -> tuple[jax.Array, jax.Array | None]:
  """log p(tokens) [B, C] and optionally the entropy [B, C] from hidden states h [B, C, E]."""
  logits = model.logits(h)
  logp_all = jax.nn.log_softmax(logits, axis=-1)
  logp = jnp.take_along_axis(logp_all, tokens[..., None], axis=-1)[..., 0]
  ent = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1) if entropy else None
  return logp, ent


def completion_scores(model: Transformer, prompt_tokens: jax.Array, prompt_mask: jax.Array,
                      completion_tokens: jax.Array, completion_mask: jax.Array, *,
                      entropy: bool = False, logits_chunk: int = 0,
                      remat: bool = False) -> tuple[jax.Array, jax.Array | None]:
  """What a policy-gradient loss needs, at bounded memory: (logp [B, N], entropy [B, N] or None).

  The values of ``completion_logprobs`` (0 where the completion is masked) and, with
  ``entropy``, the per-token entropy of the predicting distribution (as
  ``objectives.token_entropy`` of its logits), both float32.

  ``logits_chunk`` > 0: the LM head, log-softmax and entropy run over chunks of that many
  completion positions, each recomputed in the backward pass, so no [B, N, V] tensor is ever
  held (with a 150k vocabulary that is 0.6 MB per token in float32). ``remat``: per-layer
  rematerialisation of the decoder (``Transformer.hidden``). Both change memory, not values.
  """
  h = _completion_hidden(model, prompt_tokens, prompt_mask, completion_tokens, completion_mask,
                         remat=remat)  # [B, N, E]
  return scores_from_hidden(model, h, completion_tokens, completion_mask, entropy=entropy,
                            logits_chunk=logits_chunk)


def scores_from_hidden(model: Transformer, h: jax.Array, completion_tokens: jax.Array,
                       completion_mask: jax.Array, *, entropy: bool = False,
                       logits_chunk: int = 0) -> tuple[jax.Array, jax.Array | None]:
  """``completion_scores`` from the hidden states h [B, N, E] that predict each completion
  token: the LM head (over chunks of ``logits_chunk`` positions when > 0), log-probs and
  optionally the entropy."""
  b, n = completion_tokens.shape
  if logits_chunk <= 0 or logits_chunk >= n:
    logp, ent = _score_chunk(model, h, completion_tokens, entropy)
  else:
    c = logits_chunk
    k = -(-n // c)
    pad = k * c - n
    hc = jnp.pad(h, ((0, 0), (0, pad), (0, 0))).reshape(b, k, c, -1).transpose(1, 0, 2, 3)
    tc = jnp.pad(completion_tokens, ((0, 0), (0, pad))).reshape(b, k, c).transpose(1, 0, 2)
    score = jax.checkpoint(lambda x: _score_chunk(model, x[0], x[1], entropy))
    logp, ent = jax.lax.map(score, (hc, tc))  # [K, B, C]
    logp = logp.transpose(1, 0, 2).reshape(b, k * c)[:, :n]
    if entropy:
      ent = ent.transpose(1, 0, 2).reshape(b, k * c)[:, :n]
  logp = jnp.where(completion_mask, logp, 0.0)
  return logp, ent
