"""scripts/export.py and rlpost.train.export: a run to a Hugging Face directory.

Two tiny runs are trained once per module with the run loop (checkpoints at every step): the
character model on arithmetic (weight decay and a large learning rate make every step move the
parameters, so an average differs from any one checkpoint) and a random Qwen2 policy with its own
BPE tokenizer on MATH-format files (``hf_policy_testutil``). Tests marked ``oracle`` load the
exports in transformers and compare logits (float32, 1e-4) and greedy tokens with rlpost's.
"""

import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

import hf_policy_testutil as hpt  # noqa: E402
from rl_testutil import TINY_MODEL  # noqa: E402

from rlpost import averaging, sampling  # noqa: E402
from rlpost.cli import run_main  # noqa: E402
from rlpost.models import hf  # noqa: E402
from rlpost.models import transformer as tfm  # noqa: E402
from rlpost.models import scoring  # noqa: E402
from rlpost.tasks import base as task_base  # noqa: E402
from rlpost.tasks import math_data  # noqa: E402
from rlpost.tokenizer import CharTokenizer, pad  # noqa: E402
from rlpost.train import loop, rl  # noqa: E402
from scripts import export as export_script  # noqa: E402

PROMPTS = ["12+34=", "7+5=", "99+1="]


def _train(run_dir: str, cfg: dict) -> dict:
  """Run ``cfg`` to its end in ``run_dir``: {"run_dir", "trainer", "state"}."""
  tr = rl.make_train(cfg, log=lambda s: None)
  out = loop.run(tr, run_dir, progress=False)
  return dict(run_dir=run_dir, trainer=tr, state=out["state"])


@pytest.fixture(scope="module")
def char_run(tmp_path_factory):
  root = tmp_path_factory.mktemp("export_char")
  cfg = dict(task_spec=dict(min_digits=1, max_digits=2), num_train=50, num_test=10,
             model=TINY_MODEL, sft_steps=0, num_prompts=2, group_size=2, steps=3, eval_every=100,
             eval_problems=2, eval_samples=1, eval_batch=8, checkpoint_every=1,
             keep_checkpoints=3, lr=0.05, weight_decay=0.5, data_dir=str(root / "data"),
             cache_dir=str(root / "cache"))
  return _train(str(root / "run"), cfg)


def _policy_run(root, **kw) -> dict:
  policy = hpt.write_policy(root / "tiny-qwen2", texts=[math_data.QWEN_MATH_TEMPLATE])
  data = hpt.write_math_data(root / "data")
  cfg = dict(task="math", task_spec=data["math"], policy=policy, sft_steps=0, max_new_tokens=8,
             num_prompts=2, group_size=2, steps=2, eval_every=100, eval_problems=1,
             eval_samples=1, eval_batch=8, checkpoint_every=1, lr=0.05, weight_decay=0.5,
             extra_stop_tokens=("<|im_end|>",), data_dir=str(root / "tfds"),
             cache_dir=str(root / "cache"), **kw)
  return dict(_train(str(root / "run"), cfg), policy=policy)


@pytest.fixture(scope="module")
def policy_run(tmp_path_factory):
  return _policy_run(tmp_path_factory.mktemp("export_policy"))


def export(*argv) -> None:
  """scripts/export.py as the command line runs it; returns on exit status 0."""
  with pytest.raises(SystemExit) as e:
    run_main(export_script.main, [*map(str, argv), "--no-progress"])
  assert e.value.code == 0


def _steps(run: dict) -> list[int]:
  return averaging.list_steps(os.path.join(run["run_dir"], "checkpoints"))


def _library_average(run: dict, plan: averaging.Plan):
  """The average of ``plan``'s checkpoints read through the train-state template."""
  like = run["trainer"].init_state()
  with averaging.CheckpointSource(os.path.join(run["run_dir"], "checkpoints"), like=like,
                                  select=lambda s: s.params) as src:
    return averaging.average(src.load, plan)


def _assert_params_equal(model: tfm.Transformer, params, atol: float = 0.0) -> None:
  for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=atol)


def _hf_logits(model, ids: list[int]) -> np.ndarray:
  import torch

  with torch.no_grad():
    return model(torch.tensor([ids], dtype=torch.long)).logits[0].float().numpy()


def _rlpost_logits(graphdef, params, ids: list[int]) -> np.ndarray:
  tokens = jnp.asarray([ids], jnp.int32)
  model = nnx.merge(graphdef, params)
  return np.asarray(scoring.forward(model, tokens, jnp.ones_like(tokens, bool)))[0]


def _transformers(out):
  transformers = pytest.importorskip("transformers")
  model, info = transformers.AutoModelForCausalLM.from_pretrained(
      out, attn_implementation="eager", output_loading_info=True)
  assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
  return model.eval(), transformers.AutoTokenizer.from_pretrained(out)


# ------------------------------------------------------------------------------ character model
@pytest.mark.oracle
def test_character_run_loads_in_transformers(char_run, tmp_path):
  out = tmp_path / "hf"
  export(char_run["run_dir"], "--out", out)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no staging directory left
  assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
          "special_tokens_map.json", "generation_config.json", "export.json"} <= {
              p.name for p in out.iterdir()}
  config = json.loads((out / "config.json").read_text())
  tok = CharTokenizer()
  assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (
      tok.bos_id, tok.eos_id, tok.pad_id)
  assert config["architectures"] == ["LlamaForCausalLM"]
  info = json.loads((out / "export.json").read_text())
  assert info["plan"]["items"] == [_steps(char_run)[-1]] and info["average"] is None

  model, hf_tok = _transformers(out)
  tr, params = char_run["trainer"], char_run["state"].params
  assert config["max_position_embeddings"] == tr.model_cfg.max_seq_len
  # The task's own prompts and a few sums encode to rlpost's ids, and decode back.
  prompts = PROMPTS + [r["prompt"] for r in tr.records["test"][:3]]
  for text in prompts:
    ids = tok.encode_prompt(text)
    assert hf_tok(text)["input_ids"] == ids, text
    assert hf_tok.decode(ids, skip_special_tokens=True) == text
    want = _rlpost_logits(tr.graphdef, params, ids)
    assert np.abs(want).std() > 0.05  # the logits are far from constant
    np.testing.assert_allclose(_hf_logits(model, ids), want, atol=1e-4, rtol=1e-4)

  # Greedy decoding: transformers' generate and rlpost's sampler (one batch, left-padded) pick
  # the same tokens.
  n = 6
  cfg = sampling.SamplingConfig(max_new_tokens=n, temperature=0.0, stop_tokens=(tok.eos_id,),
                                pad_id=tok.pad_id)
  ids = [tok.encode_prompt(text) for text in PROMPTS]
  tokens, mask = pad(ids, pad_id=tok.pad_id)
  ours = sampling.sample(tr.graphdef, params, jnp.asarray(tokens), jnp.asarray(mask),
                         jax.random.key(0), cfg=cfg)
  import torch

  for row, prompt in enumerate(ids):
    want = np.asarray(ours.tokens[row])[:int(ours.lengths[row])].tolist()
    theirs = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
    assert theirs[0, len(prompt):].tolist() == want, PROMPTS[row]


def test_character_export_weights_are_the_checkpoints(char_run, tmp_path):
  export(char_run["run_dir"], "--out", tmp_path / "latest")
  _assert_params_equal(hf.load_pretrained(tmp_path / "latest"), char_run["state"].params)
  first = _steps(char_run)[0]
  export(char_run["run_dir"], "--out", tmp_path / "first", "--step", first)
  want = _library_average(char_run, averaging.plan_uniform([first]))
  _assert_params_equal(hf.load_pretrained(tmp_path / "first"), want)
  assert hf.load_tokenizer(tmp_path / "first").encode_prompt(PROMPTS[0]) == (
      CharTokenizer().encode_prompt(PROMPTS[0]))


@pytest.mark.parametrize("spec", ["lawa:k=2", "ema:decay=0.5"])
def test_average_is_the_librarys(char_run, tmp_path, spec):
  export(char_run["run_dir"], "--out", tmp_path / "avg", "--average", spec)
  steps = _steps(char_run)
  want = _library_average(char_run, averaging.plan_from_spec(spec, steps))
  got = hf.load_pretrained(tmp_path / "avg")
  _assert_params_equal(got, want, atol=1e-6)
  # The checkpoints differ, so the average is not any one of them.
  latest = jax.tree.leaves(char_run["state"].params)
  gap = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
            for a, b in zip(jax.tree.leaves(nnx.state(got)), latest))
  assert gap > 1e-3, gap
  info = json.loads((tmp_path / "avg" / "export.json").read_text())
  assert info["average"] == spec and len(info["plan"]["items"]) >= 2


def test_overwrite_and_empty_out(char_run, tmp_path):
  out = tmp_path / "out"
  out.mkdir()
  export(char_run["run_dir"], "--out", out)  # an empty directory is fine
  (out / "stale.txt").write_text("x")
  export(char_run["run_dir"], "--out", out, "--overwrite")
  assert not (out / "stale.txt").exists() and (out / "model.safetensors").exists()
  assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


# ------------------------------------------------------------------------------- policy run
@pytest.mark.oracle
def test_policy_run_keeps_tokenizer_and_token_ids(policy_run, tmp_path):
  out = tmp_path / "hf"
  export(policy_run["run_dir"], "--out", out)
  src = policy_run["policy"]
  for name in ("tokenizer.json", "tokenizer_config.json"):
    assert (out / name).read_bytes() == open(os.path.join(src, name), "rb").read(), name
  source_cfg = json.loads(open(os.path.join(src, "config.json")).read())
  config = json.loads((out / "config.json").read_text())
  endoftext = hf.load_tokenizer(src).token_to_id("<|endoftext|>")
  assert config["eos_token_id"] == source_cfg["eos_token_id"] == endoftext
  assert config["bos_token_id"] == source_cfg["bos_token_id"]
  assert config["pad_token_id"] == endoftext  # tokenizer_config.json pad_token
  assert config["architectures"] == ["Qwen2ForCausalLM"] and config["tie_word_embeddings"]
  assert config["max_position_embeddings"] == source_cfg["max_position_embeddings"]

  tr, params = policy_run["trainer"], policy_run["state"].params
  _assert_params_equal(hf.load_pretrained(out), params)
  moved = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
              for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(tr.ref_params)))
  assert moved > 1e-3  # the export holds the trained weights, not the source's

  transformers = pytest.importorskip("transformers")
  model, hf_tok = _transformers(out)
  source_tok = transformers.AutoTokenizer.from_pretrained(src)
  text = task_base.format_prompt(math_data.QWEN_MATH_TEMPLATE, hpt.MATH_TEST[0]["problem"])
  ids = tr.tok.encode_prompt(text)
  assert hf_tok(text)["input_ids"] == source_tok(text)["input_ids"]
  assert (hf_tok.eos_token_id, hf_tok.pad_token_id) == (endoftext, endoftext)
  np.testing.assert_allclose(_hf_logits(model, ids), _rlpost_logits(tr.graphdef, params, ids),
                             atol=1e-4, rtol=1e-4)


def test_stacked_policy_run_exports_its_weights(tmp_path_factory, tmp_path):
  """A run with model={"stacked_layers": true} checkpoints stacked layers; its export holds
  each layer's trained tensors, loadable with the layers stored either way."""
  run = _policy_run(tmp_path_factory.mktemp("export_stacked"), model={"stacked_layers": True})
  tr, params = run["trainer"], run["state"].params
  assert tr.policy.model_cfg.stacked_layers
  assert params["layers"]["attn"]["q_proj"]["kernel"].ndim == 3
  moved = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
              for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(tr.ref_params)))
  assert moved > 1e-3
  out = tmp_path / "hf"
  export(run["run_dir"], "--out", out)
  _assert_params_equal(hf.load_pretrained(out, stacked_layers=True), params)
  stored = tfm.with_layers_stacked(nnx.merge(tr.policy.graphdef, params), False)
  _assert_params_equal(hf.load_pretrained(out), nnx.state(stored))


def test_save_pretrained_keeps_special_ids_and_copies_tokenizer(tmp_path):
  policy = hpt.write_policy(tmp_path / "src")
  model = hf.load_pretrained(policy)
  hf.save_pretrained(model, tmp_path / "a", source=policy)
  src_ids = hf.special_token_ids(policy)
  assert hf.special_token_ids(tmp_path / "a") == src_ids and len(src_ids) == 3
  assert (tmp_path / "a" / "tokenizer.json").exists()
  hf.save_pretrained(model, tmp_path / "b", eos_token_id=[5, 6], pad_token_id=4)
  config = json.loads((tmp_path / "b" / "config.json").read_text())
  assert (config["eos_token_id"], config["pad_token_id"]) == ([5, 6], 4)
  assert "bos_token_id" not in config and not (tmp_path / "b" / "tokenizer.json").exists()


# --------------------------------------------------------------------------------- bad input
def _bad_cases(run_dir: str, tmp) -> dict:
  """name -> (arguments, expected text of the error line)."""
  (tmp / "full").mkdir()
  (tmp / "full" / "keep.txt").write_text("x")
  (tmp / "not_a_run").mkdir()
  (tmp / "no_ckpts").mkdir()
  (tmp / "no_ckpts" / "config.json").write_text("{}")
  out = str(tmp / "out")
  return {
      "missing_run": ([str(tmp / "nope"), "--out", out], "does not exist"),
      "not_a_run": ([str(tmp / "not_a_run"), "--out", out], "has no config.json"),
      "no_checkpoints": ([str(tmp / "no_ckpts"), "--out", out], "has no checkpoints/"),
      "bad_step": ([run_dir, "--out", out, "--step", "99"],
                   "no checkpoint at step 99 in"),
      "out_not_empty": ([run_dir, "--out", str(tmp / "full")],
                        "exists and is not empty; pass --overwrite"),
      "step_and_average": ([run_dir, "--out", out, "--step", "1", "--average", "lawa:k=2"],
                           "--step and --average exclude each other"),
      "bad_spec": ([run_dir, "--out", out, "--average", "lawa:k=9"], "k=9 checkpoints"),
      "unknown_method": ([run_dir, "--out", out, "--average", "soup:k=2"],
                         "unknown averaging method 'soup'"),
      "out_is_the_run": ([run_dir, "--out", run_dir, "--overwrite"],
                         "is the directory this command reads"),
  }


@pytest.mark.parametrize("name", ["missing_run", "not_a_run", "no_checkpoints", "bad_step",
                                  "out_not_empty", "step_and_average", "bad_spec",
                                  "unknown_method", "out_is_the_run"])
def test_bad_input_is_one_line_and_writes_nothing(char_run, tmp_path, capsys, name):
  args, expected = _bad_cases(char_run["run_dir"], tmp_path)[name]
  before = sorted(str(p) for p in tmp_path.rglob("*"))
  run_before = sorted(str(p) for p in pathlib.Path(char_run["run_dir"]).rglob("*"))
  with pytest.raises(SystemExit) as e:
    run_main(export_script.main, args)
  assert e.value.code == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines
  if name == "bad_step":
    assert "available steps: " + ", ".join(map(str, _steps(char_run))) in lines[0]
  assert sorted(str(p) for p in tmp_path.rglob("*")) == before
  assert sorted(str(p) for p in pathlib.Path(char_run["run_dir"]).rglob("*")) == (
      run_before)


def test_plan_from_spec_over_checkpoints():
  steps = [10, 20, 30, 40]
  lawa = averaging.plan_from_spec("lawa:k=2,every=20", steps)
  assert (lawa.items, lawa.weights) == ((20, 40), (0.5, 0.5))
  swa = averaging.plan_from_spec("swa:start=20", steps)
  assert swa.items == (20, 30, 40) and np.allclose(swa.weights, 1 / 3)
  ema = averaging.plan_from_spec("ema:decay=0.5,every=20", steps)
  assert ema.items == (10, 30) and np.allclose(ema.weights, [1 / 3, 2 / 3])
  for spec, match in [("power_ema:sigma_rel=0.1", "cannot be computed from checkpoints"),
                      ("ema:decay=0.5,warmup=10", "warmup and debias=false"),
                      ("lawa", "missing 1 required positional argument: 'k'"),
                      ("lawa:k=2,every=15", "missing")]:
    with pytest.raises(ValueError, match=match):
      averaging.plan_from_spec(spec, steps)
