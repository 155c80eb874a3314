"""Layers stored stacked (``TransformerConfig.stacked_layers``): the same function as layers
stored one by one, in every pass that uses the layers.

Stacking and unstacking move data only, so conversions are compared exactly. A stacked model
and its stored twin run different programs (a scan over sliced weights against a loop over
separate ones), so their outputs are compared to a tolerance of 1e-5 (float32), after
asserting that what is compared is non-trivial (gradients non-zero, sampled tokens varied).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlpost import sampling
from rlpost.models import lora, packing
from rlpost.models import transformer as tfm
from rlpost.models import scoring

BASE = tfm.TransformerConfig(vocab_size=48, hidden_size=32, num_layers=3, num_heads=4,
                             num_kv_heads=2, intermediate_size=48, max_seq_len=40, qkv_bias=True,
                             init_std=0.2)
CONFIGS = {
    "qwen2": BASE,
    "blockwise": BASE.replace(attention="blockwise"),
    # Sliding and full layers interleaved, each kind with its own RoPE base: the scan picks the
    # layer's mask, window and tables by a traced flag.
    "mixed-sliding": BASE.replace(sliding_window=4, layer_types=("sliding", "full", "sliding"),
                                  local_rope_theta=100.0, qk_norm=True, sandwich_norm=True),
}


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  pt = jnp.asarray(rng.integers(1, 48, (3, 7)), jnp.int32)
  pm = jnp.asarray(np.arange(7)[None] >= np.array([0, 2, 4])[:, None])  # left padding
  ct = jnp.asarray(rng.integers(1, 48, (3, 6)), jnp.int32)
  cm = jnp.asarray(np.arange(6)[None] < np.array([6, 4, 1])[:, None])
  return pt, pm, ct, cm


def _layer_tree(state: nnx.State, stacked: bool):
  """The layers' parameters with a leading [L] axis, whichever way they are stored."""
  layers = state["layers"]
  if stacked:
    return layers
  return jax.tree.map(lambda *xs: jnp.stack(xs), *[layers[i] for i in range(len(layers))])


def _max_gap(a, b) -> float:
  return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a),
                                                             jax.tree.leaves(b)))


def test_conversion_moves_weights_exactly_and_back():
  stored = tfm.init_model(BASE, seed=1)
  stacked = tfm.with_layers_stacked(stored)
  assert stacked.cfg.stacked_layers and not stored.cfg.stacked_layers
  assert isinstance(stacked.layers, tfm.Block)
  shapes = jax.tree.map(lambda x: x.shape, nnx.state(stacked.layers))
  assert shapes["attn"]["q_proj"]["kernel"] == (3, 32, 32)
  assert shapes["mlp"]["down_proj"]["kernel"] == (3, 48, 32)
  # The layers differ from each other, so a conversion that mixed them up could not pass.
  assert float(jnp.max(jnp.abs(stored.layers[0].attn.q_proj.kernel[...]
                               - stored.layers[1].attn.q_proj.kernel[...]))) > 0
  for i in range(3):
    equal = jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)),
                         nnx.state(stacked.layer(i)), nnx.state(stored.layers[i]))
    assert all(jax.tree.leaves(equal)), i
  back = tfm.with_layers_stacked(stacked, False)
  assert not back.cfg.stacked_layers
  for x, y in zip(jax.tree.leaves(nnx.state(back)), jax.tree.leaves(nnx.state(stored))):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert tfm.with_layers_stacked(stacked) is stacked
  # A stacked model initialises to the weights of its stored twin (the same draws, stacked);
  # each layer's own.
  fresh = tfm.init_model(BASE.replace(stacked_layers=True), seed=1)
  q = fresh.layers.attn.q_proj.kernel[...]
  assert float(jnp.max(jnp.abs(q[0] - q[1]))) > 0
  for x, y in zip(jax.tree.leaves(nnx.state(fresh)), jax.tree.leaves(nnx.state(stacked))):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_stacked_scores_and_gradients_equal_stored(name):
  stored = tfm.init_model(CONFIGS[name], seed=2)
  stacked = tfm.with_layers_stacked(stored)
  pt, pm, ct, cm = _batch()
  tokens = jnp.concatenate([pt, ct], axis=1)
  mask = jnp.concatenate([pm, cm], axis=1)
  np.testing.assert_allclose(scoring.forward(stacked, tokens, mask),
                             scoring.forward(stored, tokens, mask),
                             atol=1e-5, rtol=1e-5)

  def loss(model, remat):
    logp, ent = scoring.completion_scores(model, pt, pm, ct, cm, entropy=True, remat=remat,
                                          logits_chunk=4)
    return jnp.sum(logp) + 0.1 * jnp.sum(jnp.where(cm, ent, 0.0))

  grad = nnx.jit(nnx.value_and_grad(loss), static_argnums=1)
  for remat in (False, True):
    want, g_want = grad(stored, remat)
    got, g_got = grad(stacked, remat)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    g_want, g_got = nnx.state(g_want), nnx.state(g_got)
    layers_want, layers_got = _layer_tree(g_want, False), _layer_tree(g_got, True)
    assert min(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(layers_want)) > 0
    assert _max_gap(layers_got, layers_want) < 1e-5, remat
    rest = lambda s: {k: v for k, v in s.items() if k != "layers"}  # noqa: E731
    assert _max_gap(rest(g_got), rest(g_want)) < 1e-5, remat
    # The packed (padding-free) pass: segment ids through the scan.
    packed = {m: packing.completion_scores(model, pt, pm, ct, cm, num_bins=2, bin_rows=2,
                                           remat=remat)[0]
              for m, model in (("stored", stored), ("stacked", stacked))}
    np.testing.assert_allclose(packed["stacked"], packed["stored"], atol=1e-5)
    np.testing.assert_allclose(packed["stored"], scoring.completion_scores(
        stored, pt, pm, ct, cm)[0], atol=1e-5)


@pytest.mark.parametrize("name", ["qwen2", "mixed-sliding"])
def test_stacked_sampler_matches_the_stored_scoring(name):
  """The cached decode path of a stacked model samples tokens whose log-probs, scored by the
  stored model's uncached pass, are the sampler's own (the sampler's contract, across the two
  storages); at temperature 1 the tokens vary."""
  stored = tfm.init_model(CONFIGS[name], seed=3)
  stacked = tfm.with_layers_stacked(stored)
  toks, mask = sampling.pad_prompts([[1 + (5 * i + j) % 40 for j in range(1 + i % 4)]
                                     for i in range(8)], side="left")
  cfg = sampling.SamplingConfig(max_new_tokens=12, temperature=1.0)
  out = sampling.Sampler(stacked, cfg)(nnx.state(stacked), toks, mask, jax.random.key(0))
  assert len(np.unique(np.asarray(out.tokens))) > 5
  logp = scoring.completion_logprobs(stored, jnp.asarray(toks), jnp.asarray(mask), out.tokens,
                                     out.mask)
  np.testing.assert_allclose(np.asarray(out.policy_logprobs), np.asarray(logp), atol=1e-5)


def test_stacked_adapters():
  stored = tfm.init_model(BASE, seed=4)
  cfg = lora.LoraConfig(rank=4, alpha=8.0, targets=lora.TARGETS, seed=1)
  stacked = lora.apply(tfm.with_layers_stacked(stored), cfg)
  q = stacked.layers.attn.q_proj.lora
  assert q.lora_a.shape == (3, 32, 4) and q.lora_b.shape == (3, 4, 32)
  assert isinstance(q.lora_a, nnx.LoRAParam)
  # The same adapters as on the layers stored one by one (the same start either way), stacked;
  # each layer's A is drawn anew.
  a = q.lora_a[...]
  assert float(jnp.max(jnp.abs(a[0] - a[1]))) > 0
  twin = lora.apply(nnx.merge(*nnx.split(stored)), cfg)
  restacked = nnx.state(tfm.with_layers_stacked(twin))
  for x, y in zip(jax.tree.leaves(nnx.state(stacked)), jax.tree.leaves(restacked)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert stacked.lm_head.lora.lora_a.shape == (32, 4)
  params = nnx.state(stacked)
  n_all, n_adapters = lora.count(params)
  din_dout = dict(q_proj=(32, 32), k_proj=(32, 16), v_proj=(32, 16), o_proj=(32, 32),
                  gate_proj=(32, 48), up_proj=(32, 48), down_proj=(48, 32))
  lm_head = 4 * (32 + 48)
  assert n_adapters == 3 * 4 * sum(a + b for a, b in din_dout.values()) + lm_head
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, 48, (2, 9)), jnp.int32)
  mask = jnp.ones((2, 9), bool)
  base_logits = scoring.forward(stored, tokens, mask)
  np.testing.assert_allclose(scoring.forward(stacked, tokens, mask), base_logits, atol=1e-5)
  rng = np.random.default_rng(1)
  for _, m in nnx.iter_graph(stacked):
    if isinstance(m, lora.Adapter):
      m.lora_b[...] = jnp.asarray(0.05 * rng.standard_normal(m.lora_b.shape), jnp.float32)
  adapted = scoring.forward(stacked, tokens, mask)
  assert float(jnp.max(jnp.abs(adapted - base_logits))) > 1e-3
  unstacked = tfm.with_layers_stacked(stacked, False)
  assert unstacked.layers[2].attn.q_proj.lora.lora_a.shape == (32, 4)
  np.testing.assert_allclose(scoring.forward(unstacked, tokens, mask), adapted, atol=1e-5)
  merged = lora.merge(tfm.with_layers_stacked(unstacked))
  assert not hasattr(merged.layers.attn.q_proj, "lora")
  np.testing.assert_allclose(scoring.forward(merged, tokens, mask), adapted, atol=1e-5)


def test_fsdp_never_shards_the_layer_axis(with_devices):
  """param_shardings on a 2-device fsdp mesh: the layer axis of stacked layers (the largest
  here, 64) stays whole and the next largest divisible axis is sharded; stored layers and the
  other parameters follow the plain rule (their largest divisible axis)."""
  out = with_devices("""
import jax
from flax import nnx
from rlpost import sharding
from rlpost.models import transformer as tfm
cfg = tfm.TransformerConfig(vocab_size=48, hidden_size=32, num_layers=64, num_heads=4,
                            num_kv_heads=2, intermediate_size=48)
mesh = sharding.make_mesh(data=1, fsdp=2)
for stacked in (True, False):
  params = nnx.state(nnx.eval_shape(lambda: tfm.Transformer(cfg.replace(stacked_layers=stacked),
                                                            rngs=nnx.Rngs(0))))
  specs = sharding.param_shardings(params, mesh, mode="fsdp", min_size=0)
  layer = specs["layers"] if stacked else specs["layers"][5]
  print(stacked, layer["mlp"]["gate_proj"]["kernel"].get_value().spec,
        layer["input_norm"]["scale"].get_value().spec,
        specs["embed"]["embedding"].get_value().spec)
""", num_devices=2)
  assert out.splitlines() == [
      "True P(None, None, 'fsdp') P(None, 'fsdp') P('fsdp', None)",
      "False P(None, 'fsdp') P('fsdp',) P('fsdp', None)"]


def test_policy_runs_choose_the_layer_storage_in_model(tmp_path):
  from rlpost.train import config as config_lib
  from rlpost.train.rl_config import RLConfig

  base = dict(policy=str(tmp_path), max_new_tokens=4)
  ok = config_lib.from_dict(RLConfig, dict(base, model={"stacked_layers": True}))
  assert ok.model["stacked_layers"] is True
  with pytest.raises(ValueError, match=r"config key 'model': stacked_layers must be true or "):
    config_lib.from_dict(RLConfig, dict(base, model={"stacked_layers": "yes"}))
