"""Sampler tests: cached decoding matches a full forward pass, padding invariance, determinism,
filtering properties, stop handling, compile counts and input validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import example, given, settings, strategies as st

from rlpost import sampling
from rlpost.models import transformer as tfm
from rlpost.models import scoring

CFG = tfm.TransformerConfig(vocab_size=61, hidden_size=32, num_layers=2, num_heads=4,
                            num_kv_heads=2, intermediate_size=64, qkv_bias=True, max_seq_len=64)
PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14], [15, 16, 17, 18]]


@pytest.fixture(scope="module")
def model():
  # A larger init scale gives peaked distributions, so greedy and sampled decoding differ.
  return tfm.init_model(CFG.replace(init_std=0.3), seed=1)


def _full_logprobs(model, prompt_tokens, prompt_mask, out):
  """Policy log-probs and logits of the completion tokens from one uncached forward pass."""
  return scoring.completion_logprobs(model, prompt_tokens, prompt_mask, out.tokens, out.mask,
                                     return_logits=True)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cached_logprobs_match_full_forward(model, side, temperature):
  toks, mask = sampling.pad_prompts(PROMPTS, side=side)
  sampler = sampling.Sampler(model, sampling.SamplingConfig(max_new_tokens=8,
                                                            temperature=temperature))
  out = sampler(nnx.state(model), toks, mask, jax.random.key(3))
  full, full_logits = _full_logprobs(model, jnp.asarray(toks), jnp.asarray(mask), out)
  m = np.asarray(out.mask)
  assert m.all()  # no stop tokens: every row runs the full length
  np.testing.assert_allclose(np.asarray(out.policy_logprobs)[m], np.asarray(full)[m],
                             atol=2e-5, rtol=1e-5)
  if temperature == 0.0:
    # Greedy decoding equals re-forwarding and taking the argmax at every position.
    np.testing.assert_array_equal(np.asarray(out.tokens), np.argmax(full_logits, axis=-1))
    assert np.all(np.asarray(out.logprobs) == 0.0)
  else:
    # At temperature 1 without filtering, the sampling distribution is the policy.
    np.testing.assert_allclose(out.logprobs, out.policy_logprobs, atol=1e-6)


def test_padding_layout_does_not_change_completion(model):
  cfg = sampling.SamplingConfig(max_new_tokens=6, temperature=1.0)
  sampler = sampling.Sampler(model, cfg)
  params = nnx.state(model)
  key = jax.random.key(7)
  outs = []
  for side, length in [("left", None), ("right", None), ("left", 9), ("right", 9)]:
    toks, mask = sampling.pad_prompts(PROMPTS, side=side, length=length)
    outs.append(sampler(params, toks, mask, key))
  for o in outs[1:]:
    np.testing.assert_array_equal(o.tokens, outs[0].tokens)
    np.testing.assert_allclose(o.policy_logprobs, outs[0].policy_logprobs, atol=2e-5)


def test_single_prompt_equals_batched_row_greedy(model):
  cfg = sampling.SamplingConfig(max_new_tokens=6, temperature=0.0)
  sampler = sampling.Sampler(model, cfg)
  params = nnx.state(model)
  toks, mask = sampling.pad_prompts(PROMPTS)
  batched = sampler(params, toks, mask, jax.random.key(0))
  for i, p in enumerate(PROMPTS):
    t1, m1 = sampling.pad_prompts([p])
    one = sampler(params, t1, m1, jax.random.key(0))
    np.testing.assert_array_equal(one.tokens[0], batched.tokens[i])


def test_determinism_and_key_dependence(model):
  sampler = sampling.Sampler(model, sampling.SamplingConfig(max_new_tokens=10, temperature=1.0))
  params = nnx.state(model)
  toks, mask = sampling.pad_prompts(PROMPTS)
  a = sampler(params, toks, mask, jax.random.key(11))
  b = sampler(params, toks, mask, jax.random.key(11))
  c = sampler(params, toks, mask, jax.random.key(12))
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.logprobs, b.logprobs)
  assert not np.array_equal(a.tokens, c.tokens)


def test_stop_tokens_lengths_and_early_exit(model):
  params = nnx.state(model)
  toks, mask = sampling.pad_prompts(PROMPTS)
  greedy = sampling.Sampler(model, sampling.SamplingConfig(max_new_tokens=8, temperature=0.0))
  ref = greedy(params, toks, mask, jax.random.key(0))
  # Stop on the token each row emits first: every row stops after exactly one token, and the
  # decode loop exits after the first step.
  stops = tuple(sorted(set(int(t) for t in np.asarray(ref.tokens)[:, 0])))
  cfg = sampling.SamplingConfig(max_new_tokens=8, temperature=0.0, stop_tokens=stops, pad_id=0)
  out = sampling.Sampler(model, cfg)(params, toks, mask, jax.random.key(0))
  np.testing.assert_array_equal(out.lengths, np.ones(len(PROMPTS)))
  np.testing.assert_array_equal(out.finish_reason, np.full(len(PROMPTS), sampling.FINISH_STOP))
  assert int(out.num_steps) == 1
  np.testing.assert_array_equal(np.asarray(out.tokens)[:, 1:], 0)
  assert not np.asarray(out.mask)[:, 1:].any()
  np.testing.assert_array_equal(np.asarray(out.policy_logprobs)[:, 1:], 0.0)
  # Stop on the second token of row 0 only: row 0 has length 2 ("stop"), others run to the end
  # unless they emit that token too.
  stop = int(ref.tokens[0, 1])
  cfg = sampling.SamplingConfig(max_new_tokens=8, temperature=0.0, stop_tokens=(stop,))
  out = sampling.Sampler(model, cfg)(params, toks, mask, jax.random.key(0))
  ref_tokens = np.asarray(ref.tokens)
  for i in range(len(PROMPTS)):
    hits = np.flatnonzero(ref_tokens[i] == stop)
    expect = hits[0] + 1 if hits.size else 8
    assert int(out.lengths[i]) == expect
    assert int(out.finish_reason[i]) == (sampling.FINISH_STOP if hits.size else sampling.FINISH_LENGTH)
    np.testing.assert_array_equal(np.asarray(out.tokens)[i, :expect], ref_tokens[i, :expect])


@settings(max_examples=40, deadline=None)
@example(0, 8, 1.0, 0.375)  # top_p = 1 with float mass just below 1 at the last token
@given(st.integers(0, 2 ** 31 - 1), st.integers(1, 12), st.floats(0.05, 1.0),
       st.floats(0.3, 2.0))
def test_filter_logits_allowed_set(seed, top_k, top_p, temperature):
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=(3, 12)).astype(np.float32) * 3
  logits[0, :4] = logits[0, 0]  # ties
  out = np.asarray(sampling.filter_logits(jnp.asarray(logits), temperature=temperature,
                                          top_k=top_k, top_p=top_p))
  scaled = logits / temperature
  for row, orow in zip(scaled, out):
    kept = np.isfinite(orow)
    # top-k: nothing below the k-th largest value survives.
    kth = np.sort(row)[::-1][top_k - 1]
    assert np.all(row[kept] >= kth)
    # top-p: the kept set is the smallest prefix (by probability) reaching top_p, ties kept.
    cand = np.where(row >= kth, row, -np.inf)
    p = np.exp(cand - cand.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    before = np.cumsum(p[order]) - p[order]
    # Float rounding decides tokens whose preceding mass is within 1e-5 of top_p either way.
    needed = order[before < top_p - 1e-5]
    admissible = order[(before < top_p + 1e-5) & (p[order] > 0)]
    assert kept[needed].all()
    assert kept[np.argmax(row)]
    assert np.all(row[kept] >= row[admissible].min() - 1e-6)
    np.testing.assert_allclose(orow[kept], row[kept], rtol=1e-6)


@pytest.mark.parametrize("top_k,top_p", [(3, 1.0), (0, 0.5), (5, 0.7)])
def test_sampler_never_emits_filtered_tokens(model, top_k, top_p):
  cfg = sampling.SamplingConfig(max_new_tokens=6, temperature=1.0, top_k=top_k, top_p=top_p)
  sampler = sampling.Sampler(model, cfg)
  toks, mask = sampling.pad_prompts(PROMPTS * 4)
  out = sampler(nnx.state(model), toks, mask, jax.random.key(5))
  _, full_logits = _full_logprobs(model, jnp.asarray(toks), jnp.asarray(mask), out)
  allowed = np.isfinite(np.asarray(sampling.filter_logits(
      full_logits, temperature=1.0, top_k=top_k, top_p=top_p)))
  chosen = np.take_along_axis(allowed, np.asarray(out.tokens)[..., None], axis=-1)[..., 0]
  assert chosen.all()
  # Sampling log-probs are renormalised over the allowed set, hence >= the policy's.
  assert np.all(np.asarray(out.logprobs) >= np.asarray(out.policy_logprobs) - 1e-5)


def test_top_k_one_is_greedy(model):
  params = nnx.state(model)
  toks, mask = sampling.pad_prompts(PROMPTS)
  g = sampling.Sampler(model, sampling.SamplingConfig(max_new_tokens=6, temperature=0.0))
  k1 = sampling.Sampler(model, sampling.SamplingConfig(max_new_tokens=6, temperature=0.7, top_k=1))
  np.testing.assert_array_equal(g(params, toks, mask, jax.random.key(0)).tokens,
                                k1(params, toks, mask, jax.random.key(9)).tokens)


def test_no_recompilation(model):
  sampler = sampling.Sampler(model, sampling.SamplingConfig(max_new_tokens=5, temperature=1.0))
  params = nnx.state(model)
  toks, mask = sampling.pad_prompts(PROMPTS)
  for seed in range(3):
    sampler(params, toks, mask, jax.random.key(seed))
  # New prompt contents with the same shapes, and new parameter values: still one compilation.
  toks2, mask2 = sampling.pad_prompts([p[::-1] for p in PROMPTS[::-1]], length=toks.shape[1])
  params2 = jax.tree.map(lambda x: x * 1.01, params)
  sampler(params2, toks2, mask2, jax.random.key(4))
  assert sampler.num_traces == 1
  assert sampler.fn._cache_size() == 1


def test_bf16_policy_runs(model):
  m = tfm.init_model(CFG.replace(dtype="bfloat16"), seed=0)
  out = sampling.Sampler(m, sampling.SamplingConfig(max_new_tokens=4))(
      nnx.state(m), *sampling.pad_prompts(PROMPTS), jax.random.key(0))
  assert np.isfinite(np.asarray(out.policy_logprobs)).all()


def test_bad_input_errors(model):
  params = nnx.state(model)
  toks, mask = sampling.pad_prompts(PROMPTS)
  with pytest.raises(ValueError, match="stop token 99"):
    sampling.Sampler(model, sampling.SamplingConfig(max_new_tokens=4, stop_tokens=(99,)))
  sampler = sampling.Sampler(model, sampling.SamplingConfig(max_new_tokens=60))
  with pytest.raises(ValueError, match="exceeds the cache limit"):
    sampler(params, toks, mask, jax.random.key(0))
  sampler = sampling.Sampler(model, sampling.SamplingConfig(max_new_tokens=4))
  with pytest.raises(ValueError, match="empty batch"):
    sampler(params, np.zeros((0, 3), np.int32), np.zeros((0, 3), bool), jax.random.key(0))
  with pytest.raises(ValueError, match="empty batch"):
    sampling.pad_prompts([])
  bad_mask = mask.copy()
  bad_mask[2] = False
  with pytest.raises(ValueError, match="prompt 2 has no valid token"):
    sampler(params, toks, bad_mask, jax.random.key(0))
  bad_toks = toks.copy()
  bad_toks[1, -1] = 500
  with pytest.raises(ValueError, match="prompt 1 has token 500"):
    sampler(params, bad_toks, mask, jax.random.key(0))
  with pytest.raises(ValueError, match="prompt 1 has 6 tokens"):
    sampling.pad_prompts(PROMPTS, length=4)
  with pytest.raises(ValueError, match="max_new_tokens"):
    sampling.SamplingConfig(max_new_tokens=0)
  with pytest.raises(ValueError, match="top_p"):
    sampling.SamplingConfig(max_new_tokens=3, top_p=0.0)


# --- fast paths: segmented decode, argmax, sort-free top-p ------------------------------------


def test_decode_segments_split():
  assert sampling.decode_segments(5, 1, 4) == []
  assert sampling.decode_segments(5, 2, 4) == [(1, 2, 6)]
  for tp, n, k in [(3, 10, 1), (3, 10, 3), (32, 128, 4), (4, 6, 9)]:
    segs = sampling.decode_segments(tp, n, k)
    assert len(segs) == min(k, n - 1)
    assert segs[0][0] == 1 and segs[-1][1] == n
    for (a, b, slots), nxt in zip(segs, segs[1:] + [None]):
      assert a < b and slots == tp + b - 1  # step b-1 writes slot tp + b - 2
      if nxt is not None:
        assert nxt[0] == b and nxt[2] > slots
  assert sampling.SamplingConfig(max_new_tokens=128).num_segments == 4
  assert sampling.SamplingConfig(max_new_tokens=8).num_segments == 1
  with pytest.raises(ValueError, match="decode_segments"):
    sampling.SamplingConfig(max_new_tokens=8, decode_segments=-1)


@pytest.mark.parametrize("temperature,stop", [(0.0, False), (1.0, False), (0.0, True)])
def test_decode_segments_do_not_change_results(model, temperature, stop):
  params = nnx.state(model)
  toks, mask = sampling.pad_prompts(PROMPTS, side="right")
  stop_tokens = ()
  if stop:  # row 0's sixth greedy token: row 0 stops inside the second of three segments
    ref = sampling.Sampler(model, sampling.SamplingConfig(max_new_tokens=12, temperature=0.0))(
        params, toks, mask, jax.random.key(2))
    stop_tokens = (int(ref.tokens[0, 5]),)
  outs = []
  for segments in (1, 3, 7):
    cfg = sampling.SamplingConfig(max_new_tokens=12, temperature=temperature,
                                  stop_tokens=stop_tokens, decode_segments=segments)
    outs.append(sampling.Sampler(model, cfg)(params, toks, mask, jax.random.key(2)))
  for o in outs[1:]:
    np.testing.assert_array_equal(o.tokens, outs[0].tokens)
    np.testing.assert_array_equal(o.lengths, outs[0].lengths)
    assert int(o.num_steps) == int(outs[0].num_steps)
    np.testing.assert_allclose(o.policy_logprobs, outs[0].policy_logprobs, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(o.logprobs, outs[0].logprobs, atol=1e-5, rtol=1e-5)
  full = scoring.completion_logprobs(model, jnp.asarray(toks), jnp.asarray(mask), outs[-1].tokens,
                                     outs[-1].mask)
  m = np.asarray(outs[-1].mask)
  np.testing.assert_allclose(np.asarray(outs[-1].policy_logprobs)[m], np.asarray(full)[m],
                             atol=2e-5, rtol=1e-5)


def test_argmax_matches_jnp():
  rng = np.random.default_rng(0)
  x = np.round(rng.normal(size=(6, 40)), 1).astype(np.float32)  # many ties
  x[1, :] = -np.inf
  x[2, 5] = np.inf
  x[3, [4, 9]] = np.nan
  x[4, :] = 0.0
  x[4, 7] = -0.0
  got = jax.jit(sampling._argmax)(jnp.asarray(x))
  np.testing.assert_array_equal(got, np.asarray(jnp.argmax(jnp.asarray(x), axis=-1)))
  assert got.dtype == jnp.int32


def _sort_filter_top_p(logits, top_p):
  """The sort-based nucleus filter that ``_nucleus_threshold`` replaced, as the reference."""
  sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
  probs = jax.nn.softmax(sorted_logits, axis=-1)
  mass_before = jnp.cumsum(probs, axis=-1) - probs
  threshold = jnp.min(jnp.where(mass_before < top_p, sorted_logits, jnp.inf), axis=-1,
                      keepdims=True)
  return jnp.where(logits < threshold, -jnp.inf, logits)


def test_top_p_bisection_equals_sort_reference():
  rng = np.random.default_rng(1)
  for trial in range(120):
    v = int(rng.integers(1, 200))
    x = (rng.normal(size=(3, v)) * rng.choice([0.01, 1.0, 30.0])).astype(np.float32)
    if trial % 3 == 0:
      x = np.round(x, 1)  # ties, including at the cut-off
    if trial % 4 == 0:
      x[:, : v // 3] = -np.inf  # as left by top-k
    if trial % 5 == 0:
      x[0] = 0.0
      x[0, ::2] = -0.0
    top_p = float(rng.choice([0.01, 0.3, 0.9, 0.95, 0.99999]))
    got = sampling.filter_logits(jnp.asarray(x), temperature=1.0, top_k=0, top_p=top_p)
    want = _sort_filter_top_p(jnp.asarray(x), top_p)
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want), err_msg=f"trial {trial}")
    np.testing.assert_array_equal(np.asarray(got)[np.isfinite(got)], x[np.isfinite(want)])


def test_per_row_keys_make_a_row_independent_of_its_batch(model):
  """With one key per row, a row's completion depends on its own key only: the same rows
  sampled inside a larger batch, in another order, or alone give the same tokens (separate
  programs, so up to a float-rounding flip at a near-tie: at most one of the 4 rows here), and
  one shared key gives other completions than the per-row keys."""
  cfg = sampling.SamplingConfig(max_new_tokens=8, temperature=1.0)
  sampler = sampling.Sampler(model, cfg)
  params = nnx.state(model)
  toks, mask = sampling.pad_prompts(PROMPTS, side="left")
  keys = jax.random.split(jax.random.key(11), len(PROMPTS))
  whole = np.asarray(sampler(params, toks, mask, keys).tokens)
  order = np.array([2, 0, 3, 1])
  shuffled = np.asarray(sampler(params, toks[order], mask[order], keys[order]).tokens)
  alone = np.concatenate([np.asarray(sampler(params, toks[i:i + 1], mask[i:i + 1],
                                             keys[i:i + 1]).tokens) for i in range(len(PROMPTS))])
  assert np.sum(np.any(shuffled != whole[order], axis=1)) <= 1
  assert np.sum(np.any(alone != whole, axis=1)) <= 1
  shared = np.asarray(sampler(params, toks, mask, jax.random.key(11)).tokens)
  assert np.any(shared != whole)
  raw = np.asarray(sampler(params, toks, mask, jax.random.key_data(keys)).tokens)
  np.testing.assert_array_equal(raw, whole)  # raw key data is wrapped: the same program
  with pytest.raises(ValueError, match="one per row"):
    sampler(params, toks, mask, keys[:2])
