"""Every full-size configuration (``experiments/*/full.py``) builds at toy size, and the kinds of
run the dress rehearsal (``test_dress_rehearsal.py``) leaves out train a step on one device.

Each run's policy is replaced by a tiny random checkpoint of the same family (the flags of its
published config.json, ``experiments.full_size.POLICIES``) and its data by a few GSM8K / MATH
records; only sizes shrink (``TOY``), everything else (recipe, recipe arguments, learning rate
and schedule, clip, KL, dtypes, rollout allocation, prompt template, stop tokens) is the
full-size configuration's own.
"""

import importlib
import os

import jax
import numpy as np
import pytest

pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

import hf_policy_testutil as hpt  # noqa: E402

from experiments import full_size  # noqa: E402
from rlpost.train import config as config_lib  # noqa: E402
from rlpost.train import rl  # noqa: E402

EXPERIMENTS = ("mc_grpo", "ace", "dars")
# Sizes that shrink; every other key keeps the full-size value.
TOY = dict(num_prompts=2, steps=1, max_new_tokens=8, num_train=4, num_test=3, eval_every=1,
           eval_problems=2, eval_samples=2, eval_batch=8, checkpoint_every=1, mesh_fsdp=1,
           grad_accum=1, rollout_chunk=0)
# Sizes that scale with the prompts per step or with the completion length.
SCALED = ("allocation_args", "recipe_args")
# One run per distinct code path (objective x rollout allocation x task x policy family) that
# the dress rehearsal (test_dress_rehearsal.py: the tables' arms on 8 devices) does not run:
# the graded GSM8K reward on the Instruct policy, and DARS's hardness-weighted schedule.
STEP_RUNS = [("mc_grpo", "gsm8k-G4-mean"), ("dars", "dars-hw")]


def full_runs(experiment: str) -> dict:
  return importlib.import_module(f"experiments.{experiment}.full").FULL


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  """Data files and one tiny checkpoint per policy named by the full-size configurations."""
  root = tmp_path_factory.mktemp("full")
  data = hpt.write_math_data(root / "data")
  templates, names = set(), set()
  for e in EXPERIMENTS:
    for cfg in full_runs(e).values():
      templates.add(cfg["prompt_template"])
      names.add(os.path.basename(cfg["policy"]))
  policies = {n: hpt.write_policy_like(root / n, full_size.POLICIES[n], texts=sorted(templates))
              for n in sorted(names)}
  return dict(data=data, policies=policies)


def toy(cfg: dict, env) -> dict:
  """``cfg`` at toy size on the tiny checkpoint and files that stand in for its own."""
  out = dict(cfg, **TOY, policy=env["policies"][os.path.basename(cfg["policy"])],
             task_spec=env["data"][cfg["task"]])
  scale_p = TOY["num_prompts"] / cfg["num_prompts"]
  scale_n = TOY["max_new_tokens"] / cfg["max_new_tokens"]
  args = cfg.get("allocation_args", {})
  if args.get("budget"):
    out["allocation_args"] = dict(args, budget=max(1, round(args["budget"] * scale_p)))
  if args.get("chunk"):  # stage-2 calls: several at toy size too
    out["allocation_args"] = dict(args, chunk=max(4, round(args["chunk"] * scale_p)))
  if "overlong_buffer" in cfg["recipe_args"]:
    out["recipe_args"] = dict(cfg["recipe_args"],
                              overlong_buffer=max(1, round(cfg["recipe_args"]["overlong_buffer"]
                                                           * scale_n)))
  changed = {k for k in set(cfg) | set(out) if cfg.get(k) != out.get(k)}
  assert changed <= set(TOY) | set(SCALED) | {"policy", "task_spec"}, changed
  return out


def test_every_full_config_builds_at_toy_size(env):
  """Every run validates and builds its recipe at full size, and at toy size loads its policy
  family and data into a trainer."""
  count = 0
  for e in EXPERIMENTS:
    for name, cfg in full_runs(e).items():
      assert os.path.basename(cfg["policy"]) in full_size.POLICIES, (e, name)
      assert cfg["sft_steps"] == 0 and cfg["task"] in ("gsm8k", "math")
      full = config_lib.from_dict(rl.RLConfig, cfg)
      assert rl.build_recipe(full, full.max_new_tokens).name == cfg["recipe"]
      tr = rl.make_train(toy(cfg, env), log=lambda s: None)
      arch = full_size.POLICIES[os.path.basename(cfg["policy"])]
      mc = tr.model_cfg
      assert (mc.tie_embeddings, mc.rope_theta, mc.qkv_bias) == (
          arch["tie_embeddings"], arch["rope_theta"], True), (e, name)
      assert mc.max_seq_len == cfg["model"].get("max_seq_len", arch["max_seq_len"])
      assert mc.stacked_layers and mc.attention == "blockwise", (e, name)
      assert mc.num_heads // mc.num_kv_heads == arch["num_heads"] // arch["num_kv_heads"]
      assert tr.cfg.recipe == cfg["recipe"] and tr.cfg.lr == cfg["lr"]
      count += 1
  assert count == sum(len(full_runs(e)) for e in EXPERIMENTS) >= 29


@pytest.mark.parametrize("experiment,name", STEP_RUNS, ids=[f"{e}:{n}" for e, n in STEP_RUNS])
def test_full_config_trains_one_step_and_evaluates(env, experiment, name):
  cfg = full_runs(experiment)[name]
  tr = rl.make_train(toy(cfg, env), log=lambda s: None)
  state, m = tr.step(tr.init_state())
  m = jax.device_get(m)
  rl.raise_if_bad(m, 1)
  assert np.isfinite(float(m["loss"])) and np.isfinite(float(m["grad_norm"]))
  assert {"loss", "reward", "accuracy", "grad_norm", "truncated", "logp_mismatch"} <= set(m)
  if cfg.get("allocation", "").startswith("dars"):
    assert {"dars_extra_rollouts", "dars_rescued", "kept_groups"} <= set(m)
    assert m["dars_truncated_fraction"] == 0 and m["dars_stage2_calls"] >= 0
  if cfg["recipe"] == "ace":
    assert {"overconfident_errors", "confidence_shift"} <= set(m)
  assert int(state.step) == 1 and int(state.cursor) == TOY["num_prompts"]
  res = tr.evaluate(state.params)
  assert {"pass@1", "pass@2", "accuracy", "greedy_pass@1", "maj@2", "token_entropy"} <= set(res)
  assert all(np.isfinite(v) for v in res.values())


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_memory_plans_fit_the_planned_node(experiment):
  """Every full-size run micro-batches its gradient and rollouts consistently with the batch it
  trains on and the 8 devices it is planned for (what RLConfig.validate checks at launch), with
  at most TRAIN_ROWS_PER_DEVICE rows per device in each gradient micro-batch."""
  d = full_size.DEVICES
  cap = d * full_size.TRAIN_ROWS_PER_DEVICE
  for name, cfg in full_runs(experiment).items():
    assert cfg["remat"] and cfg["logits_chunk"] == 512, name
    rows = full_size.sampling_plan(cfg).rows
    mb = rows // cfg.get("num_minibatches", 1)
    a = cfg["grad_accum"]
    assert mb % a == 0 and (mb // a) % d == 0, (name, mb, a)
    assert mb // a <= cap, f"{name}: micro-batches of {mb // a} rows, over {cap} on {d} devices"
    c = cfg["rollout_chunk"]
    if c:
      assert c % d == 0 and rows % c == 0, (name, rows, c)


@pytest.mark.parametrize("prompts,group,minibatches,accum,chunk", [
    (16, 8, 2, 2, 0),  # 64-row mini-batches: 2 x 32 rows
    (128, 8, 1, 32, 512),  # 1,024 rows: 32 x 32, rollouts 2 x 512
    (8, 9, 1, 3, 0),  # 72 rows: 3 x 24 (2 x 36 would not split over 8 devices)
    (16, 5, 1, 5, 0),  # 80 rows: 5 x 16 (2 x 40 is over 32; 4 x 20 and 3 do not split)
    (16, 9, 1, 6, 0),  # 144 rows: 6 x 24 (3 x 48, 4 x 36 and 5 are over or uneven)
    (4, 2, 1, 1, 0),  # 8 rows: one micro-batch
])
def test_memory_plan_picks_the_fewest_micro_batches_under_the_bound(prompts, group, minibatches,
                                                                    accum, chunk):
  plan = full_size.with_memory_plan(dict(num_prompts=prompts, group_size=group,
                                         num_minibatches=minibatches))
  assert (plan["grad_accum"], plan["rollout_chunk"]) == (accum, chunk)


def test_memory_plan_refuses_a_mini_batch_the_devices_cannot_share():
  with pytest.raises(ValueError, match="mini-batch of 36 rows cannot be split evenly over 8"):
    full_size.with_memory_plan(dict(num_prompts=4, group_size=9))
  # One row per device per micro-batch at most: 512 rows in 64 micro-batches of 8.
  plan = full_size.with_memory_plan(dict(num_prompts=32, group_size=16), train_rows_per_device=1)
  assert plan["grad_accum"] == 64
