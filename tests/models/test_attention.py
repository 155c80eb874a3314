"""rlpost.models.attention: blockwise equals the plain attention in values and gradients.

Every case compares ``impl="blockwise"`` (small tiles, so T and S span several partial blocks)
with ``impl="xla"`` on the same inputs: the outputs, and the gradients wrt q, k and v of a random
linear functional of the output. The plain implementation itself is checked against a float64
NumPy loop over the visibility rule, so the two cannot agree on a wrong mask.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlpost.models import attention
from rlpost.models.attention import Tokens
from rlpost.models import transformer as tfm
from rlpost.models import scoring
from scripts.benchmarks.attention_memory import attention_grad_memory

VARIANTS = pytest.mark.parametrize("variant", [lambda f: f, jax.jit], ids=["eager", "jit"])
BLOCKS = dict(block_q=8, block_k=16)


def _inputs(b=2, t=37, s=None, h=4, kh=2, d=8, dtype=jnp.float32, seed=0):
  """q, k, v and the cotangent w of the functional sum(out * w), random normal."""
  rng = np.random.default_rng(seed)
  s = t if s is None else s
  q, w = (jnp.asarray(rng.standard_normal((b, t, h, d)), dtype) for _ in range(2))
  k, v = (jnp.asarray(rng.standard_normal((b, s, kh, d)), dtype) for _ in range(2))
  return q, k, v, w


def _padded_tokens(t, left=5, right=7):
  """Row 0 left-padded, row 1 right-padded: validity and positions counted over valid tokens."""
  valid = np.ones((2, t), bool)
  valid[0, :left] = False
  valid[1, t - right:] = False
  pos = np.maximum(np.cumsum(valid, -1) - 1, 0).astype(np.int32)
  return jnp.asarray(pos), jnp.asarray(valid)


def _packed_tokens(t, split=(15, 11)):
  """Two sequences per row (lengths ``split``, then the second row's halves swapped) and
  trailing padding: segment ids 0, 1 (padding: 2), positions restarting per segment."""
  pos, seg, valid = (np.zeros((2, t), np.int32) for _ in range(3))
  for row, (a, c) in enumerate((split, split[::-1])):
    seg[row] = np.r_[np.zeros(a), np.ones(c), np.full(t - a - c, 2)]
    pos[row] = np.r_[np.arange(a), np.arange(c), np.zeros(t - a - c)]
  valid = seg < 2
  return jnp.asarray(pos), jnp.asarray(valid), jnp.asarray(seg)


def _values_and_grads(impl, q, k, v, w, variant, **kw):
  def loss(q, k, v):
    out = attention.attend(q, k, v, impl=impl, **kw)
    return jnp.sum(out.astype(jnp.float32) * w.astype(jnp.float32)), out
  (_, out), grads = variant(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  return out, grads


def _assert_same(q, k, v, w, variant, atol=1e-5, **kw):
  """blockwise == xla in values and q/k/v gradients; the gradients are not all zero."""
  ref_out, ref_grads = _values_and_grads("xla", q, k, v, w, variant, **kw)
  out, grads = _values_and_grads("blockwise", q, k, v, w, variant, **BLOCKS, **kw)
  assert out.dtype == q.dtype and out.shape == q.shape
  f32 = lambda x: np.asarray(x, np.float32)  # noqa: E731
  np.testing.assert_allclose(f32(out), f32(ref_out), atol=atol, rtol=atol)
  for name, g, ref in zip("qkv", grads, ref_grads):
    assert np.all(np.isfinite(f32(g))), name
    assert np.abs(f32(ref)).max() > 0.1, name  # the comparison moved something
    np.testing.assert_allclose(f32(g), f32(ref), atol=atol, rtol=atol, err_msg=f"d{name}")
  return out


def _numpy_attention(q, k, v, q_pos, k_pos, q_valid, k_valid, q_seg, k_seg, window, scale):
  """float64 loops over the module docstring's visibility rule; zero rows without keys."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  b, t, h, _ = q.shape
  group = h // k.shape[2]
  out = np.zeros_like(q)
  for i in range(b):
    for j in range(t):
      vis = (k_valid[i] & q_valid[i, j] & (k_pos[i] <= q_pos[i, j])
             & (k_seg[i] == q_seg[i, j] if q_seg is not None else True))
      if window is not None:
        vis &= q_pos[i, j] - k_pos[i] < window
      if not vis.any():
        continue
      for hh in range(h):
        logits = k[i, vis, hh // group] @ q[i, j, hh] * scale
        p = np.exp(logits - logits.max())
        out[i, j, hh] = p @ v[i, vis, hh // group] / p.sum()
  return out


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_xla_matches_numpy_visibility_rule(packed, window):
  q, k, v, _ = _inputs(kh=2)
  if packed:
    pos, valid, seg = _packed_tokens(37)
  else:
    (pos, valid), seg = _padded_tokens(37), None
  out = attention.attend(q, k, v, Tokens(pos, valid, seg), impl="xla", window=window, scale=0.3)
  ref = _numpy_attention(q, k, v, *(np.asarray(x) if x is not None else None for x in
                                    (pos, pos, valid, valid, seg, seg)), window, 0.3)
  np.testing.assert_allclose(np.asarray(out), ref, atol=1e-5)


@VARIANTS
def test_causal_left_and_right_padding(variant):
  q, k, v, w = _inputs()
  pos, valid = _padded_tokens(37)
  out = _assert_same(q, k, v, w, variant, q_tok=Tokens(pos, valid), scale=8 ** -0.5)
  # Padded query rows are zero, not NaN (the module's convention), and the valid ones are not.
  assert np.abs(np.asarray(out)[np.asarray(valid)]).max() > 0.1
  np.testing.assert_array_equal(np.asarray(out)[~np.asarray(valid)], 0.0)


@VARIANTS
def test_segment_ids_two_sequences_per_row(variant):
  q, k, v, w = _inputs()
  pos, valid, seg = _packed_tokens(37)
  _assert_same(q, k, v, w, variant, q_tok=Tokens(pos, valid, seg), scale=8 ** -0.5)


def test_segments_keep_packed_sequences_apart():
  """Each packed sequence's output equals attending to that sequence alone."""
  q, k, v, _ = _inputs(b=1, t=26)
  pos, valid, seg = (x[:1, :26] for x in _packed_tokens(37))
  out = attention.attend(q, k, v, Tokens(pos, valid, seg), scale=0.5, impl="blockwise",
                         **BLOCKS)
  for lo, hi in ((0, 15), (15, 26)):
    alone = attention.attend(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], Tokens(pos[:, lo:hi]),
                             scale=0.5, impl="xla")
    np.testing.assert_allclose(np.asarray(out[:, lo:hi]), np.asarray(alone), atol=1e-5)


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_grouped_query_heads(kv_heads):
  q, k, v, w = _inputs(kh=kv_heads)
  pos, valid = _padded_tokens(37)
  _assert_same(q, k, v, w, jax.jit, q_tok=Tokens(pos, valid), scale=8 ** -0.5)


@VARIANTS
def test_sliding_window(variant):
  q, k, v, w = _inputs()
  pos, valid = _padded_tokens(37)
  _assert_same(q, k, v, w, variant, q_tok=Tokens(pos, valid), window=5, scale=8 ** -0.5)


@pytest.mark.parametrize("t,s", [(13, 29), (29, 13), (5, 7)])
def test_lengths_not_multiples_of_blocks(t, s):
  """T != S (queries are the last T of S keys, or the reverse) with partial and clipped blocks."""
  q, k, v, w = _inputs(t=t, s=s)
  n = max(t, s)
  k_pos = jnp.broadcast_to(jnp.arange(n - s, n, dtype=jnp.int32), (2, s))
  q_pos = jnp.broadcast_to(jnp.arange(n - t, n, dtype=jnp.int32), (2, t))
  _assert_same(q, k, v, w, jax.jit, q_tok=Tokens(q_pos), k_tok=Tokens(k_pos), scale=8 ** -0.5)


def test_bfloat16_close_to_float32():
  q, k, v, w = _inputs(dtype=jnp.bfloat16)
  pos, valid, seg = _packed_tokens(37)
  kw = dict(q_tok=Tokens(pos, valid, seg), scale=8 ** -0.5)
  ref_out, ref_grads = _values_and_grads(
      "xla", *(x.astype(jnp.float32) for x in (q, k, v, w)), jax.jit, **kw)
  for impl, blocks in (("xla", {}), ("blockwise", BLOCKS)):
    out, grads = _values_and_grads(impl, q, k, v, w, jax.jit, **blocks, **kw)
    assert out.dtype == jnp.bfloat16 and all(g.dtype == jnp.bfloat16 for g in grads)
    for got, ref in zip((out, *grads), (ref_out, *ref_grads)):
      np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(ref), atol=5e-2,
                                 rtol=5e-2, err_msg=impl)


@pytest.mark.parametrize("impl", ["xla", "blockwise"])
def test_fully_masked_rows_finite(impl):
  """A padded row with no valid token at all, and padded queries: zero output, finite grads."""
  q, k, v, w = _inputs()
  pos, valid = _padded_tokens(37)
  valid = valid.at[1].set(False)
  kw = dict(q_tok=Tokens(pos, valid), scale=8 ** -0.5)
  out, grads = _values_and_grads(impl, q, k, v, w, jax.jit, **BLOCKS, **kw)
  assert np.all(np.asarray(out)[~np.asarray(valid)] == 0.0)
  for g in grads:
    assert np.all(np.isfinite(np.asarray(g)))
    assert np.abs(np.asarray(g)[0]).max() > 0  # row 0 has valid tokens: its gradient moved
    np.testing.assert_array_equal(np.asarray(g)[1], 0.0)  # nothing in row 1 is seen


def test_argument_errors():
  q, k, v, _ = _inputs(kh=2)
  pos = jnp.zeros((2, 37), jnp.int32)
  with pytest.raises(ValueError, match="cudnn.*GPU"):
    attention.attend(q, k, v, Tokens(pos), scale=1.0, impl="cudnn")
  with pytest.raises(ValueError, match="impl must be one of"):
    attention.attend(q, k, v, Tokens(pos), scale=1.0, impl="flash")
  with pytest.raises(ValueError, match="segment ids for both"):
    attention.attend(q, k, v, Tokens(pos, seg=pos), Tokens(pos), scale=1.0)
  with pytest.raises(ValueError, match="multiple"):
    attention.attend(q[:, :, :3], k, v, Tokens(pos), scale=1.0)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="sizes of the CPU compiler's plan")
def test_blockwise_gradient_needs_far_less_memory():
  """XLA's planned temporaries of forward + backward at T = S = 2048: the plain attention holds
  several [B, H, T, S] float32 tensors, the blockwise pass less than one."""
  shape = dict(batch=1, seq=2048, heads=4, kv_heads=4, head_dim=64, dtype=jnp.float32)
  plain = attention_grad_memory("xla", **shape)
  blockwise = attention_grad_memory("blockwise", **shape)
  scores = plain["scores_bytes"]  # one [1, 4, 2048, 2048] float32 tensor: 64 MiB
  assert plain["temp_bytes"] > 2 * scores
  assert blockwise["temp_bytes"] < scores
  assert plain["temp_bytes"] > 4 * blockwise["temp_bytes"]


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="sizes of the CPU compiler's plan")
def test_blockwise_keeps_no_score_tiles_under_the_remat_scan():
  """Inside the remat scan over layers, the blockwise pass's forward keeps no per-tile scores.

  Unless its forward rule is rematerialised, JAX keeps every (query block, key block) tile of
  the masked scores and probabilities as residuals: [nq, nk, B, K, G, bq, bk] stacks, the full
  [T, T] scores again, and 10x the temporaries of the same model without remat. Here, 4,096
  tokens in 8 x 8 tiles of 512: no array holding many 512 x 512 tiles in the compiled program,
  and remat's temporaries are below the plain pass's."""
  import re

  from flax import nnx

  temps = {}
  for remat in (False, True):
    cfg = tfm.TransformerConfig(vocab_size=64, hidden_size=128, num_layers=2, num_heads=4,
                                num_kv_heads=2, intermediate_size=256, max_seq_len=4096,
                                attention="blockwise")
    graphdef, params = nnx.split(nnx.eval_shape(lambda: tfm.Transformer(cfg, rngs=nnx.Rngs(0))))
    spec = jax.ShapeDtypeStruct

    def loss(p):
      logp, _ = scoring.completion_scores(nnx.merge(graphdef, p), jnp.ones((1, 96), jnp.int32),
                                          jnp.ones((1, 96), bool), jnp.ones((1, 4000), jnp.int32),
                                          jnp.ones((1, 4000), bool), remat=remat)
      return jnp.sum(logp)

    compiled = jax.jit(jax.grad(loss)).lower(
        jax.tree.map(lambda x: spec(x.shape, x.dtype), params)).compile()
    # Any array of at least 6 dimensions ending in a 512 x 512 tile (whatever the leading
    # block or layer axes) would be such a stack; one tile in flight is [B, K, G, 512, 512].
    assert not re.search(r"\[(\d+,){4,}512,512\]", compiled.as_text())
    temps[remat] = compiled.memory_analysis().temp_size_in_bytes
  assert temps[True] < temps[False], temps


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cached_and_uncached_layer_share_the_kernel_and_the_padded_row_rule(dtype):
  """``transformer.Attention`` over a cache (the sampler's prefill: keys and values written to
  slots [B, K, D, S] / [B, K, S, D], the shared ``grouped`` kernel) equals the uncached layer
  (``attend``, keys [B, S, K, D]) on every row: valid rows to within float rounding (two
  layouts, so no bitwise claim), padded rows exactly zero in both."""
  cfg = tfm.TransformerConfig(vocab_size=11, hidden_size=32, num_layers=1, num_heads=4,
                              num_kv_heads=2, intermediate_size=8, qkv_bias=True, dtype=dtype)
  layer = tfm.Attention(cfg, rngs=nnx.Rngs(0))
  x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 37, 32)), cfg.compute_dtype)
  pos, valid = _padded_tokens(37)
  tokens = attention.Tokens(pos, valid)
  # The o_proj bias is 0 and the layer is linear in attention's output: padded rows stay 0.
  plain, none = layer(x, tokens, None, 0)
  cache = tfm.init_cache(cfg, 2, 37)[0]
  cached, new = layer(x, tokens, cache, 0, k_tok=tokens)
  assert none is None and new.k.shape == (2, 2, 8, 37) and new.v.shape == (2, 2, 37, 8)
  rows = np.asarray(valid)
  f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
  assert np.abs(f32(plain)[rows]).max() > 0.01  # outputs of order 0.04
  np.testing.assert_array_equal(f32(plain)[~rows], 0.0)
  np.testing.assert_array_equal(f32(cached)[~rows], 0.0)
  # Tolerances: a few ulps of float32, one bfloat16 ulp at the outputs' scale.
  rtol, atol = (1e-6, 1e-7) if dtype == "float32" else (1e-2, 2e-4)
  np.testing.assert_allclose(f32(cached)[rows], f32(plain)[rows], rtol=rtol, atol=atol)


def test_visible_is_the_one_mask():
  """The sampler's decode step and a window: ``visible`` of slot tokens (prompt slots, then
  completion slots at the next positions, valid once written) is causal by position."""
  q = attention.Tokens(jnp.array([[4]]), jnp.array([[True]]))
  k = attention.Tokens(jnp.array([[0, 0, 1, 2, 3, 4, 5]]),
                       jnp.array([[False, True, True, True, True, True, False]]))
  np.testing.assert_array_equal(attention.visible(q, k)[0, 0], [0, 1, 1, 1, 1, 1, 0])
  np.testing.assert_array_equal(attention.visible(q, k, window=3)[0, 0], [0, 0, 0, 1, 1, 1, 0])
  seg = jnp.array([[1, 1, 1, 2, 2, 2, 2]])
  qs = attention.Tokens(jnp.array([[1]]), jnp.array([[True]]), jnp.array([[2]]))
  ks = attention.Tokens(jnp.array([[0, 1, 2, 0, 1, 2, 3]]), seg > 0, seg)
  np.testing.assert_array_equal(attention.visible(qs, ks)[0, 0], [0, 0, 0, 1, 1, 0, 0])


# ---------------------------------------------------------------------------------------------
# In the model: TransformerConfig.attention
# ---------------------------------------------------------------------------------------------

def test_model_blockwise_scores_and_gradients_equal_xla():
  """completion_scores under attention="blockwise" (remat scan over interleaved sliding and
  global layers with their own RoPE base, GQA, left-padded prompts, padded completions) equal
  the "xla" model's log-probs and parameter gradients; the sampler's cached path is unchanged."""
  from flax import nnx

  from rlpost.models import transformer as tfm

  cfg = tfm.TransformerConfig(vocab_size=40, hidden_size=32, num_layers=3, num_heads=4,
                              num_kv_heads=2, intermediate_size=48, max_seq_len=64,
                              sliding_window=5, layer_types=("sliding", "full", "sliding"),
                              local_rope_theta=50.0, qk_norm=True)
  rng = np.random.default_rng(0)
  prompts = jnp.asarray(rng.integers(3, 40, (3, 7)), jnp.int32)
  pmask = jnp.asarray(np.arange(7)[None, :] >= np.array([[0], [2], [5]]))
  comp = jnp.asarray(rng.integers(3, 40, (3, 9)), jnp.int32)
  cmask = jnp.asarray(np.arange(9)[None, :] < np.array([[9], [4], [6]]))
  weights = jnp.asarray(rng.standard_normal((3, 9)), jnp.float32)

  def loss_and_grad(impl, remat):
    graphdef, params = nnx.split(tfm.init_model(cfg.replace(attention=impl), seed=3))

    def loss(p):
      logp, _ = scoring.completion_scores(nnx.merge(graphdef, p), prompts, pmask, comp, cmask,
                                          remat=remat)
      return jnp.sum(logp * weights), logp
    (_, logp), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return logp, grads

  want, want_g = loss_and_grad("xla", False)
  assert float(optax_norm(want_g)) > 0
  for remat in (False, True):
    got, got_g = loss_and_grad("blockwise", remat)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5)
    for a, b in zip(jax.tree.leaves(got_g), jax.tree.leaves(want_g)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)


def optax_norm(tree):
  return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)))


def test_attention_key_is_validated():
  from rlpost.models import transformer as tfm

  with pytest.raises(ValueError, match="attention must be one of"):
    tfm.TransformerConfig(vocab_size=8, hidden_size=8, num_layers=1, num_heads=2,
                          num_kv_heads=1, intermediate_size=8, attention="flash")


def test_policy_runs_choose_the_attention_in_model(tmp_path):
  from rlpost.train import config as config_lib
  from rlpost.train.rl_config import RLConfig

  base = dict(policy=str(tmp_path), max_new_tokens=4)
  ok = config_lib.from_dict(RLConfig, dict(base, model={"attention": "blockwise"}))
  assert ok.model["attention"] == "blockwise"
  with pytest.raises(ValueError, match=r"config key 'model': attention must be one of"):
    config_lib.from_dict(RLConfig, dict(base, model={"attention": "flash"}))


def test_visible_takes_tokens_without_validity():
  pos = jnp.asarray([[0, 1, 2]], jnp.int32)
  valid = jnp.asarray([[True, True, False]])
  causal = np.tril(np.ones((3, 3), bool))[None]
  np.testing.assert_array_equal(np.asarray(attention.visible(Tokens(pos), Tokens(pos))), causal)
  np.testing.assert_array_equal(np.asarray(attention.visible(Tokens(pos), Tokens(pos, valid))),
                                causal & np.asarray(valid)[:, None, :])
