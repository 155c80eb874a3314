"""LoRA in the trainer: only adapters move, the optimizer holds only theirs, runs resume exactly,
exports merge, averages are of the merged weights, bad keys fail naming the key.

The policy is the learning fixture (``rl_testutil``: SFT warm-started, mixed groups), so every
step has a non-zero gradient; each test asserts that before comparing.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

from rl_testutil import assert_moved, learning_config, learning_trainer  # noqa: E402

from rlpost import averaging  # noqa: E402
from rlpost.models import hf, lora  # noqa: E402
from rlpost.models import transformer as tfm  # noqa: E402
from rlpost.models import scoring  # noqa: E402
from rlpost.train import config as config_lib  # noqa: E402
from rlpost.train import loop, rl  # noqa: E402
from scripts import average as average_script  # noqa: E402
from scripts import export as export_script  # noqa: E402
from scripts import train as train_script  # noqa: E402

LORA = dict(lora_rank=4, lr=0.01)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("lora")
  return dict(data_dir=str(root / "data"), cache_dir=str(root / "cache"))


def _split(params):
  return lora.partition(params, lora.trainable_mask(params))


def _leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.mark.parametrize("key, value, match", [
    ("lora_rank", -1, r"config key 'lora_rank': must be >= 0"),
    ("lora_alpha", 0.0, r"config key 'lora_alpha': must be a finite number > 0"),
    ("lora_targets", "q_proj,qkv", r"config key 'lora_targets': unknown LoRA target\(s\) "
                                   r"\['qkv'\]"),
    ("lora_targets", " , ", r"config key 'lora_targets': .*at least one projection"),
])
def test_bad_lora_config_names_the_key(dirs, key, value, match):
  with pytest.raises(ValueError, match=match):
    config_lib.from_dict(rl.RLConfig, learning_config(dirs, **{key: value}))


def test_lora_step_trains_only_the_adapters_from_the_base_model(dirs):
  tr = learning_trainer(dirs, **LORA, remat=True, grad_accum=2, recipe_args={"kl_coef": 0.04})
  s0 = tr.init_state()
  # The reference policy is the base model: every B is zero, so merging changes no kernel.
  train0, frozen0 = _split(s0.params)
  assert all(not np.any(x) for p, x in jax.tree_util.tree_leaves_with_path(train0)
             if "lora_b" in jax.tree_util.keystr(p))
  for x, y in zip(_leaves(lora.merge_params(tr.ref_params, scale=tr.lora.scale)),
                  _leaves(frozen0)):
    np.testing.assert_array_equal(x, y)
  # The optimizer holds state for the adapters only: AdamW's two moments of each, and a count.
  adapter_shapes = sorted(x.shape for x in jax.tree.leaves(train0))
  opt = jax.tree.leaves(s0.opt_state)
  assert sorted(x.shape for x in opt if x.ndim) == sorted(adapter_shapes * 2)
  assert sum(x.size for x in opt) == 2 * sum(x.size for x in jax.tree.leaves(train0)) + 1

  s1, m1 = tr.step(s0)
  s2, m2 = tr.step(s1)
  for m, what in ((m1, "step 1"), (m2, "step 2")):
    assert_moved(jax.device_get(m), what)
  train2, frozen2 = _split(s2.params)
  for x, y in zip(_leaves(frozen0), _leaves(frozen2)):  # the base: bitwise unchanged
    np.testing.assert_array_equal(x, y)
  moved = [float(np.max(np.abs(x - y))) for x, y in zip(_leaves(train0), _leaves(train2))]
  assert min(moved) > 0, moved  # every A and B moved (A from step 2, once B is non-zero)
  assert float(m2["kl"]) > 0  # the policy left the reference (the base model)
  assert tr.num_traces == 1


@pytest.fixture(scope="module")
def lora_run(dirs, tmp_path_factory):
  """scripts/train.py with lora_rank=4 (4 steps, a checkpoint at each, an in-run EMA of the
  merged weights), and the same run interrupted after 2 steps and resumed."""
  root = tmp_path_factory.mktemp("lora_run")
  cfg_file = root / "config.json"
  cfg_file.write_text(json.dumps(learning_config(
      dirs, **LORA, checkpoint_every=1, keep_checkpoints=4, averaging="ema:decay=0.5")))

  def train(run_dir, steps):
    return train_script.main([str(cfg_file), f"run_dir={run_dir}", f"steps={steps}",
                              "--no-progress"])

  full = train(root / "full", 4)
  train(root / "resumed", 2)
  resumed = train(root / "resumed", 4)
  return dict(root=root, full=full, resumed=resumed)


def test_lora_run_resumes_exactly(lora_run):
  full, resumed = lora_run["full"], lora_run["resumed"]
  assert resumed["resumed_from"] == 2
  entries = [loop.read_metrics(str(lora_run["root"] / d / "metrics.jsonl"))
             for d in ("full", "resumed")]
  last = [r for r in entries[0] if "train/grad_norm" in r][-1]
  assert last["step"] == 4
  assert_moved({k[len("train/"):]: v for k, v in last.items() if k.startswith("train/")}, "step 4")
  strip = lambda rs: [{k: v for k, v in r.items() if "seconds" not in k} for r in rs]  # noqa
  assert strip(entries[0]) == strip(entries[1])
  for x, y in zip(_leaves(full["state"]), _leaves(resumed["state"])):
    np.testing.assert_array_equal(x, y)
  # The in-run average is of the merged weights: its adapters are kept at B = 0.
  avg = next(iter(full["averages"].values()))
  assert all(not np.any(x) for p, x in jax.tree_util.tree_leaves_with_path(avg)
             if "lora_b" in jax.tree_util.keystr(p))


def test_merged_export_reloads_with_the_adapted_models_logits(lora_run, tmp_path):
  run_dir = lora_run["root"] / "full"
  out = export_script.main([str(run_dir), "--out", str(tmp_path / "hf"), "--no-progress"])
  info = json.loads((out / "export.json").read_text())
  assert info["lora"]["rank"] == 4 and info["lora"]["merged"]
  exported = hf.load_pretrained(out)
  cfg = config_lib.from_dict(rl.RLConfig, json.loads((run_dir / "config.json").read_text()))
  tr = rl.Trainer(cfg, log=lambda s: None, progress=False)
  adapted = nnx.merge(tr.graphdef, lora_run["full"]["state"].params)
  tokens = jnp.asarray(np.random.default_rng(0).integers(3, 20, (2, 12)), jnp.int32)
  mask = jnp.ones_like(tokens, bool)
  want = np.asarray(scoring.forward(adapted, tokens, mask))
  base = np.asarray(scoring.forward(tr.reference_model(), tokens, mask))
  assert np.max(np.abs(want - base)) > 1e-3  # precondition: the adapters changed the model
  np.testing.assert_allclose(np.asarray(scoring.forward(exported, tokens, mask)), want, atol=1e-5)


def test_averages_of_lora_checkpoints_are_of_the_merged_weights(lora_run, tmp_path):
  run_dir = lora_run["root"] / "full"
  ckpts = str(run_dir / "checkpoints")
  out = export_script.main([str(run_dir), "--out", str(tmp_path / "avg"), "--average", "lawa:k=2",
                            "--no-progress"])
  got = nnx.state(hf.load_pretrained(out))
  like = lora_run["full"]["state"].params
  scale = 16.0 / 4
  with averaging.CheckpointSource(ckpts, keys="auto") as src:
    steps = src.steps[-2:]
    states = [jax.tree.unflatten(jax.tree.structure(like), [src.load(s)[k] for k in src.keys])
              for s in steps]
  merged = [lora.merge_params(s, scale=scale) for s in states]
  want = jax.tree.map(lambda a, b: (a + b) / 2, *merged)
  for x, y in zip(_leaves(got), _leaves(want)):
    np.testing.assert_allclose(x, y, atol=1e-6)
  # Averaging the factors instead would give other weights (the product is bilinear).
  factors = lora.merge_params(jax.tree.map(lambda a, b: (a + b) / 2, *states), scale=scale)
  gap = max(float(np.max(np.abs(x - y))) for x, y in zip(_leaves(factors), _leaves(want)))
  assert gap > 1e-6, gap
  # The generic averaging script refuses LoRA checkpoints, pointing to the merged average.
  with pytest.raises(ValueError, match=r"lora_rank=4.*bilinear.*scripts/export.py"):
    average_script.main(["--ckpt-dir", ckpts, "--method", "lawa", "--k", "2", "--no-progress"])


def test_hugging_face_policy_with_lora_trains_and_exports_merged(tmp_path):
  """A random Qwen2 checkpoint (untied LM head, adapted too): an entropy bonus gives every step
  a gradient whatever the rewards; the merged export reloads with the adapted logits."""
  import hf_policy_testutil as hpt

  from rlpost.tasks import math_data

  policy = hpt.write_policy(tmp_path / "tiny-qwen2", texts=[math_data.QWEN_MATH_TEMPLATE],
                            tie_embeddings=False)
  data = hpt.write_math_data(tmp_path / "data")
  cfg = dict(task="math", task_spec=data["math"], policy=policy, max_new_tokens=6,
             num_prompts=2, group_size=2, steps=2, eval_every=100, eval_problems=1,
             eval_samples=1, eval_batch=8, lr=0.05, recipe_args={"entropy_coef": 0.1},
             lora_rank=2, lora_targets="q_proj,v_proj,down_proj,lm_head",
             extra_stop_tokens=("<|im_end|>",), data_dir=str(tmp_path / "tfds"),
             cache_dir=str(tmp_path / "cache"))
  tr = rl.make_train(cfg, log=lambda s: None)
  out = loop.run(tr, str(tmp_path / "run"), progress=False)
  s0, s2 = tr.init_state(), out["state"]
  (train0, frozen0), (train2, frozen2) = _split(s0.params), _split(s2.params)
  assert len(jax.tree.leaves(train0)) == 2 * (3 * 2 + 1)
  for x, y in zip(_leaves(frozen0), _leaves(frozen2)):
    np.testing.assert_array_equal(x, y)
  assert min(float(np.max(np.abs(x - y))) for x, y in zip(_leaves(train0), _leaves(train2))) > 0
  assert sum(x.size for x in jax.tree.leaves(s2.opt_state)) == 2 * lora.count(s2.params)[1] + 1
  hf_out = export_script.main([str(tmp_path / "run"), "--out", str(tmp_path / "hf"),
                               "--no-progress"])
  exported = hf.load_pretrained(hf_out)
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 300, (2, 9)), jnp.int32)
  mask = jnp.ones_like(tokens, bool)
  want = np.asarray(scoring.forward(nnx.merge(tr.graphdef, s2.params), tokens, mask))
  base = np.asarray(scoring.forward(tr.reference_model(), tokens, mask))
  assert np.max(np.abs(want - base)) > 1e-4
  np.testing.assert_allclose(np.asarray(scoring.forward(exported, tokens, mask)), want, atol=1e-5)
  # The same targets on a checkpoint whose LM head is tied to the embedding: the key is named.
  tied = hpt.write_policy(tmp_path / "tied", texts=[math_data.QWEN_MATH_TEMPLATE])
  with pytest.raises(ValueError, match=r"config key 'lora_targets': .*\['lm_head'\]"):
    rl.make_train(dict(cfg, policy=tied), log=lambda s: None)


@pytest.mark.oracle
def test_qwen3_lora_from_the_command_line_exports_a_model_transformers_generates_with(tmp_path):
  """The issue's acceptance path: ``scripts/train.py CONFIG policy=DIR lora_rank=8`` on a tiny
  random Qwen3 checkpoint (q/k norms) and a local GSM8K file, then ``scripts/export.py``: the
  merged export loads in transformers as Qwen3ForCausalLM, its logits equal the adapted model's,
  and its greedy ``generate`` picks the tokens rlpost's sampler picks."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  import hf_policy_testutil as hpt

  from rlpost import sampling
  from rlpost.tasks import math_data

  policy = hpt.write_policy(tmp_path / "tiny-qwen3", texts=[math_data.QWEN_MATH_TEMPLATE],
                            architecture="qwen3", tie_embeddings=False)
  assert hf.load_pretrained(policy).cfg.qk_norm
  data = hpt.write_math_data(tmp_path / "data")
  cfg_file = tmp_path / "config.json"
  cfg_file.write_text(json.dumps(dict(
      task="gsm8k", task_spec=data["gsm8k"], max_new_tokens=6, num_prompts=2, group_size=2,
      steps=2, eval_every=100, eval_problems=1, eval_samples=1, eval_batch=8, lr=0.05,
      recipe_args={"entropy_coef": 0.1}, extra_stop_tokens=["<|im_end|>"],
      data_dir=str(tmp_path / "tfds"), cache_dir=str(tmp_path / "cache"))))
  out = train_script.main([str(cfg_file), f"policy={policy}", "lora_rank=8",
                           f"run_dir={tmp_path / 'run'}", "--no-progress"])
  params = out["state"].params
  trained, _ = _split(params)
  assert trained and lora.count(params)[1] > 0
  hf_out = export_script.main([str(tmp_path / "run"), "--out", str(tmp_path / "hf"),
                               "--no-progress"])
  assert json.loads((hf_out / hf.CONFIG_NAME).read_text())["architectures"] == [
      "Qwen3ForCausalLM"]
  theirs = transformers.AutoModelForCausalLM.from_pretrained(
      hf_out, attn_implementation="eager").eval()
  assert type(theirs).__name__ == "Qwen3ForCausalLM"

  base = hf.load_pretrained(policy)
  graphdef, _ = nnx.split(lora.apply(base, lora.LoraConfig(rank=8, alpha=16.0)))
  adapted = nnx.merge(graphdef, params)
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, 300, (2, 9)), jnp.int32)
  mask = jnp.ones_like(tokens, bool)
  want = np.asarray(scoring.forward(adapted, tokens, mask))
  assert np.max(np.abs(want - np.asarray(scoring.forward(base, tokens, mask)))) > 1e-4  # it trained
  with torch.no_grad():
    got = theirs(input_ids=torch.from_numpy(np.asarray(tokens, np.int64))).logits.numpy()
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)

  n = 12
  smp = sampling.sample(graphdef, params, tokens, mask, jax.random.key(0),
                        cfg=sampling.SamplingConfig(max_new_tokens=n, temperature=0.0,
                                                    stop_tokens=(), pad_id=0))
  theirs.generation_config.eos_token_id = None
  with torch.no_grad():
    gen = theirs.generate(torch.from_numpy(np.asarray(tokens, np.int64)), max_new_tokens=n,
                          min_new_tokens=n, do_sample=False, pad_token_id=0)
  np.testing.assert_array_equal(gen[:, tokens.shape[1]:].numpy(), np.asarray(smp.tokens))
