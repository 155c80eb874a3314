"""rlpost.models.lora: adapters, their zero start, merging, the trainable split, the config.

Every comparison after a change of B first asserts that the change moved the logits, so an
adapter that did nothing could not pass.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlpost.models import lora
from rlpost.models import transformer as tfm
from rlpost.models import scoring

CFG = tfm.TransformerConfig(vocab_size=48, hidden_size=32, num_layers=2, num_heads=4,
                            num_kv_heads=2, intermediate_size=48, max_seq_len=32, qkv_bias=True)
ALL = lora.TARGETS  # every projection and the LM head


def _batch(seed=0, b=3, t=10):
  rng = np.random.default_rng(seed)
  tokens = jnp.asarray(rng.integers(3, CFG.vocab_size, (b, t)), jnp.int32)
  mask = jnp.asarray(np.arange(t)[None] >= np.array([0, 2, 4])[:b, None])  # left padding
  return tokens, mask


def _adapted(rank, targets=ALL, cfg=CFG, seed=0):
  base = tfm.init_model(cfg, seed=1)
  model = lora.apply(nnx.merge(*nnx.split(base)), lora.LoraConfig(rank, 8.0, targets, seed))
  return base, model


def _randomize_b(model, seed=0, std=0.05):
  """Draw every B from N(0, std^2), in place."""
  rng = np.random.default_rng(seed)
  for _, m in nnx.iter_graph(model):
    if isinstance(m, lora.Adapter):
      m.lora_b[...] = jnp.asarray(std * rng.standard_normal(m.lora_b.shape), m.lora_b.dtype)
  return model


@pytest.mark.parametrize("rank", [8, 32])
def test_zero_b_reproduces_the_base_logits_exactly(rank):
  base, model = _adapted(rank)
  # Rank 32 is full rank (>= min(din, dout)) for every projection and the LM head.
  assert max(min(m.in_features, m.out_features) for _, m in nnx.iter_graph(model)
             if isinstance(m, nnx.Linear)) == 32
  tokens, mask = _batch()
  np.testing.assert_array_equal(np.asarray(scoring.forward(model, tokens, mask)),
                                np.asarray(scoring.forward(base, tokens, mask)))
  # The adapters are there (and non-trivial: A is drawn), and their output is zero.
  a = [m.lora_a[...] for _, m in nnx.iter_graph(model) if isinstance(m, lora.Adapter)]
  assert len(a) == 7 * CFG.num_layers + 1 and all(float(jnp.std(x)) > 0 for x in a)


def test_adapter_shapes_dtypes_scale_and_peft_init():
  cfg = CFG.replace(param_dtype="bfloat16", dtype="bfloat16", hidden_size=64, num_heads=4)
  _, model = _adapted(4, ("q_proj", "down_proj"), cfg=cfg)
  q = model.layers[0].attn.q_proj.lora
  down = model.layers[1].mlp.down_proj.lora
  assert isinstance(q.lora_a, nnx.LoRAParam) and isinstance(q.lora_a, nnx.Param)
  assert q.lora_a.shape == (64, 4) and q.lora_b.shape == (4, 64)
  assert down.lora_a.shape == (48, 4) and down.lora_b.shape == (4, 64)
  assert q.lora_a.dtype == jnp.bfloat16 and q.scale == 8.0 / 4
  assert not hasattr(model.layers[0].attn.k_proj, "lora")
  # PEFT: A ~ U(-1/sqrt(din), 1/sqrt(din)) (kaiming_uniform_ with a = sqrt(5)); B = 0.
  big = lora.Adapter(256, 64, 8, scale=1.0, dtype=jnp.float32, param_dtype=jnp.float32,
                     rngs=nnx.Rngs(0))
  a = np.asarray(big.lora_a[...])
  assert np.abs(a).max() <= 1 / 16 and np.abs(a).max() > 0.99 / 16
  np.testing.assert_allclose(a.std(), 1 / 16 / np.sqrt(3), rtol=0.02)
  assert not np.any(np.asarray(big.lora_b[...]))
  # The output is scale * (x A) B in the compute dtype.
  big.lora_b[...] = jnp.ones((64, 8))
  x = jnp.ones((2, 256))
  big.scale = 0.5
  np.testing.assert_allclose(big(x), 0.5 * (x @ big.lora_a[...]) @ big.lora_b[...], rtol=1e-6)


def test_merged_logits_equal_the_adapted_logits():
  base, model = _adapted(8)
  tokens, mask = _batch(1)
  _randomize_b(model)
  adapted = np.asarray(scoring.forward(model, tokens, mask))
  gap = np.max(np.abs(adapted - np.asarray(scoring.forward(base, tokens, mask))))
  assert gap > 1e-2, gap  # precondition: the adapters change the logits
  graphdef, params = nnx.split(model)
  # The pure function: without the adapters (the base graph) and with them kept at B = 0.
  merged = lora.merge_params(params, scale=1.0)
  np.testing.assert_allclose(np.asarray(scoring.forward(nnx.merge(nnx.split(base)[0], merged),
                                                        tokens, mask)), adapted, atol=1e-5)
  kept = lora.merge_params(params, scale=1.0, keep_adapters=True)
  np.testing.assert_allclose(np.asarray(scoring.forward(nnx.merge(graphdef, kept), tokens, mask)),
                             adapted, atol=1e-5)
  assert not any(np.any(np.asarray(v[...]))
                 for p, v in nnx.to_flat_state(kept) if p[-1] == "lora_b")
  # In place on the module: an ordinary model of the base graph.
  lora.merge(model)
  assert nnx.split(model)[0] == nnx.split(base)[0]
  np.testing.assert_allclose(np.asarray(scoring.forward(model, tokens, mask)), adapted, atol=1e-5)


def test_remat_scan_over_adapted_layers_gives_the_same_values_and_gradients():
  _, model = _adapted(4, lora.DEFAULT_TARGETS)
  _randomize_b(model, seed=2)
  graphdef, params = nnx.split(model)
  tokens, mask = _batch(2)
  prompts, pmask, comp, cmask = tokens[:, :6], mask[:, :6], tokens[:, 6:], mask[:, 6:]

  def loss(train, frozen, remat):
    m = nnx.merge(graphdef, lora.combine(train, jax.lax.stop_gradient(frozen)))
    logp, _ = scoring.completion_scores(m, prompts, pmask, comp, cmask, remat=remat)
    return jnp.sum(logp)

  train, frozen = lora.partition(params, lora.trainable_mask(params))
  values = [jax.value_and_grad(loss)(train, frozen, remat) for remat in (False, True)]
  np.testing.assert_allclose(values[0][0], values[1][0], rtol=1e-6)
  g0, g1 = (jax.tree.leaves(v[1]) for v in values)
  assert len(g0) == 2 * 7 * CFG.num_layers and sum(float(jnp.sum(g * g)) for g in g0) > 0
  for x, y in zip(g0, g1):
    np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)


def test_trainable_mask_partition_and_count():
  _, model = _adapted(4, ("q_proj", "lm_head"))
  params = nnx.state(model)
  train, frozen = lora.partition(params, lora.trainable_mask(params))
  train_paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(train)]
  assert len(train_paths) == 2 * (CFG.num_layers + 1)
  assert all("lora_a" in p or "lora_b" in p for p in train_paths)
  assert not any("lora" in jax.tree_util.keystr(p)
                 for p, _ in jax.tree_util.tree_leaves_with_path(frozen))
  back = lora.combine(train, frozen)
  assert jax.tree.structure(back) == jax.tree.structure(params)
  assert all(x is y for x, y in zip(jax.tree.leaves(back), jax.tree.leaves(params)))
  total, adapters = lora.count(params)
  assert adapters == CFG.num_layers * 4 * (32 + 32) + 4 * (32 + 48)
  assert total == CFG.num_params() + adapters


@pytest.mark.parametrize("kw, match", [
    (dict(rank=0), "rank must be an int >= 1"),
    (dict(rank=-1), "rank must be an int >= 1"),
    (dict(rank=4, alpha=0.0), "alpha must be a number > 0"),
    (dict(rank=4, targets=()), "at least one projection"),
    (dict(rank=4, targets=("q_proj", "qkv")), r"unknown LoRA target\(s\) \['qkv'\]"),
    (dict(rank=4, targets=("q_proj", "q_proj")), "repeat"),
])
def test_config_errors(kw, match):
  with pytest.raises(ValueError, match=match):
    lora.LoraConfig(**kw)


def test_config_parses_comma_strings_and_apply_refuses_missing_or_repeated_targets():
  assert lora.LoraConfig(2, targets=" q_proj, v_proj ,").targets == ("q_proj", "v_proj")
  tied = tfm.init_model(CFG.replace(tie_embeddings=True))
  with pytest.raises(ValueError, match=r"\['lm_head'\] match no nnx.Linear"):
    lora.apply(tied, lora.LoraConfig(2, targets=("q_proj", "lm_head")))
  model = lora.apply(tfm.init_model(CFG), lora.LoraConfig(2, targets=("v_proj",)))
  with pytest.raises(ValueError, match="already has a LoRA adapter"):
    lora.apply(model, lora.LoraConfig(2, targets=("v_proj",)))
