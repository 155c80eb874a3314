"""Qwen3, Gemma 3 (text), Mistral and biased Llama against transformers.

Each family is built in transformers from a tiny configuration that turns on every option the
family has here (explicit head_dim, q/k norms, biases, sliding windows short enough to cut the
test sequences, Gemma's local RoPE base, linear RoPE scaling and final-logit softcapping), with
every parameter re-randomised so that a wrong mapping cannot pass by coincidence. The contract,
in float32: logits within 1e-4 with left and right padding, greedy tokens equal to
``generate`` for 24 tokens on a left-padded batch, and an export that transformers reloads as
the same class with the same logits.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

from rlpost import sampling  # noqa: E402
from rlpost.models import hf  # noqa: E402
from rlpost.models.scoring import completion_logprobs, forward  # noqa: E402
from rlpost.models.transformer import LinearRopeScaling, TransformerConfig, init_model  # noqa: E402
from test_hf import _hf_logits, _hf_reload as _reload  # noqa: E402

BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-5, pad_token_id=0, eos_token_id=1, bos_token_id=2)
WINDOW = 5  # shorter than the test sequences (12-40 tokens), so the window cuts them

# name -> (transformers config class name, model class name, config kwargs)
FAMILIES = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              dict(head_dim=24, rope_theta=5000.0, tie_word_embeddings=False)),
    "qwen3-bias-sliding": ("Qwen3Config", "Qwen3ForCausalLM",
                           dict(head_dim=24, rope_theta=5000.0, attention_bias=True,
                                use_sliding_window=True, sliding_window=WINDOW,
                                max_window_layers=1, tie_word_embeddings=True)),
    "mistral": ("MistralConfig", "MistralForCausalLM",
                dict(head_dim=24, rope_theta=5000.0, sliding_window=WINDOW,
                     tie_word_embeddings=False)),
    "llama-bias": ("LlamaConfig", "LlamaForCausalLM",
                   dict(rope_theta=5000.0, attention_bias=True, tie_word_embeddings=False)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               dict(head_dim=24, query_pre_attn_scalar=20, sliding_window=WINDOW,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                    rope_parameters={
                        "full_attention": {"rope_type": "linear", "factor": 2.0,
                                           "rope_theta": 5000.0},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 300.0}},
                    final_logit_softcapping=3.0, hidden_activation="gelu_pytorch_tanh",
                    tie_word_embeddings=True)),
}
EXPECT = {  # options each family must turn on in the loaded config
    "qwen3": dict(qk_norm=True, head_dim=24, qkv_bias=False, o_bias=False),
    "qwen3-bias-sliding": dict(qk_norm=True, qkv_bias=True, o_bias=True, sliding_window=WINDOW,
                               layer_types=("full", "sliding", "sliding")),
    "mistral": dict(sliding_window=WINDOW, qk_norm=False, qkv_bias=False),
    "llama-bias": dict(qkv_bias=True, o_bias=True, sliding_window=None),
    "gemma3": dict(norm_plus_one=True, sandwich_norm=True, embed_scale=True, qk_norm=True,
                   mlp_activation="gelu_tanh", query_pre_attn_scalar=20.0, local_rope_theta=300.0,
                   rope_scaling=LinearRopeScaling(2.0), final_logit_softcap=3.0,
                   layer_types=("sliding", "full", "sliding"), sliding_window=WINDOW,
                   tie_embeddings=True),
}
SHORT = {"qwen3": "qwen3", "qwen3-bias-sliding": "qwen3", "mistral": "mistral",
         "llama-bias": "llama", "gemma3": "gemma3"}


def _reference(name: str, seed: int = 0):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  cfg_name, cls_name, extra = FAMILIES[name]
  cfg = getattr(transformers, cfg_name)(**BASE, **extra)
  cfg._attn_implementation = "eager"
  torch.manual_seed(seed)
  model = getattr(transformers, cls_name)(cfg).eval()
  gemma = name.startswith("gemma")
  with torch.no_grad():
    for pname, p in model.named_parameters():
      if pname.endswith("norm.weight"):
        p.copy_((0.0 if gemma else 1.0) + 0.3 * torch.randn_like(p))
      elif pname.endswith("bias"):
        p.copy_(0.3 * torch.randn_like(p))
      else:
        p.copy_(0.15 * torch.randn_like(p))
  model.generation_config.eos_token_id = None
  model.generation_config.pad_token_id = 0
  return model


def _batch(seed: int, side: str, t: int = 16, b: int = 3):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(3, 128, (b, t)).astype(np.int32)
  mask = np.zeros((b, t), bool)
  for i, n in enumerate([t, t - 3, t - 9][:b]):
    mask[i, :n] = side == "right"
    mask[i, t - n:] |= side == "left"
  return tokens, mask


def _close(got, want, mask):
  assert np.abs(want[mask]).std() > 0.3  # logits far from trivial
  np.testing.assert_allclose(got[mask], want[mask], atol=1e-4, rtol=1e-4)


@pytest.mark.oracle
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_matches_transformers(tmp_path, name):
  import torch

  ref = _reference(name)
  ref.save_pretrained(tmp_path / "hf")
  model = hf.load_pretrained(tmp_path / "hf")
  for key, value in EXPECT[name].items():
    got = model.cfg.resolved_head_dim if key == "head_dim" else getattr(model.cfg, key)
    assert got == value, (key, got, value)
  assert model.cfg.num_params() == sum(p.numel() for p in ref.parameters())

  # Logits, right- and left-padded, over sequences that the window cuts.
  for side in ("right", "left"):
    tokens, mask = _batch(1, side)
    _close(np.asarray(forward(model, jnp.asarray(tokens), jnp.asarray(mask))),
           _hf_logits(ref, tokens, mask), mask)

  # Greedy decoding of 24 tokens on a left-padded batch: the sampler's KV-cache path (prefill,
  # then one token per step through the window) picks generate's tokens.
  tokens, mask = _batch(2, "left", t=10, b=2)
  n = 24
  cfg = sampling.SamplingConfig(max_new_tokens=n, temperature=0.0, stop_tokens=(), pad_id=0)
  import flax.nnx as nnx
  graphdef, params = nnx.split(model)
  ours = sampling.sample(graphdef, params, jnp.asarray(tokens), jnp.asarray(mask),
                         jax.random.key(0), cfg=cfg)
  with torch.no_grad():
    theirs = ref.generate(input_ids=torch.from_numpy(tokens.astype(np.int64)),
                          attention_mask=torch.from_numpy(mask.astype(np.int64)),
                          max_new_tokens=n, min_new_tokens=n, do_sample=False)
  np.testing.assert_array_equal(np.asarray(ours.tokens), theirs[:, tokens.shape[1]:].numpy())
  # The trainer's uncached scoring of those completions equals the sampler's log-probs.
  logp = completion_logprobs(model, jnp.asarray(tokens), jnp.asarray(mask), ours.tokens,
                             ours.mask)
  np.testing.assert_allclose(np.asarray(logp), np.asarray(ours.policy_logprobs), atol=2e-4)

  # Export (architecture inferred from the config) reloads in transformers as the same class.
  hf.save_pretrained(model, tmp_path / "export")
  written = json.loads((tmp_path / "export" / hf.CONFIG_NAME).read_text())
  assert written["architectures"] == [FAMILIES[name][1]]
  back = _reload(tmp_path / "export")
  assert type(back) is type(ref)
  tokens, mask = _batch(3, "left", t=20)
  want = np.asarray(forward(model, jnp.asarray(tokens), jnp.asarray(mask)))
  _close(_hf_logits(back, tokens, mask), want, mask)
  assert hf.load_pretrained(tmp_path / "export").cfg == model.cfg


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_config_roundtrip_without_torch(name):
  """config_from_hf(config_to_hf(cfg)) == cfg for each family's options (no transformers)."""
  cfg = TransformerConfig(vocab_size=128, hidden_size=64, num_layers=3, num_heads=4,
                          num_kv_heads=2, intermediate_size=96, max_seq_len=256,
                          rms_norm_eps=1e-5, **{k: v for k, v in EXPECT[name].items()
                                                if k != "head_dim"},
                          **({"head_dim": 24} if "head_dim" in EXPECT[name] else {}))
  arch = hf.architecture_for(cfg)
  assert arch == SHORT[name]
  assert hf.config_from_hf(hf.config_to_hf(cfg)) == cfg


def test_window_cuts_and_remat_agrees():
  """A sliding layer's output differs from full attention's beyond the window (so the window
  acts), and the remat scan over mixed layer types equals the layer loop."""
  base = TransformerConfig(vocab_size=64, hidden_size=32, num_layers=3, num_heads=2,
                           num_kv_heads=1, intermediate_size=48, max_seq_len=64,
                           sliding_window=4, layer_types=("sliding", "full", "sliding"),
                           local_rope_theta=100.0, qk_norm=True)
  model = init_model(base, seed=1)
  tokens, mask = _batch(4, "left", t=12)
  tokens = jnp.asarray(tokens % 64)
  mask = jnp.asarray(mask)
  got = forward(model, tokens, mask)
  full = init_model(base.replace(sliding_window=None, layer_types=None, local_rope_theta=None),
                    seed=1)
  plain = forward(full, tokens, mask)
  m = np.asarray(mask)
  assert np.abs(np.asarray(got - plain))[m].max() > 1e-3  # the window and local RoPE act

  from rlpost.models import attention
  looped, _ = model.hidden(tokens, attention.padded(mask))
  scanned, _ = model.hidden(tokens, attention.padded(mask), remat=True)
  np.testing.assert_allclose(np.asarray(scanned), np.asarray(looped), atol=1e-5)


@pytest.mark.parametrize("bad,match", [
    (dict(architectures=["Gemma3ForConditionalGeneration"]), "text model"),
    (dict(architectures=["Gemma3ForCausalLM"], hidden_activation="gelu"), "hidden_activation"),
    (dict(architectures=["Gemma3ForCausalLM"], sliding_window=None), "sliding_window"),
    (dict(architectures=["Gemma3ForCausalLM"], use_bidirectional_attention=True),
     "use_bidirectional_attention"),
    (dict(architectures=["MistralForCausalLM"], sliding_window=0), "sliding_window"),
    (dict(architectures=["Qwen3ForCausalLM"], layer_types=["full_attention"]), "layer_types"),
])
def test_bad_family_configs_name_the_key(bad, match):
  cfg = dict(BASE, hidden_act="silu", hidden_activation="gelu_pytorch_tanh")
  cfg.update(bad)
  with pytest.raises(ValueError, match=match):
    hf.config_from_hf(cfg)


def test_config_to_hf_refuses_what_the_architecture_cannot_express():
  cfg = TransformerConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2,
                          num_kv_heads=1, intermediate_size=48, qk_norm=True)
  with pytest.raises(ValueError, match="qk_norm"):
    hf.config_to_hf(cfg, "llama")
  with pytest.raises(ValueError, match="sliding_window"):
    hf.config_to_hf(cfg.replace(qk_norm=False, sliding_window=8), "llama")
  with pytest.raises(ValueError, match="norm_plus_one"):
    hf.config_to_hf(cfg, "gemma3")
