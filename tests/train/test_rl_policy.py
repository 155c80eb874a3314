"""RL trainer with a Hugging Face policy on GSM8K / MATH files: training, scoring, evaluation,
the learning-rate schedule and every configuration error."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

import hf_policy_testutil as hpt  # noqa: E402

from rlpost.tasks import math_data  # noqa: E402
from rlpost.train import config as config_lib  # noqa: E402
from rlpost.train import identity  # noqa: E402
from rlpost.train import rl  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  root = tmp_path_factory.mktemp("policy")
  template = math_data.QWEN_MATH_TEMPLATE
  policy = hpt.write_policy(root / "tiny-qwen2", texts=[template])
  return dict(root=root, policy=policy, data=hpt.write_math_data(root / "data"))


def cfg_dict(env, **kw) -> dict:
  cfg = dict(task="math", task_spec=env["data"]["math"], policy=env["policy"],
             max_new_tokens=8, num_prompts=2, group_size=2, steps=2, eval_problems=3,
             eval_samples=2, eval_batch=8, extra_stop_tokens=("<|im_end|>",))
  cfg.update(kw)
  return cfg


def make(env, **kw) -> rl.Trainer:
  return rl.make_train(cfg_dict(env, **kw), log=lambda s: None)


def test_math_policy_trains_scores_and_evaluates(env):
  logs = []
  tr = rl.make_train(cfg_dict(env), log=logs.append)
  assert any("no SFT warm start" in m for m in logs)
  tok = tr.tok
  assert tr.stop_tokens == (tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>"))
  assert tr.sampling_cfg.pad_id == tok.token_to_id("<|endoftext|>")
  # Prompts are the template around each question, left-padded with the pad id.
  first = tok.decode(np.asarray(tr.train_data.prompt_tokens[0])[np.asarray(
      tr.train_data.prompt_mask[0])], skip_special_tokens=False)
  assert first == math_data.format_prompt(math_data.QWEN_MATH_TEMPLATE,
                                          hpt.MATH_TRAIN[0]["problem"])
  assert list(np.asarray(tr.test_data.difficulty)) == [1, 4, 2]

  state = tr.init_state()
  for i in range(2):
    state, m = tr.step(state)
    m = jax.device_get(m)
    rl.raise_if_bad(m, i + 1)
    assert all(np.isfinite(v) for v in m.values()), m
    assert {"loss", "reward", "accuracy", "kl", "grad_norm", "response_length"} <= set(m)
  assert tr.num_traces == 1 and int(state.cursor) == 4

  res = tr.evaluate(state.params)
  assert {"pass@1", "pass@2", "accuracy", "greedy_pass@1", "maj@2", "token_entropy",
          "pass@1/d1", "pass@1/d2", "pass@1/d4"} <= set(res)
  assert all(0.0 <= res[k] <= 1.0 for k in res if k.startswith(("pass@", "maj@")))

  # Host scoring reads the decoded completion: a boxed equivalent answer earns 1.
  right = tok.encode(r"so the answer is \boxed{0.75}.") + [tok.token_to_id("<|im_end|>")]
  wrong = tok.encode(r"\boxed{4}")
  n = max(len(right), len(wrong))
  tokens, mask = tok.pad([right, wrong], length=n, side="right")
  r = tr.score_host(tokens, mask, np.array([0, 0]), 0)  # train record 0: 3/4
  assert list(r) == [1.0, 0.0]


def test_gsm8k_task_and_majority_vote(env):
  tr = make(env, task="gsm8k", task_spec=env["data"]["gsm8k"], num_test=1)
  assert list(np.asarray(tr.train_data.difficulty)) == [0, 0, 0, 0]
  assert len(tr.records["test"]) == 1  # num_test caps the records of a file task
  assert tr.records["train"][3]["answer"] == "2400"
  assert tr.task.final_answer(r"... \boxed{5.0}") == tr.task.final_answer("#### 5")
  assert tr.task.final_answer("no digits") is None
  state, m = tr.step(tr.init_state())
  assert np.isfinite(float(m["loss"]))
  assert set(tr.evaluate(state.params)) >= {"pass@1", "pass@1/d0", "maj@2"}


def test_long_prompts_are_dropped_and_max_seq_len_checked(env):
  same = dict(env["data"]["math"], test=env["data"]["math"]["train"])
  lengths = np.asarray(make(env, task_spec=same).train_data.prompt_mask).sum(1)
  assert len(set(lengths)) == 4
  limit = int(np.sort(lengths)[1])
  logs = []
  tr = rl.make_train(cfg_dict(env, task_spec=same, max_prompt_tokens=limit), log=logs.append)
  assert [r["prompt"] for r in tr.records["train"]] == [
      hpt.MATH_TRAIN[i]["problem"] for i in np.flatnonzero(lengths <= limit)]
  assert tr.train_data.prompt_tokens.shape == (2, limit)
  assert any("dropped 2 of 4 prompts longer than max_prompt_tokens" in m for m in logs)
  with pytest.raises(ValueError, match="every prompt is longer than max_prompt_tokens=1"):
    make(env, max_prompt_tokens=1)
  with pytest.raises(ValueError, match=r"exceed the policy's max_seq_len 40 .*max_new_tokens"):
    make(env, model={"max_seq_len": 40})


def test_policy_configuration_errors(env, tmp_path):
  # Bad paths name the path.
  with pytest.raises(FileNotFoundError, match=r"config key 'policy': /no/such/ckpt is not a dir"):
    make(env, policy="/no/such/ckpt")
  bare = tmp_path / "bare"
  bare.mkdir()
  with pytest.raises(FileNotFoundError, match=r"config key 'policy' \(.*bare\).*tokenizer.json"):
    make(env, policy=str(bare))
  # Architecture keys of `model` are not silently ignored; dtype and max_seq_len apply.
  with pytest.raises(ValueError, match=r"config key 'model' cannot set \['hidden_size'\] "
                                       r"\(the architecture comes from .*config.json"):
    make(env, model={"hidden_size": 64, "dtype": "bfloat16"})
  with pytest.raises(ValueError, match="config key 'model': dtype must be 'float32'"):
    make(env, model={"dtype": "fp8"})
  tr = make(env, model={"dtype": "bfloat16", "max_seq_len": 200})
  assert tr.model_cfg.dtype == "bfloat16" and tr.model_cfg.max_seq_len == 200
  assert make(env).cfg.sft_steps == 0  # unset: follows from the policy
  with pytest.raises(ValueError, match="config key 'sft_steps' must be 0 .got 10."):
    make(env, sft_steps=10)
  with pytest.raises(ValueError, match="config key 'max_new_tokens' must be set"):
    make(env, max_new_tokens=0)
  # Every key the policy path needs is named in one message, before any work.
  with pytest.raises(ValueError, match=r"3 config keys need changing: \(1\) config key "
                                       r"'sft_steps'.*\(2\) config key 'max_new_tokens'.*"
                                       r"\(3\) config key 'model' cannot set \['num_layers'\]"):
    make(env, sft_steps=10, max_new_tokens=0, model={"num_layers": 2})
  # A task with an in-JAX reward on character ids is scored on the host with other tokenizers.
  tr = make(env, task="arithmetic", task_spec={}, num_train=20, num_test=4,
            data_dir=str(env["root"] / "tfds"))
  assert not tr.jax_reward
  rec = tr.records["train"][0]
  ids = tr.tok.encode(rec["answer"], add_special_tokens=False) + [tr.stop_tokens[0]]
  tokens, mask = tr.tok.pad([ids, ids[:-1]], side="right")
  assert list(tr.score_host(tokens, mask, np.array([0, 0]), 0)) == [1.0, 0.0]  # unfinished: 0
  with pytest.raises(ValueError, match="'extra_stop_tokens': '<nope>' is not a token"):
    make(env, extra_stop_tokens=("<nope>",))
  # File tasks need a policy, two local files and a template with {question}.
  with pytest.raises(ValueError, match="'task': needs a Hugging Face policy"):
    config_lib.from_dict(rl.RLConfig, dict(task="math", task_spec=env["data"]["math"]))
  with pytest.raises(ValueError, match="'task_spec': must name local files"):
    make(env, task_spec={"train": env["data"]["math"]["train"]})
  with pytest.raises(ValueError, match="'prompt_template': must contain"):
    make(env, prompt_template="Q: {problem}")
  with pytest.raises(ValueError, match="'extra_stop_tokens': needs a policy"):
    config_lib.from_dict(rl.RLConfig, dict(extra_stop_tokens=("x",)))
  # Missing files and malformed records name the file (and the record index).
  missing = str(tmp_path / "nope.jsonl")
  with pytest.raises(FileNotFoundError, match=rf"math task_spec\['test'\]: {missing} does not"):
    make(env, task_spec=dict(env["data"]["math"], test=missing))
  bad = hpt.write_jsonl(tmp_path / "bad.jsonl", [hpt.MATH_TRAIN[0], {"problem": 3}])
  with pytest.raises(ValueError, match=r"bad.jsonl: record 1 field 'problem' is a int"):
    make(env, task_spec=dict(env["data"]["math"], train=bad))
  bad = hpt.write_jsonl(tmp_path / "bad_gsm.jsonl", [hpt.GSM8K_TRAIN[0], {"question": "q"}])
  with pytest.raises(ValueError, match=r"bad_gsm.jsonl: record 1 has no field 'answer'"):
    make(env, task="gsm8k", task_spec=dict(env["data"]["gsm8k"], train=bad))


def test_countdown_with_a_policy(env):
  tr = make(env, task="countdown", task_spec={}, num_train=20, num_test=4,
            data_dir=str(env["root"] / "tfds"))
  state, m = tr.step(tr.init_state())
  assert np.isfinite(float(m["loss"]))
  assert 0.0 <= tr.evaluate(state.params, num_problems=2)["pass@1"] <= 1.0


def test_learning_rate_schedules():
  assert rl.learning_rate(lr=0.1, schedule="constant", warmup_steps=0, total_steps=10) == 0.1
  warm = rl.learning_rate(lr=1.0, schedule="constant", warmup_steps=4, total_steps=10)
  np.testing.assert_allclose([float(warm(n)) for n in (0, 1, 4, 9)], [0.0, 0.25, 1.0, 1.0])
  cos = rl.learning_rate(lr=1.0, schedule="cosine", warmup_steps=2, total_steps=6)
  want = [0.0, 0.5, 1.0, 0.5 * (1 + np.cos(np.pi / 4)), 0.5, 0.5 * (1 + np.cos(3 * np.pi / 4)),
          0.0]
  np.testing.assert_allclose([float(cos(n)) for n in range(7)], want, atol=1e-6)
  short = rl.learning_rate(lr=1.0, schedule="cosine", warmup_steps=50, total_steps=2)
  np.testing.assert_allclose([float(short(n)) for n in range(3)], [0.0, 0.5, 1.0])
  with pytest.raises(ValueError, match="'lr_schedule': must be"):
    config_lib.from_dict(rl.RLConfig, dict(lr_schedule="linear"))


def test_train_script_runs_a_named_full_run_with_overrides(env, tmp_path):
  from scripts import train as train_script

  from experiments.mc_grpo import full

  path = os.path.join(ROOT, "experiments", "mc_grpo", "full.py")
  assert train_script.load_config_file(f"{path}:math-G2-median") == full.FULL["math-G2-median"]
  assert train_script.load_config_file(path) == full.CONFIG
  with pytest.raises(ValueError, match=r"no run 'G3' in FULL; known: \['gsm8k-G2-mean'"):
    train_script.load_config_file(f"{path}:G3")
  assert train_script.split_config_name("a/b.json") == ("a/b.json", None)
  # A full-size run at toy size, every override given as command-line text (its own copy of
  # the data, changed below).
  own = {}
  for split, src in env["data"]["gsm8k"].items():
    own[split] = str(tmp_path / f"{split}.jsonl")
    shutil.copyfile(src, own[split])
  spec = json.dumps(own)
  argv = [f"{path}:gsm8k-G2-median", f"policy={env['policy']}", f"task_spec={spec}",
          "num_prompts=2", "steps=1", "max_new_tokens=8", "num_train=4", "num_test=2",
          "eval_problems=2", "eval_samples=2", "eval_batch=8", "eval_every=1",
          f"run_dir={tmp_path / 'run'}", "--no-progress"]
  out = train_script.main(argv)
  assert int(out["state"].step) == 1 and out["evals"]
  cfg_file = tmp_path / "run" / "config.json"
  saved = json.loads(cfg_file.read_text())
  original = dict(saved)
  assert saved["recipe"] == "mc_grpo" and saved["group_size"] == 3 and saved["lr"] == 2e-6
  # What the run trained on, by content (rlpost.train.identity).
  ident = json.loads((tmp_path / "run" / "identity.json").read_text())
  assert ident["policy"] == identity.policy_digest(env["policy"])
  assert ident["data"] == {s: identity.digest_path(p) for s, p in own.items()}
  assert ident["dtype"] == {"dtype": "bfloat16", "param_dtype": "float32"}
  assert saved["extra_stop_tokens"] == ["<|im_end|>"]
  # Re-running resumes (tuples compare as saved); a config saved before a key existed counts it
  # at its default.
  assert saved.pop("resume_fallback") is False and saved.pop("allocation") == ""
  cfg_file.write_text(json.dumps(saved))
  assert train_script.main(argv)["resumed_from"] == 1
  saved.pop("lr_warmup_steps")  # 23 here, not the default 0
  cfg_file.write_text(json.dumps(saved))
  with pytest.raises(ValueError, match=r"different config \(keys \['lr_warmup_steps'\]\)"):
    train_script.main(argv)
  # Other data behind the same path: the run directory refuses it as a config change.
  cfg_file.write_text(json.dumps(original))
  with open(own["train"], "a") as f:
    f.write(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
  def snapshot(d):
    return {os.path.relpath(os.path.join(r, f), d): open(os.path.join(r, f), "rb").read()
            for r, _, fs in os.walk(d) for f in fs}

  before = snapshot(tmp_path / "run")
  with pytest.raises(ValueError, match=r"different config \(keys \['identity:data'\]\).*"
                     r"identity:data: 'test sha256 .*, train sha256 (\w+)' -> "):
    train_script.main(argv)
  # Refused before anything is written: the run directory is byte for byte as it was.
  assert snapshot(tmp_path / "run") == before and "identity.json" in before
