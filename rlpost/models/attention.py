"""Attention: the one mask convention and the one grouped-query kernel of every path.

Every pass of ``rlpost.models.transformer`` (training and scoring, packed rows, the sampler's
prefill and cached decode) describes its queries and keys by ``Tokens``: positions, validity and
optional segment ids, one entry per token. ``visible`` turns a pair of them into the mask; no
caller builds a mask of its own. ``attend`` is the uncached pass, selectable by name (plain,
blockwise or cuDNN); ``grouped`` is the plain kernel, which ``attend`` and the cached decode
step (keys and values in the cache's layout) share.

Shapes (the legend of ``rlpost.models.transformer``):
  q [B, T, H, D]; k, v [B, S, K, D] with H % K == 0 (query head h reads key/value head
  h // (H / K)); the queries' Tokens q_pos, q_valid, q_seg [B, T] and the keys' k_pos, k_valid,
  k_seg [B, S] (``q_tok.pos`` ...); out [B, T, H, D] in q's dtype.

Visibility: key s is visible to query t iff
  k_valid[b, s] and q_valid[b, t]
  and k_pos[b, s] <= q_pos[b, t]                     (causal by position)
  and q_pos[b, t] - k_pos[b, s] < window             (only with ``window``)
  and q_seg[b, t] == k_seg[b, s]                     (only with segment ids: packed rows)
Positions restart per segment in a packed row; the segment test keeps rows apart. Causality by
position, not by slot, is what lets a padded row (left or right) see exactly what its unpadded
version sees, and the sampler's cache slots carry the positions of the tokens written there.

Padded rows: a query with no visible key (a padding token, or a query whose keys are all
padding) gets an output of exactly **zero** and zero gradients, in every implementation and
pass: finite, never NaN. (A softmax over a fully masked row would be uniform over all S keys;
the blockwise pass has no meaningful "all keys" once S is padded to whole blocks.) In the
model's self-attention every valid query sees at least itself, so exactly the padding tokens
get zero.

Implementations (``impl``):
  "xla"        ``grouped``: materialises the [B, H, T, S] float32 scores. Scores einsum
               accumulated in float32, masked with a large finite negative value, float32
               softmax, probabilities cast to the input dtype before the p.v einsum; rows
               without a visible key zeroed at the [B, T, H, D] output. Memory O(B H T S).
  "blockwise"  online-softmax (flash-attention) forward over [block_q, block_k] tiles with
               ``jax.lax`` loops, and a ``jax.custom_vjp`` backward (FlashAttention-2, Dao 2023,
               arXiv:2307.08691, Alg. 2) that recomputes each tile's scores from q, k, v and the
               saved per-row logsumexp. Neither pass holds more than one score tile
               [B, H, block_q, block_k] (float32) at a time; the residuals are q, k, v, the
               output and the logsumexp: O(B T H D). Tiles without a visible key are skipped
               (``lax.cond``), so a causal pass does about half the tile work. Scores, running
               max, denominators and accumulators are float32 for any input dtype; the
               probabilities and dS tiles are cast to the input dtype for their matmuls (like
               the plain kernel's p.v einsum).
  "cudnn"      ``jax.nn.dot_product_attention(implementation="cudnn")``, GPUs only (a
               ValueError elsewhere). cuDNN's fused kernel takes the mask as an additive bias,
               so this path materialises a [B, 1, T, S] bias in q's dtype (2 bytes per pair for
               bfloat16, against 4 H bytes per pair for the plain kernel's float32 scores).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

IMPLS = ("xla", "blockwise", "cudnn")

# Default tile of the blockwise pass. One float32 score tile is B * H * 512 * 512 * 4 bytes
# (28 MiB at B=1 and Qwen2.5-7B's 28 heads); larger tiles mean fewer loop iterations. Sequences
# shorter than a block use one block of their own length.
BLOCK_Q = 512
BLOCK_K = 512

# Large negative logit for masked slots, in every implementation. Finite, so that the running
# max of a tile with no visible key stays finite and exp() never sees inf - inf.
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


class Tokens(NamedTuple):
  """What the mask needs of one token axis: pos [B, N] int32, valid [B, N] bool and, for
  packed rows, seg [B, N] int32 (None: one segment per row). ``attend`` also takes a valid of
  None (every token valid)."""
  pos: jax.Array
  valid: jax.Array | None = None
  seg: jax.Array | None = None


def positions_from_mask(mask: jax.Array) -> jax.Array:
  """Positions of valid tokens counted from 0 within each row; padding gets the last position.

  mask: [B, T] bool -> [B, T] int32. Padded rows therefore see the same positions as their
  unpadded versions, whether they are left- or right-padded.
  """
  return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)


def padded(mask: jax.Array) -> Tokens:
  """The ``Tokens`` of padded rows, mask [B, T] bool (True for real tokens, any layout)."""
  mask = mask.astype(bool)
  return Tokens(positions_from_mask(mask), mask)


def packed(positions: jax.Array, segments: jax.Array) -> Tokens:
  """The ``Tokens`` of packed rows: positions [B, T] restarting at 0 in every segment, segment
  ids [B, T] int32 with 0 on padding."""
  return Tokens(positions, segments > 0, segments)


def visible(q: Tokens, k: Tokens, window=None) -> jax.Array:
  """The visibility mask [B, Tq, Sk] bool of the module docstring, for one tile or all of it.

  Segments both or neither (a valid of None: every token valid); ``window`` None, an int or an
  int32 scalar (traced, per layer).
  """
  q, k = (x._replace(valid=jnp.ones(x.pos.shape, bool)) if x.valid is None else x for x in (q, k))
  mask = (k.pos[:, None, :] <= q.pos[:, :, None]) & q.valid[:, :, None] & k.valid[:, None, :]
  if window is not None:
    mask &= q.pos[:, :, None] - k.pos[:, None, :] < window
  if q.seg is not None:
    mask &= q.seg[:, :, None] == k.seg[:, None, :]
  return mask


def attend(q: jax.Array, k: jax.Array, v: jax.Array, q_tok: Tokens, k_tok: Tokens | None = None,
           *, scale: float, window: int | None = None, impl: str = "xla", block_q: int = BLOCK_Q,
           block_k: int = BLOCK_K) -> jax.Array:
  """softmax(scale * q k^T, masked) v per query head; see the module docstring.

  Args:
    q: [B, T, H, D] queries (after RoPE). k, v: [B, S, K, D], H % K == 0.
    q_tok, k_tok: the ``Tokens`` of the queries ([B, T]) and keys ([B, S]); ``k_tok`` None:
      the queries' own (self-attention, S == T). A ``valid`` of None: every token valid.
      Segment ids on both or neither.
    scale: the logit scale (usually D ** -0.5).
    window: a query sees keys less than ``window`` positions back; None: unbounded.
    impl: one of ``IMPLS``.
    block_q, block_k: tile sizes of ``impl="blockwise"`` (clipped to T and S; T and S need not
      be multiples: the last block is padded with invalid tokens).
  Returns:
    [B, T, H, D] in q's dtype; zero on rows without a visible key.
  """
  k_tok = q_tok if k_tok is None else k_tok
  chex.assert_rank([q, k, v, q_tok.pos, k_tok.pos], [4, 4, 4, 2, 2])
  chex.assert_equal_shape([k, v])
  b, t, h, d = q.shape
  s, kh = k.shape[1], k.shape[2]
  chex.assert_shape(k, (b, s, kh, d))
  if h % kh:
    raise ValueError(f"attend: query heads H={h} must be a multiple of key/value heads K={kh}")
  if impl not in IMPLS:
    raise ValueError(f"attend: impl must be one of {IMPLS}, got {impl!r}")
  if (q_tok.seg is None) != (k_tok.seg is None):
    raise ValueError("attend: give segment ids for both queries and keys, or neither")
  if window is not None and not isinstance(window, jax.Array) and (
      not isinstance(window, int) or window < 1):
    raise ValueError(f"attend: window must be None, a positive int or an int32 scalar array "
                     f"(e.g. traced, per layer), got {window!r}")
  qt, kt = (x._replace(valid=jnp.ones(x.pos.shape, bool)) if x.valid is None else x
            for x in (q_tok, k_tok))
  chex.assert_shape([qt.pos, qt.valid] + ([] if qt.seg is None else [qt.seg]), (b, t))
  chex.assert_shape([kt.pos, kt.valid] + ([] if kt.seg is None else [kt.seg]), (b, s))
  if impl == "blockwise":
    for name, size in (("block_q", block_q), ("block_k", block_k)):
      if not isinstance(size, int) or size < 1:
        raise ValueError(f"attend: {name} must be a positive int, got {size!r}")
    return _blockwise(q, k, v, qt, kt, float(scale), window, min(block_q, t), min(block_k, s))
  mask = visible(qt, kt, window)  # [B, T, S]
  if impl == "xla":
    return grouped(q, k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3), mask, scale)
  out = _cudnn(q, k, v, mask, scale)
  return jnp.where(mask.any(-1)[:, :, None, None], out, 0).astype(q.dtype)


def grouped(q: jax.Array, kt: jax.Array, vt: jax.Array, mask: jax.Array,
            scale: float) -> jax.Array:
  """The plain grouped-query kernel, on keys and values in the KV cache's layout.

  q [B, T, H, D]; kt [B, K, D, S] (slots minor); vt [B, K, S, D]; mask [B, T, S] bool from
  ``visible``. Returns [B, T, H, D] in q's dtype, zero on rows without a visible key. Queries
  are grouped by the key/value head they share, [B, K, G*T, D] (G = H / K), so each head's
  keys are read once per group; scores and softmax in float32.
  """
  b, t, h, d = q.shape
  kh = kt.shape[1]
  g = h // kh
  qg = q.reshape(b, t, kh, g, d).transpose(0, 2, 3, 1, 4).reshape(b, kh, g * t, d)
  scores = jnp.einsum("bkqd,bkds->bkqs", qg, kt.astype(q.dtype),
                      preferred_element_type=jnp.float32) * scale
  scores = scores.reshape(b, kh, g, t, -1)
  scores = jnp.where(mask[:, None, None, :, :], scores, MASK_VALUE)
  probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype).reshape(b, kh, g * t, -1)
  out = jnp.einsum("bkqs,bksd->bkqd", probs, vt.astype(q.dtype))  # [B, K, G*T, D]
  out = out.reshape(b, kh, g, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)
  # Masked probabilities are exactly 0 (exp of MASK_VALUE below the row's max) unless the
  # whole row is masked: then the softmax is uniform, and this select, on the [B, T, H, D]
  # output rather than the [B, H, T, S] probabilities, makes the row's output and gradients 0.
  return jnp.where(mask.any(-1)[:, :, None, None], out, 0)


def _cudnn(q, k, v, mask, scale):
  backend = jax.default_backend()
  if backend != "gpu":
    raise ValueError(f"attend: impl='cudnn' runs jax.nn.dot_product_attention(implementation="
                     f"'cudnn') and needs a GPU; the default backend is {backend!r}. Use "
                     f"impl='blockwise' (memory-bounded) or impl='xla'.")
  return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], scale=scale,
                                      implementation="cudnn")


# ----------------------------------------------------------------------------------------------
# Blockwise (flash) attention. Block layout: q [nq, B, K, G, bq, D], k and v [nk, B, K, bk, D],
# token metadata [n, B, block]; the leading block axis is what the lax loops index.


def _to_blocks(x: jax.Array, block: int) -> jax.Array:
  """[B, N, ...] -> [ceil(N / block), B, block, ...], the tail padded with zeros (False)."""
  n = x.shape[1]
  nb = -(-n // block)
  x = jnp.pad(x, [(0, 0), (0, nb * block - n)] + [(0, 0)] * (x.ndim - 2))
  return jnp.moveaxis(x.reshape(x.shape[0], nb, block, *x.shape[2:]), 1, 0)


def _token_blocks(tokens: Tokens, block: int) -> Tokens:
  # Without segment ids every token is in segment 0: one code path, one extra compare per tile.
  seg = jnp.zeros_like(tokens.pos) if tokens.seg is None else tokens.seg
  return Tokens(*(_to_blocks(x, block) for x in (tokens.pos, tokens.valid, seg)))


def _blockwise(q, k, v, q_tok: Tokens, k_tok: Tokens, scale, window, bq, bk):
  b, t, h, d = q.shape
  kh = k.shape[2]
  qb = _to_blocks(q.reshape(b, t, kh, h // kh, d), bq).transpose(0, 1, 3, 4, 2, 5)
  kb = _to_blocks(k, bk).transpose(0, 1, 3, 2, 4)
  vb = _to_blocks(v, bk).transpose(0, 1, 3, 2, 4)
  out = _flash(scale, window, qb, kb, vb, _token_blocks(q_tok, bq), _token_blocks(k_tok, bk))
  nq = out.shape[0]
  out = out.transpose(1, 0, 4, 2, 3, 5).reshape(b, nq * bq, h, d)
  return out[:, :t]


def _tile(qm: Tokens, km: Tokens, window) -> jax.Array:
  """Visibility of one tile, [B, 1, 1, bq, bk] (broadcasts over K and G)."""
  return visible(qm, km, window)[:, None, None]


def _scores(q_i, k_j, scale):
  """[B, K, G, bq, D] x [B, K, bk, D] -> float32 scores [B, K, G, bq, bk]."""
  return jnp.einsum("bkgqd,bksd->bkgqs", q_i, k_j, preferred_element_type=jnp.float32) * scale


def _at(tree, i):
  return jax.tree.map(lambda x: x[i], tree)


def _skip_unless(mask, update, carry):
  """``update(carry)`` if the tile has a visible pair, else ``carry`` unchanged."""
  return jax.lax.cond(mask.any(), update, lambda c: c, carry)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(scale, window, qb, kb, vb, qm, km):
  return _flash_fwd(scale, window, qb, kb, vb, qm, km)[0]


def _flash_fwd(scale, window, qb, kb, vb, qm, km):
  f32 = jnp.float32

  def q_block(_, xs):
    q_i, qm_i = xs
    row = q_i.shape[:-1]  # [B, K, G, bq]

    def k_block(j, carry):
      mask = _tile(qm_i, _at(km, j), window)

      def update(carry):
        m, l, acc = carry
        s = jnp.where(mask, _scores(q_i, kb[j], scale), MASK_VALUE)
        m_new = jnp.maximum(m, s.max(-1))
        p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
        alpha = jnp.exp(m - m_new)
        pv = jnp.einsum("bkgqs,bksd->bkgqd", p.astype(vb.dtype), vb[j], preferred_element_type=f32)
        return m_new, alpha * l + p.sum(-1), alpha[..., None] * acc + pv

      return _skip_unless(mask, update, carry)

    init = (jnp.full(row, MASK_VALUE, f32), jnp.zeros(row, f32), jnp.zeros(q_i.shape, f32))
    m, l, acc = jax.lax.fori_loop(0, kb.shape[0], k_block, init)
    seen = l > 0
    l_safe = jnp.where(seen, l, 1.0)
    out = jnp.where(seen[..., None], acc / l_safe[..., None], 0.0).astype(q_i.dtype)
    lse = jnp.where(seen, m + jnp.log(l_safe), 0.0)
    return None, (out, lse)

  _, (out, lse) = jax.lax.scan(q_block, None, (qb, qm))
  return out, (window, qb, kb, vb, qm, km, out, lse)


def _flash_bwd(scale, res, d_out):
  window, qb, kb, vb, qm, km, out, lse = res
  f32 = jnp.float32
  # D_i = rowsum(dO * O): the softmax Jacobian's diagonal term, [nq, B, K, G, bq].
  delta = jnp.sum(d_out.astype(f32) * out.astype(f32), axis=-1)

  def k_block(dq, xs):
    k_j, v_j, km_j = xs

    def q_block(i, carry):
      mask = _tile(_at(qm, i), km_j, window)

      def update(carry):
        dq, dk, dv = carry
        q_i, do_i = qb[i], d_out[i]
        p = jnp.exp(jnp.where(mask, _scores(q_i, k_j, scale) - lse[i][..., None], -jnp.inf))
        dv = dv + jnp.einsum("bkgqs,bkgqd->bksd", p.astype(do_i.dtype), do_i,
                             preferred_element_type=f32)
        dp = jnp.einsum("bkgqd,bksd->bkgqs", do_i, v_j, preferred_element_type=f32)
        ds = (p * (dp - delta[i][..., None])).astype(q_i.dtype)
        dq = dq.at[i].add(scale * jnp.einsum("bkgqs,bksd->bkgqd", ds, k_j,
                                             preferred_element_type=f32))
        dk = dk + scale * jnp.einsum("bkgqs,bkgqd->bksd", ds, q_i, preferred_element_type=f32)
        return dq, dk, dv

      return _skip_unless(mask, update, carry)

    zeros = jnp.zeros(k_j.shape, f32)
    dq, dk, dv = jax.lax.fori_loop(0, qb.shape[0], q_block, (dq, zeros, zeros))
    return dq, (dk, dv)

  dq, (dk, dv) = jax.lax.scan(k_block, jnp.zeros(qb.shape, f32), (kb, vb, km))
  return None, dq.astype(qb.dtype), dk.astype(kb.dtype), dv.astype(vb.dtype), None, None


def _flash_fwd_rule(scale, window, qb, kb, vb, qm, km):
  """The forward rule, rematerialised. Without it, inside a differentiated ``lax.scan`` (the
  remat scan over layers) JAX keeps the forward's per-tile intermediates, the masked scores and
  probabilities of every (query block, key block) pair, as residuals: the full [T, T] scores
  the blockwise attention exists to avoid (one 7B row of 10,240 tokens: 2 x 10.9 GiB)."""
  return jax.checkpoint(lambda *a: _flash_fwd(scale, window, *a))(qb, kb, vb, qm, km)


_flash.defvjp(_flash_fwd_rule, _flash_bwd)
