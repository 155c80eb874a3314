"""Tests for rlpost.models.hf: config mapping, safetensors import/export, tokenizer loading.

Tests marked ``oracle`` compare against transformers (torch, CPU, float32) on tiny random
Qwen2 / Llama models whose every parameter, norms and biases included, is re-randomised so that
a wrong mapping cannot pass by coincidence.
"""

import json

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

from safetensors.numpy import load_file, save_file  # noqa: E402

from rlpost.models import hf  # noqa: E402
from rlpost.models.scoring import forward  # noqa: E402
from rlpost.models.transformer import (Llama3RopeScaling, TransformerConfig,  # noqa: E402
                                       init_model, rope_inv_freq)

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-5, rope_theta=5000.0)
LLAMA3_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64)


def tiny_config(**kw) -> TransformerConfig:
  base = dict(vocab_size=128, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
              intermediate_size=96, max_seq_len=256, rms_norm_eps=1e-5, rope_theta=5000.0)
  return TransformerConfig(**{**base, **kw})


def randomize(model: nnx.Module, seed: int) -> nnx.Module:
  """Redraw all parameters: weights N(0, .15^2), norm scales 1 + N(0, .3^2), biases N(0, .3^2)."""
  rng = np.random.default_rng(seed)
  state = nnx.state(model, nnx.Param)
  flat = []
  for path, var in nnx.to_flat_state(state):
    shape, dtype = var[...].shape, var[...].dtype
    noise = rng.standard_normal(shape).astype(np.float32)
    std = {"scale": 0.3, "bias": 0.3}.get(path[-1], 0.15)
    value = 1 + std * noise if path[-1] == "scale" else std * noise
    flat.append((path, var.replace(jnp.asarray(value, dtype))))
  nnx.update(model, nnx.from_flat_state(flat))
  return model


def padded_batch(seed: int, side: str, vocab: int = 128, b: int = 3, t: int = 12):
  """Random tokens [B, T] int32 and a mask [B, T] bool with rows of lengths T, T-3, T-7."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab, (b, t)).astype(np.int32)
  lengths = [t, t - 3, t - 7][:b]
  mask = np.zeros((b, t), bool)
  for i, n in enumerate(lengths):
    if side == "right":
      mask[i, :n] = True
    else:
      mask[i, t - n:] = True
  return tokens, mask


# ---------------------------------------------------------------------------------------------
# config.json
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch,kw", [
    ("qwen2", dict(qkv_bias=True)),
    ("qwen2", dict(qkv_bias=True, tie_embeddings=True)),
    ("llama", dict()),
    ("llama", dict(head_dim=32, rope_scaling=Llama3RopeScaling(8.0, 1.0, 4.0, 64))),
])
def test_config_roundtrip(arch, kw):
  cfg = tiny_config(**kw)
  hf_cfg = hf.config_to_hf(cfg, arch)
  assert hf_cfg["architectures"] == [hf.ARCHITECTURES[arch]]
  assert hf.config_from_hf(json.loads(json.dumps(hf_cfg))) == cfg


def test_config_from_hf_layouts():
  v4 = dict(TINY, architectures=["LlamaForCausalLM"], rope_scaling=LLAMA3_ROPE,
            tie_word_embeddings=True, head_dim=16)
  v5 = dict(TINY, architectures=["LlamaForCausalLM"], tie_word_embeddings=True,
            rope_parameters=dict(LLAMA3_ROPE, rope_theta=5000.0))
  del v5["rope_theta"]
  c4, c5 = hf.config_from_hf(v4), hf.config_from_hf(v5)
  assert c4 == c5
  assert c4.rope_theta == 5000.0 and c4.tie_embeddings and not c4.qkv_bias
  assert c4.head_dim is None and c4.max_seq_len == 256
  assert c4.rope_scaling == Llama3RopeScaling(8.0, 1.0, 4.0, 64)
  qwen = hf.config_from_hf(dict(TINY, model_type="qwen2", use_sliding_window=False,
                                sliding_window=32, max_window_layers=0,
                                rope_parameters={"rope_type": "default", "rope_theta": 7.0}),
                           dtype="bfloat16")
  assert qwen.qkv_bias and not qwen.tie_embeddings and qwen.rope_theta == 7.0
  assert qwen.rope_scaling is None and qwen.dtype == qwen.param_dtype == "bfloat16"


@pytest.mark.parametrize("update,key", [
    (dict(architectures=["PhiForCausalLM"]), "architectures"),
    (dict(architectures=None, model_type="gemma"), "model_type"),
    (dict(rope_scaling=dict(rope_type="yarn", factor=4.0)), "rope_scaling"),
    (dict(rope_parameters=dict(rope_type="dynamic", factor=2.0, rope_theta=1e4)),
     "rope_parameters"),
    (dict(rope_parameters=dict(rope_type="linear", rope_theta=1e4)), "rope_parameters"),
    (dict(use_sliding_window=True, sliding_window=-3, max_window_layers=1), "sliding_window"),
    (dict(layer_types=["full_attention", "chunked_attention"]), "layer_types"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(mlp_bias=True), "mlp_bias"),
    (dict(hidden_size=None), "hidden_size"),
])
def test_config_from_hf_rejects(update, key):
  cfg = dict(TINY, architectures=["Qwen2ForCausalLM"])
  cfg.update(update)
  with pytest.raises(ValueError, match=key):
    hf.config_from_hf(cfg)


def test_qwen2_sliding_window_as_transformers_reads_it():
  base = dict(TINY, architectures=["Qwen2ForCausalLM"])
  for update in (dict(use_sliding_window=False, sliding_window=32, max_window_layers=0),
                 dict(use_sliding_window=True, sliding_window=32, max_window_layers=2)):
    cfg = hf.config_from_hf(dict(base, **update))
    assert cfg.sliding_window is None and not any(cfg.sliding_layers)
  cfg = hf.config_from_hf(dict(base, use_sliding_window=True, sliding_window=32,
                               max_window_layers=1))
  assert cfg.sliding_window == 32 and cfg.sliding_layers == (False, True) and cfg.windowed
  cfg = hf.config_from_hf(dict(base, use_sliding_window=True, sliding_window=4096,
                               max_window_layers=0))
  assert not cfg.windowed  # a window longer than max_position_embeddings never cuts
  llama = hf.config_from_hf(dict(TINY, architectures=["LlamaForCausalLM"], attention_bias=True))
  assert llama.qkv_bias and llama.o_bias


def test_config_to_hf_rejects_inexpressible():
  with pytest.raises(ValueError, match="qkv_bias"):
    hf.config_to_hf(tiny_config(qkv_bias=False), "qwen2")
  with pytest.raises(ValueError, match="qkv_bias"):
    hf.config_to_hf(tiny_config(qkv_bias=True), "llama")
  with pytest.raises(ValueError, match="gpt2"):
    hf.config_to_hf(tiny_config(), "gpt2")


def test_llama3_rope_scaling():
  scaling = Llama3RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                              original_max_position_embeddings=64)
  base = 1.0 / 5000.0 ** (np.arange(0, 16, 2) / 16)
  wavelen = 2 * np.pi / base
  smooth = (64 / wavelen - 1.0) / (4.0 - 1.0)
  want = np.where(wavelen < 16, base,
                  np.where(wavelen > 64, base / 8, (1 - smooth) * base / 8 + smooth * base))
  assert (wavelen < 16).any() and (wavelen > 64).any() and ((wavelen >= 16) & (wavelen <= 64)).any()
  np.testing.assert_allclose(rope_inv_freq(16, 5000.0, scaling), want, rtol=1e-6)
  cfg = tiny_config()
  plain = randomize(init_model(cfg), 0)
  scaled = randomize(init_model(cfg.replace(rope_scaling=scaling)), 0)
  tokens, mask = padded_batch(0, "right", t=40)
  a = forward(plain, jnp.asarray(tokens), jnp.asarray(mask))
  b = forward(scaled, jnp.asarray(tokens), jnp.asarray(mask))
  assert np.abs(np.asarray(a - b)).max() > 1e-2  # the model uses the scaling


# ---------------------------------------------------------------------------------------------
# Safetensors round trip within rlpost, and bad checkpoints
# ---------------------------------------------------------------------------------------------

def _params(model):
  return {p: np.asarray(v[...]) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


@pytest.mark.parametrize("tie,shard", [(False, None), (True, 20_000)])
def test_save_load_roundtrip(tmp_path, tie, shard):
  model = randomize(init_model(tiny_config(qkv_bias=True, tie_embeddings=tie)), 0)
  out = hf.save_pretrained(model, tmp_path / "ckpt", architecture="qwen2",
                           max_shard_bytes=shard, extra_config={"eos_token_id": 3})
  names = sorted(p.name for p in out.iterdir())
  if shard:
    index = json.loads((out / hf.SAFE_WEIGHTS_INDEX_NAME).read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and names == sorted([hf.CONFIG_NAME, hf.SAFE_WEIGHTS_INDEX_NAME,
                                                *shards])
  else:
    assert names == [hf.CONFIG_NAME, hf.SAFE_WEIGHTS_NAME]
    assert ("lm_head.weight" in load_file(out / hf.SAFE_WEIGHTS_NAME)) == (not tie)
  assert json.loads((out / hf.CONFIG_NAME).read_text())["eos_token_id"] == 3
  loaded = hf.load_pretrained(out)
  assert loaded.cfg == model.cfg
  want, got = _params(model), _params(loaded)
  assert want.keys() == got.keys()
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=str(k))
  assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_dtypes(tmp_path):
  model = randomize(init_model(tiny_config(qkv_bias=True, param_dtype="bfloat16",
                                           dtype="bfloat16")), 1)
  out = hf.save_pretrained(model, tmp_path / "ckpt")
  assert json.loads((out / hf.CONFIG_NAME).read_text())["torch_dtype"] == "bfloat16"
  assert load_file(out / hf.SAFE_WEIGHTS_NAME)["model.norm.weight"].dtype == ml_dtypes.bfloat16
  f32 = hf.load_pretrained(out)
  assert f32.cfg.param_dtype == "float32"
  assert f32.embed.embedding[...].dtype == jnp.float32
  np.testing.assert_array_equal(f32.embed.embedding[...],
                                model.embed.embedding[...].astype(jnp.float32))
  mixed = hf.load_pretrained(out, dtype="bfloat16", param_dtype="float32")
  assert mixed.cfg.dtype == "bfloat16" and mixed.cfg.param_dtype == "float32"


@pytest.fixture
def checkpoint(tmp_path):
  model = init_model(tiny_config(qkv_bias=True))
  return hf.save_pretrained(model, tmp_path / "ckpt")


def _rewrite(path, fn):
  file = path / hf.SAFE_WEIGHTS_NAME
  tensors = load_file(file)
  fn(tensors)
  save_file(tensors, str(file), metadata={"format": "pt"})
  return file


def test_shape_mismatch(checkpoint):
  name = "model.layers.1.self_attn.k_proj.weight"
  file = _rewrite(checkpoint, lambda t: t.update({name: np.zeros((16, 64), np.float32)}))
  with pytest.raises(ValueError) as e:
    hf.load_pretrained(checkpoint)
  msg = str(e.value)
  assert name in msg and "(16, 64)" in msg and "(32, 64)" in msg and str(file) in msg


def test_missing_tensor(checkpoint):
  _rewrite(checkpoint, lambda t: t.pop("model.layers.0.mlp.up_proj.weight"))
  with pytest.raises(ValueError, match=r"missing .*model\.layers\.0\.mlp\.up_proj\.weight"):
    hf.load_pretrained(checkpoint)


def test_unexpected_tensors(checkpoint):
  _rewrite(checkpoint, lambda t: t.update({
      "model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(8, np.float32)}))
  hf.load_pretrained(checkpoint)
  _rewrite(checkpoint, lambda t: t.update({"model.layers.7.mlp.gate_proj.weight":
                                           np.ones((96, 64), np.float32)}))
  with pytest.raises(ValueError, match=r"unexpected .*model\.layers\.7\.mlp\.gate_proj"):
    hf.load_pretrained(checkpoint)


def test_unsupported_architecture_file(checkpoint):
  cfg = json.loads((checkpoint / hf.CONFIG_NAME).read_text())
  cfg["architectures"] = ["GPT2LMHeadModel"]
  (checkpoint / hf.CONFIG_NAME).write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match="GPT2LMHeadModel"):
    hf.load_pretrained(checkpoint)


@pytest.mark.parametrize("shard", [False, True])
def test_truncated_safetensors_names_the_file(tmp_path, shard):
  """A cut-off download: safetensors' own error names no file; ours does."""
  model = init_model(tiny_config(qkv_bias=True))
  out = hf.save_pretrained(model, tmp_path / "ckpt", max_shard_bytes=20_000 if shard else None)
  files = sorted(out.glob("*.safetensors"), key=lambda p: p.stat().st_size)
  assert len(files) > 1 if shard else files == [out / hf.SAFE_WEIGHTS_NAME]
  target = files[-1]
  data = target.read_bytes()
  target.write_bytes(data[:len(data) - 100])
  with pytest.raises(ValueError, match="not a readable safetensors file") as e:
    hf.load_pretrained(out)
  assert str(target) in str(e.value)


def test_missing_files(tmp_path, checkpoint):
  with pytest.raises(FileNotFoundError, match="config.json"):
    hf.load_pretrained(tmp_path)
  (checkpoint / hf.SAFE_WEIGHTS_NAME).unlink()
  with pytest.raises(FileNotFoundError, match="model.safetensors"):
    hf.load_pretrained(checkpoint)


def test_save_is_atomic(tmp_path, monkeypatch):
  model = init_model(tiny_config(qkv_bias=True))
  target = tmp_path / "ckpt"
  hf.save_pretrained(model, target)
  before = sorted((p.name, p.stat().st_size) for p in target.iterdir())

  import safetensors.numpy

  def crash(*args, **kwargs):
    raise KeyboardInterrupt

  monkeypatch.setattr(safetensors.numpy, "save_file", crash)
  with pytest.raises(FileExistsError):
    hf.save_pretrained(model, target)
  with pytest.raises(KeyboardInterrupt):
    hf.save_pretrained(model, target, overwrite=True)
  with pytest.raises(KeyboardInterrupt):
    hf.save_pretrained(model, tmp_path / "new", max_shard_bytes=1000)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
  assert sorted((p.name, p.stat().st_size) for p in target.iterdir()) == before
  monkeypatch.undo()
  hf.save_pretrained(randomize(model, 3), target, overwrite=True)
  np.testing.assert_array_equal(hf.load_pretrained(target).embed.embedding[...],
                                model.embed.embedding[...])
  assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


# ---------------------------------------------------------------------------------------------
# Parity with transformers
# ---------------------------------------------------------------------------------------------

def _hf_model(arch: str, tie: bool, seed: int, **extra):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  cls, cfg_cls = {"qwen2": (transformers.Qwen2ForCausalLM, transformers.Qwen2Config),
                  "llama": (transformers.LlamaForCausalLM, transformers.LlamaConfig)}[arch]
  cfg = cfg_cls(**{**TINY, **extra}, tie_word_embeddings=tie)
  cfg._attn_implementation = "eager"
  torch.manual_seed(seed)
  model = cls(cfg).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1 + 0.3 * torch.randn_like(p))
      elif name.endswith("bias"):
        p.copy_(0.3 * torch.randn_like(p))
      else:
        p.copy_(0.15 * torch.randn_like(p))
  if tie:
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
  return model


def _hf_reload(path):
  """AutoModelForCausalLM.from_pretrained(path), asserting every weight came from the files."""
  transformers = pytest.importorskip("transformers")
  model, info = transformers.AutoModelForCausalLM.from_pretrained(
      path, attn_implementation="eager", output_loading_info=True)
  assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys",
                                       "error_msgs")), info
  return model.eval()


def _hf_logits(model, tokens, mask):
  import torch
  positions = np.maximum(np.cumsum(mask, axis=-1) - 1, 0)
  with torch.no_grad():
    out = model(input_ids=torch.from_numpy(tokens.astype(np.int64)),
                attention_mask=torch.from_numpy(mask.astype(np.int64)),
                position_ids=torch.from_numpy(positions.astype(np.int64)))
  return out.logits.float().numpy()


def _assert_logits_close(got, want, mask):
  assert np.abs(want[mask]).std() > 0.5  # logits are far from trivial
  np.testing.assert_allclose(got[mask], want[mask], atol=1e-4, rtol=1e-4)


@pytest.mark.oracle
@pytest.mark.parametrize("arch,tie", [("qwen2", False), ("qwen2", True), ("llama", False),
                                      ("llama", True)])
def test_transformers_parity_and_export(tmp_path, arch, tie):
  ref = _hf_model(arch, tie, seed=0)
  ref.save_pretrained(tmp_path / "hf")
  model = hf.load_pretrained(tmp_path / "hf")
  assert model.cfg.qkv_bias == (arch == "qwen2") and model.cfg.tie_embeddings == tie
  for side in ("right", "left"):
    tokens, mask = padded_batch(1, side)
    want = _hf_logits(ref, tokens, mask)
    got = np.asarray(forward(model, jnp.asarray(tokens), jnp.asarray(mask)))
    _assert_logits_close(got, want, mask)

  hf.save_pretrained(model, tmp_path / "export", architecture=arch,
                     max_shard_bytes=None if tie else 30_000)
  if not tie:
    assert (tmp_path / "export" / hf.SAFE_WEIGHTS_INDEX_NAME).exists()
  back = _hf_reload(tmp_path / "export")
  assert type(back) is type(ref)
  tokens, mask = padded_batch(2, "left")
  want = np.asarray(forward(model, jnp.asarray(tokens), jnp.asarray(mask)))
  _assert_logits_close(_hf_logits(back, tokens, mask), want, mask)
  _assert_logits_close(_hf_logits(ref, tokens, mask), want, mask)


@pytest.mark.oracle
def test_transformers_parity_llama3_rope(tmp_path):
  ref = _hf_model("llama", False, seed=1, head_dim=32,
                  rope_scaling=dict(LLAMA3_ROPE))
  ref.save_pretrained(tmp_path / "hf")
  model = hf.load_pretrained(tmp_path / "hf")
  assert model.cfg.rope_scaling == Llama3RopeScaling(8.0, 1.0, 4.0, 64)
  assert model.cfg.resolved_head_dim == 32
  tokens, mask = padded_batch(3, "left", t=40)
  want = _hf_logits(ref, tokens, mask)
  got = np.asarray(forward(model, jnp.asarray(tokens), jnp.asarray(mask)))
  _assert_logits_close(got, want, mask)
  hf.save_pretrained(model, tmp_path / "export", architecture="llama")
  _assert_logits_close(_hf_logits(_hf_reload(tmp_path / "export"), tokens, mask), got, mask)
  cfg = json.loads((tmp_path / "hf" / hf.CONFIG_NAME).read_text())
  cfg.pop("rope_scaling", None)
  cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": TINY["rope_theta"]}
  (tmp_path / "hf" / hf.CONFIG_NAME).write_text(json.dumps(cfg))
  unscaled = hf.load_pretrained(tmp_path / "hf")
  assert unscaled.cfg.rope_scaling is None
  plain = np.asarray(forward(unscaled, jnp.asarray(tokens), jnp.asarray(mask)))
  assert np.abs(plain[mask] - want[mask]).max() > 1e-2  # the scaling matters at this size


@pytest.mark.oracle
def test_transformers_sharded_checkpoint(tmp_path):
  ref = _hf_model("qwen2", False, seed=2)
  ref.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
  ref.save_pretrained(tmp_path / "single")
  assert (tmp_path / "sharded" / hf.SAFE_WEIGHTS_INDEX_NAME).exists()
  assert not (tmp_path / "sharded" / hf.SAFE_WEIGHTS_NAME).exists()
  a = _params(hf.load_pretrained(tmp_path / "sharded"))
  b = _params(hf.load_pretrained(tmp_path / "single"))
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=str(k))


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------

def _write_tokenizer(folder):
  import tokenizers
  from tokenizers import models, pre_tokenizers, trainers

  tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<pad>", "<eos>",
                                                                "<|im_end|>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(["the cat sat on the mat", "a dog ate the hat", "1 + 2 = 3"],
                          trainer)
  folder.mkdir(parents=True, exist_ok=True)
  tok.save(str(folder / "tokenizer.json"))
  return tok


def test_tokenizer(tmp_path):
  ref = _write_tokenizer(tmp_path)
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(
      {"eos_token": {"content": "<|im_end|>"}, "pad_token": "<pad>"}))
  (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 3]}))
  tok = hf.load_tokenizer(tmp_path)
  assert tok.eos_ids == (2, 3) and tok.pad_id == 1 and tok.bos_id is None
  assert tok.vocab_size == ref.get_vocab_size()
  texts = ["the cat sat", "a dog ate the hat on the mat", "1 + 2 = 3 ünïcode"]
  ids = tok.encode_batch(texts)
  assert ids[0] == tok.encode(texts[0]) == ref.encode(texts[0]).ids
  assert tok.decode_batch(ids) == texts and tok.decode(np.asarray(ids[1])) == texts[1]
  for side in ("left", "right"):
    tokens, mask = tok.encode_padded(texts, side=side, length=40)
    assert tokens.shape == mask.shape == (3, 40) and tokens.dtype == np.int32
    assert (tokens[~mask] == tok.pad_id).all()
    assert [list(row[m]) for row, m in zip(tokens, mask)] == ids
    assert mask[:, -1 if side == "left" else 0].all()
  with pytest.raises(ValueError, match="does not fit"):
    tok.pad(ids, length=3)


def test_tokenizer_fallbacks_and_errors(tmp_path):
  _write_tokenizer(tmp_path)
  (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 2, "bos_token_id": 0}))
  tok = hf.load_tokenizer(tmp_path / "tokenizer.json")
  assert tok.eos_ids == (2,) and tok.pad_id == 2 and tok.bos_id == 0
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({"pad_token": "<nope>"}))
  with pytest.raises(ValueError, match="<nope>"):
    hf.load_tokenizer(tmp_path)
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    hf.load_tokenizer(tmp_path / "empty")
