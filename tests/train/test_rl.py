"""RL trainer: every recipe runs at toy size, no recompilation, exact resume, bad input."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlpost.train import config as config_lib
from rlpost.train import loop, rl
from rl_testutil import TINY_MODEL, assert_moved, learning_config, max_update_gap


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("rl")
  return dict(data_dir=str(root / "data"), cache_dir=str(root / "cache"))


def tiny(dirs, **kw):
  """The learning fixture policy (tests/rl_testutil.py): mixed rewards and a non-zero gradient
  at every step, so comparisons between runs compare updates that happened."""
  return rl.make_train(learning_config(dirs, **kw), log=lambda s: None)


# Lowerings to an XLA module: one per compilation the step asks for, whether XLA then compiles
# it or the session's persistent compilation cache (tests/conftest.py) returns it.
_COMPILES = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, *_, **__: _COMPILES.append(event)
    if event == "/jax/core/compile/jaxpr_to_mlir_module_duration" else None)


RECIPES = [
    ("grpo", {}, 4), ("dr_grpo", {}, 4), ("dapo", {}, 4), ("gspo", {}, 4), ("gspo_token", {}, 4),
    ("pnpo", {}, 4), ("rloo", {}, 4), ("mc_grpo", {}, 5), ("mc_grpo", {"base": "dapo"}, 5),
    ("ace", {"alpha": 0.5}, 4), ("ace", {"alpha": 0.5, "base": "dapo"}, 4), ("dars", {}, 4),
]


@pytest.mark.parametrize("recipe,args,g", RECIPES, ids=[f"{r}-{'-'.join(a)}" for r, a, _ in RECIPES])
def test_every_recipe_trains_without_nan_or_recompilation(dirs, recipe, args, g):
  rule = {"allocation": "plain"} if recipe == "dars" else {}  # DARS's objective, its baseline
  tr = tiny(dirs, recipe=recipe, recipe_args=args, group_size=g, **rule)
  state = tr.init_state()
  start = state.params
  for i in range(3):
    before = len(_COMPILES)
    state, m = tr.step(state)
    m = jax.device_get(m)
    rl.raise_if_bad(m, i + 1)
    for k, v in m.items():
      assert np.isfinite(v), (k, v)
    assert_moved(m, f"{recipe} step {i + 1}")
    if i > 0:  # one XLA compilation at step 1, none after (the state's placement is stable)
      assert len(_COMPILES) == before, f"step {i + 1} compiled again"
  assert tr.num_traces == 1
  assert int(state.step) == 3 and int(state.cursor) == 3 * tr.cfg.num_prompts
  _, moved = max_update_gap(start, state.params, start)
  assert moved > 0, "three steps with non-zero gradients left the parameters unchanged"


def _steps_checked(tr, steps: int):
  """Runs ``steps`` steps from the initial state; every metric finite, one compilation."""
  state = tr.init_state()
  for i in range(steps):
    state, m = tr.step(state)
    m = jax.device_get(m)
    rl.raise_if_bad(m, i + 1)
    assert all(np.isfinite(v) for v in m.values())
  assert tr.num_traces == 1
  return state, m


@pytest.mark.parametrize("kw", [
    dict(recipe="dars", allocation="dars", allocation_args=dict(schedule="et", n_max=8)),
    dict(recipe="dars", allocation="dars", allocation_args=dict(schedule="hw", n_max=8,
                                                                budget=8)),
    dict(recipe="dapo", allocation="dynamic_sampling", allocation_args=dict(factor=3)),
    # DARS-B: breadth (a larger rollout batch), full-batch updates, exactly 2 optimizer steps.
    dict(recipe="dars", allocation="dars_b", allocation_args=dict(schedule="et", n_max=8),
         num_prompts=8, num_iterations=2, num_minibatches=1),
], ids=["dars-et", "dars-hw-budget", "dapo-dynamic", "dars-b"])
def test_rollout_allocation_in_the_step(dirs, kw):
  tr = tiny(dirs, **kw)
  state, m = _steps_checked(tr, 3)
  assert_moved(m, str(kw))
  if kw["allocation"].startswith("dars"):
    assert "dars_rescued" in m and 0 <= m["dars_rescued"] <= m["dars_all_wrong_stage1"]
    assert 0 <= m["dars_extra_rollouts"] <= m["dars_demand"]
    assert int(state.cursor) == 3 * tr.cfg.num_prompts
  else:
    assert int(state.cursor) == 3 * tr.cfg.num_prompts * 3  # k*P prompts consumed per step
    assert 0 < m["kept_groups"] <= 1


def test_chunked_dars_stage2_in_the_trainer(dirs):
  """allocation_args chunk: stage 2 runs the calls its demand needs and never truncates; the
  step on the allocation equals the step on it without ``live`` (every micro-batch run) within
  a tolerance (the skipping itself: tests/train/test_dynamic_rows.py)."""
  tr = tiny(dirs, recipe="dars", allocation="dars", grad_accum=4,
            allocation_args=dict(schedule="et", n_max=16, chunk=16))
  assert tr.parts.plan.calls == (32,) + (16,) * 6  # P (n_max - G) = 96 rows, 6 calls
  state = tr.init_state()
  key = jax.random.wrap_key_data(state.key)
  alloc = jax.jit(tr.fns.collect)(state.params, state.cursor, key, jax.random.key(1),
                                  tr.train_data)
  m = {k: float(v) for k, v in alloc.metrics.items()}
  live = np.asarray(alloc.live)
  assert 0 < m["dars_stage2_calls"] < 6, m  # some calls ran, some did not
  assert m["dars_truncated"] == 0 and m["dars_demand"] == live[32:].sum()
  mask, ran = np.asarray(alloc.rollouts.mask), 32 + 16 * int(m["dars_stage2_calls"])
  assert mask[:ran].any(axis=1).all() and not mask[ran:].any()  # the calls not run: no tokens
  np.testing.assert_array_equal(live, np.arange(128) < 32 + m["dars_demand"])
  assert not np.asarray(alloc.valid)[~live].any()
  upd = jax.jit(tr.fns.update)
  ks = (jax.random.key(2), jax.random.key(3))
  s1, m1 = jax.device_get(upd(state, alloc, tr.ref_params, *ks))
  s2, m2 = jax.device_get(upd(state, alloc._replace(live=None), tr.ref_params, *ks))
  assert_moved(m1, "chunked DARS")
  for k in ("loss", "grad_norm", "reward", "kept_groups"):
    np.testing.assert_allclose(m1[k], m2[k], rtol=2e-4, atol=1e-7, err_msg=k)
  gap, moved = max_update_gap(s1.params, s2.params, state.params)
  assert moved > 0 and gap <= 1e-2 * moved, (gap, moved)


def test_countdown_through_host_callback(dirs):
  """The host-scored path end to end (wiring, not learning: a 10-step warm start)."""
  kw = dict(task="countdown", task_spec={}, num_train=100, num_test=20, sft_steps=10)
  tr = tiny(dirs, **kw)
  state, m = tr.step(tr.init_state())
  assert np.isfinite(float(m["loss"]))
  res = tr.evaluate(state.params)
  assert 0.0 <= res["pass@1"] <= 1.0
  # A host reward returning NaN or the wrong shape fails with the rollout and prompt named.
  tr = tiny(dirs, **kw)
  real = tr.score_host

  def nan_at_5(tokens, mask, idx, split):
    r = real(tokens, mask, idx, split)
    r[5] = np.nan
    return r

  tr.score_host = nan_at_5
  with pytest.raises(Exception, match=r"rollout 5 \(prompt \d+\)"):
    tr.step(tr.init_state())
  tr = tiny(dirs, **kw)
  tr.score_host = lambda tokens, mask, idx, split: np.zeros(3, np.float32)
  rows = tr.cfg.num_prompts * tr.cfg.group_size
  with pytest.raises(Exception, match=rf"returned shape \(3,\), expected \({rows},\)"):
    tr.step(tr.init_state())


def test_exact_resume_and_finished_run(dirs, tmp_path):
  straight = loop.run(tiny(dirs), str(tmp_path / "a"), progress=False)
  entries = loop.read_metrics(str(tmp_path / "a" / "metrics.jsonl"))
  train_entries = [r for r in entries if "train/loss" in r]
  for r in train_entries[2:]:  # the steps replayed after the resume point moved the policy
    assert_moved({k.split("/")[1]: v for k, v in r.items() if k.startswith("train/")},
                 f"step {r['step']}")
  # Stop after 2 steps, then resume to 4 with a fresh trainer (as a new process would).
  loop.run(tiny(dirs, steps=2), str(tmp_path / "b"), progress=False)
  resumed = loop.run(tiny(dirs), str(tmp_path / "b"), progress=False)
  assert resumed["resumed_from"] == 2
  # Same program, same device count: the contract is bitwise.
  for a, b in zip(jax.tree.leaves(straight["state"]), jax.tree.leaves(resumed["state"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  ev_a = [e["pass@1"] for e in straight["evals"]]
  ev_b = [e["pass@1"] for e in resumed["evals"]]
  assert ev_a == ev_b
  messages = []
  tr = tiny(dirs)
  tr.log = messages.append
  again = loop.run(tr, str(tmp_path / "b"), progress=False)
  assert again["resumed_from"] == 4
  assert any("already finished at step 4" in m for m in messages)
  assert [r["step"] for r in train_entries] == [1, 2, 3, 4]
  assert os.path.exists(tmp_path / "a" / "learning_curve.png")
  # Averaging tools restore exactly the parameter leaves of a run's checkpoints.
  from rlpost.averaging.checkpoints import CheckpointSource

  with CheckpointSource(str(tmp_path / "a" / "checkpoints")) as src:
    assert len(src.keys) == len(jax.tree.leaves(straight["state"].params))
  tags = _tensorboard_tags(tmp_path / "a" / "tb")
  assert {"train/loss", "train/reward", "eval/pass_at_1"} <= tags
  with pytest.raises(ValueError, match=r"different config \(keys \['lr'\]\)"):
    loop.run(tiny(dirs, lr=3e-4), str(tmp_path / "b"), progress=False)


def _tensorboard_tags(tb_dir) -> set:
  """Scalar tags in TensorBoard event files (TFRecord framing, Event protos)."""
  import struct

  from tensorboardX.proto import event_pb2

  tags = set()
  for f in os.listdir(tb_dir):
    data = open(os.path.join(tb_dir, f), "rb").read()
    pos = 0
    while pos < len(data):
      (n,) = struct.unpack("<Q", data[pos:pos + 8])
      ev = event_pb2.Event.FromString(data[pos + 12:pos + 12 + n])
      tags.update(v.tag for v in ev.summary.value)
      pos += 12 + n + 4
  return tags


def test_averaged_weights_evaluated_and_resumed_exactly(dirs, tmp_path):
  kw = dict(averaging="lawa:k=2,every=1;ema:decay=0.9")
  straight = loop.run(tiny(dirs, **kw), str(tmp_path / "a"), progress=False)
  loop.run(tiny(dirs, steps=2, **kw), str(tmp_path / "b"), progress=False)
  resumed = loop.run(tiny(dirs, **kw), str(tmp_path / "b"), progress=False)
  assert len(straight["averages"]) == 2
  for name, avg in straight["averages"].items():
    # Precondition: the averages are not the last weights (the policy moved while averaging).
    gap, _ = max_update_gap(avg, straight["state"].params, straight["state"].params)
    assert gap > 0, f"{name} equals the raw weights"
    # The averaging state travels in the checkpoint: the resumed run's average is the same.
    for a, b in zip(jax.tree.leaves(avg), jax.tree.leaves(resumed["averages"][name])):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
  last_a, last_b = straight["evals"][-1], resumed["evals"][-1]
  avg_keys = sorted(k for k in last_a if k.startswith("avg/"))
  assert avg_keys and all(k.endswith(("pass@1", "pass@4")) for k in avg_keys)
  assert {k: last_a[k] for k in avg_keys} == {k: last_b[k] for k in avg_keys}
  with pytest.raises(ValueError, match="config key 'averaging'"):
    config_lib.from_dict(rl.RLConfig, {"averaging": "lawa:k=banana"})


def test_nonfinite_reward_names_the_rollout(dirs, tmp_path):
  tr = tiny(dirs)
  real = tr.parts.reward

  def bad_reward(tokens, mask, idx, data, *, split_id=0):
    r, ok = real(tokens, mask, idx, data, split_id=split_id)
    return r.at[6].set(jnp.nan), ok

  tr.parts.reward = bad_reward  # the reward the step's functions call
  g = tr.cfg.group_size
  with pytest.raises(FloatingPointError, match=rf"step 1: non-finite reward at rollout index 6 "
                     rf"\(train prompt \d+, group {6 // g} of the step\).*no checkpoint was "
                     "saved yet"):
    loop.run(tr, str(tmp_path / "nan"), progress=False)


def test_nonfinite_update_names_the_parameters(dirs):
  """An update that makes the parameters non-finite (here an infinite step size) stops the
  run at that step, blaming the update, not the next step's rollouts."""
  import optax

  tr = rl.make_train(learning_config(dirs), log=lambda s: None,
                     optimizer=optax.scale(float("inf")))
  _, m = tr.step(tr.init_state())
  with pytest.raises(FloatingPointError, match="step 1: the update made the policy parameters "
                     "non-finite.*check lr"):
    rl.raise_if_bad(jax.device_get(m), 1)


def test_memory_options_leave_the_update_unchanged(dirs):
  """Micro-batched gradients, per-layer remat and a chunked LM head give the same step (the
  loss pairs of disjoint micro-batches add up exactly); GRPO with KL (reference pass) and an
  entropy bonus, so every optional input goes through the chunked paths. These are different
  programs (other reduction orders), so the contract is a tolerance: metrics to 2e-4
  relative, and parameters within 1% of the size of the update itself."""
  kw = dict(recipe="grpo", recipe_args={"entropy_coef": 0.01}, num_minibatches=2)
  base = tiny(dirs, **kw)
  s0 = base.init_state()
  ref_state, ref_m = base.step(s0)
  ref_m = jax.device_get(ref_m)
  assert_moved(ref_m, "plain update")
  assert ref_m["kl"] >= 0 and ref_m["entropy"] > 0
  for opts in (dict(grad_accum=2), dict(remat=True, logits_chunk=3),
               dict(grad_accum=4, remat=True, logits_chunk=2), dict(pack_buckets=(0.5, 0.875)),
               dict(pack_buckets=(0.875,), pack_bin_rows=7, grad_accum=2, remat=True,
                    logits_chunk=3)):
    tr = tiny(dirs, **kw, **opts)
    state, m = tr.step(tr.init_state())
    if "pack_buckets" in opts:  # the decoder ran over fewer slots than the padded pass
      assert m["real_tokens"] <= m["packed_slots"] < 1, (m["real_tokens"], m["packed_slots"])
    for k in ("grad_norm", "kl", "entropy", "reward"):
      np.testing.assert_allclose(m[k], ref_m[k], rtol=2e-4, atol=1e-7, err_msg=f"{opts} {k}")
    # The sampler-vs-trainer gap is float rounding (~1e-7) in both: bounded, not compared.
    assert m["logp_mismatch"] < 1e-5 and ref_m["logp_mismatch"] < 1e-5
    gap, moved = max_update_gap(state.params, ref_state.params, s0.params)
    assert moved > 0 and gap <= 1e-2 * moved, (opts, gap, moved)
    assert tr.num_traces == 1


def test_stacked_layers_leave_the_step_unchanged(dirs):
  """model={"stacked_layers": True} starts from the same SFT policy (restacked) and takes the
  same step as layers stored one by one, with and without remat. Different programs (a scan
  over stacked weights against a loop), so: metrics to 2e-4 relative, parameters within 1% of
  the update's size, compared layer by layer after unstacking."""
  from flax import nnx

  from rlpost.models import transformer as tfm

  model = dict(TINY_MODEL, num_layers=2)
  base = tiny(dirs, model=model)
  s0 = base.init_state()
  ref_state, ref_m = jax.device_get(base.step(s0))
  assert_moved(ref_m, "stored layers")
  for remat in (False, True):
    tr = tiny(dirs, model=dict(model, stacked_layers=True), remat=remat)
    assert tr.policy.model_cfg.stacked_layers
    t0 = tr.init_state()
    unstack = lambda p: nnx.state(tfm.with_layers_stacked(  # noqa: E731
        nnx.merge(tr.policy.graphdef, p), False))
    assert max_update_gap(unstack(t0.params), s0.params, s0.params)[0] == 0  # same start
    state, m = jax.device_get(tr.step(t0))
    for k in ("grad_norm", "reward", "loss"):
      np.testing.assert_allclose(m[k], ref_m[k], rtol=2e-4, atol=1e-7, err_msg=f"{remat} {k}")
    gap, moved = max_update_gap(unstack(state.params), ref_state.params, s0.params)
    assert moved > 0 and gap <= 1e-2 * moved, (remat, gap, moved)


def test_packed_update_compiles_once_as_lengths_vary(dirs):
  """With pack_buckets the bucket is picked at run time inside the one step program: three
  steps whose completion lengths differ compile once, and each reports the rows it ran."""
  tr = tiny(dirs, pack_buckets=(0.5, 0.875, 0.9375))
  state = tr.init_state()
  lengths, rows = set(), []
  for i in range(3):
    before = len(_COMPILES)
    state, m = tr.step(state)
    m = jax.device_get(m)
    assert_moved(m, f"packed step {i + 1}")
    if i > 0:
      assert len(_COMPILES) == before, f"step {i + 1} compiled again"
    lengths.add(float(m["response_length"]))
    rows.append(float(m["packed_slots"]))
  assert len(lengths) > 1, "every step had the same completion lengths; nothing varied"
  assert tr.num_traces == 1
  assert all(r in (0.5, 0.875, 0.9375, 1.0) for r in rows) and min(rows) < 1, rows


def test_rollouts_in_chunks_sample_the_same_rows(dirs):
  """rollout_chunk samples the step's rows in sequential chunks. Each row has its own key, so
  the chunks draw the same completions as one call: the tokens agree except where float
  rounding of the batched forward pass flips a near-tie (allowed in at most 1 row in 32), and
  the step's update agrees within 1% of its size. DARS's second stage is chunked too."""
  for kw in (dict(), dict(recipe="dars", allocation="dars",
                          allocation_args=dict(schedule="et", n_max=8))):
    ref = tiny(dirs, **kw)
    s0 = ref.init_state()
    k = jax.random.wrap_key_data(s0.key)
    want = ref.sample(s0.params, jnp.arange(32) % 200, k)
    tr = tiny(dirs, rollout_chunk=8, **kw)
    got = tr.sample(s0.params, jnp.arange(32) % 200, k)
    same = np.all(np.asarray(want.tokens) == np.asarray(got.tokens), axis=1)
    assert np.mean(same) >= 31 / 32, np.mean(same)
    assert np.var(np.asarray(want.rewards)) > 0  # rows that differ in outcome were compared
    np.testing.assert_allclose(np.asarray(got.logp)[same], np.asarray(want.logp)[same],
                               rtol=1e-5, atol=1e-6)
    ref_state, ref_m = ref.step(s0)
    state, m = _steps_checked(tr, 1)
    assert_moved(jax.device_get(ref_m), f"unchunked {kw}")
    gap, moved = max_update_gap(state.params, ref_state.params, s0.params)
    assert gap <= 1e-2 * moved, (kw, gap, moved)


def test_config_errors(dirs):
  with pytest.raises(ValueError, match=r"unknown config key\(s\) \['learning_rate'\]"):
    config_lib.from_dict(rl.RLConfig, {"learning_rate": 1.0})
  with pytest.raises(ValueError, match="'group_size': G must be >= 1"):
    config_lib.from_dict(rl.RLConfig, {"group_size": 0})
  with pytest.raises(ValueError, match="'num_minibatches': must divide"):
    config_lib.from_dict(rl.RLConfig, {"num_minibatches": 3})
  with pytest.raises(ValueError, match="unknown recipe 'grpoo'"):
    config_lib.from_dict(rl.RLConfig, {"recipe": "grpoo"})
  with pytest.raises(ValueError, match="config key 'lr' must be a float"):
    config_lib.from_dict(rl.RLConfig, {"lr": "fast"})
  with pytest.raises(ValueError, match="recipe_args"):
    tiny(dirs, recipe="ace")  # ACE needs alpha
  cfg = config_lib.from_dict(rl.RLConfig, config_lib.parse_overrides(
      ["lr=3e-4", "recipe=ace", "recipe_args={\"alpha\": 0.1}", "graded_reward=true"]))
  assert cfg.lr == 3e-4 and cfg.recipe_args == {"alpha": 0.1} and cfg.graded_reward is True
  with pytest.raises(ValueError, match="not of the form key=value"):
    config_lib.parse_overrides(["lr"])

  with pytest.raises(ValueError, match="'grad_accum': must split the mini-batch of 128"):
    config_lib.from_dict(rl.RLConfig, {"grad_accum": 3})
  with pytest.raises(ValueError, match="'rollout_chunk': must divide every sampling call"):
    config_lib.from_dict(rl.RLConfig, {"rollout_chunk": 48})
  with pytest.raises(ValueError, match="'logits_chunk': must be >= 0"):
    config_lib.from_dict(rl.RLConfig, {"logits_chunk": -1})
  with pytest.raises(ValueError, match=r"'pack_buckets': fractions of the padded slots must be "
                     r"in \(0, 1\), got \[0.5, 1.0\]"):
    config_lib.from_dict(rl.RLConfig, {"pack_buckets": "[0.5, 1.0]"})
  # Values that used to be accepted and then trained something else, or failed late.
  bad = [({"sft_steps": -5}, "'sft_steps': must be >= 0"),
         ({"lr": "inf"}, "'lr': must be a finite number"),
         ({"lr": "nan"}, "'lr': must be a finite number"),
         ({"b2": 1.0}, "'b2': must be in"),
         ({"grad_clip": 0}, "'grad_clip': must be > 0"),
         ({"num_train": 0}, "'num_train': must be >= 1"),
         ({"num_test": 40, "eval_problems": 500}, "'eval_problems': exceeds the 40 problems"),
         ({"recipe": "dapo", "recipe_args": {"clip_hihg": 0.3}}, "'recipe_args'")]
  for values, msg in bad:
    with pytest.raises(ValueError, match=msg):
      config_lib.from_dict(rl.RLConfig, values)


def test_a_dotted_override_sets_one_field_of_a_dict_key():
  base = {"recipe": "ace", "recipe_args": {"alpha": 0.5, "base": "dapo", "overlong_buffer": 64},
          "model": {"dtype": "bfloat16"}, "lr": 1e-6}
  got = config_lib.apply_overrides(base, config_lib.parse_overrides(
      ["recipe_args.overlong_buffer=4", "recipe_args.fn=softplus", "model.max_seq_len=64",
       "lr=2e-6"], rl.RLConfig))
  assert got["recipe_args"] == {"alpha": 0.5, "base": "dapo", "overlong_buffer": 4,
                                "fn": "softplus"}
  assert got["model"] == {"dtype": "bfloat16", "max_seq_len": 64} and got["lr"] == "2e-6"
  assert base["recipe_args"]["overlong_buffer"] == 64  # the base dict is not changed
  # a key given as JSON text (a whole-dict override earlier on the command line) is merged into
  got = config_lib.apply_overrides({}, {"allocation_args": '{"n_max": 8}',
                                        "allocation_args.chunk": "4"})
  assert got["allocation_args"] == {"n_max": 8, "chunk": 4}
  got = config_lib.apply_overrides({}, {"model": "{'dtype': 'bfloat16'}", "model.remat": "true"})
  assert got["model"] == {"dtype": "bfloat16", "remat": True}
  for bad in ("lr.x=1", "recipe_args.a.b=1", "recipe_args.=1"):
    with pytest.raises(ValueError, match=f"override {bad.split('=')[0]}=1: .* does not hold"):
      config_lib.apply_overrides(base, config_lib.parse_overrides([bad]))


def test_command_line_templates_get_real_newlines(tmp_path):
  typed = r"prompt_template=Question: {question}\nAnswer: a\\b"  # as a shell passes it
  got = config_lib.parse_overrides([typed, r'recipe_args={"sep": "\n"}'], rl.RLConfig)
  assert got["prompt_template"] == "Question: {question}\nAnswer: a\\b"
  assert got["recipe_args"] == r'{"sep": "\n"}'  # not a string key: left to the JSON parser
  template = tmp_path / "template.txt"
  template.write_text("Q: {question}\n\nA:\n")
  got = config_lib.parse_overrides([f"prompt_template=@{template}"], rl.RLConfig)
  assert got["prompt_template"] == "Q: {question}\n\nA:"
  with pytest.raises(ValueError, match="override prompt_template: cannot read '/nonexistent'"):
    config_lib.parse_overrides(["prompt_template=@/nonexistent"], rl.RLConfig)
  with pytest.warns(UserWarning, match="prompt_template contains a literal backslash-n"):
    config_lib.from_dict(rl.RLConfig, {"prompt_template": r"Q: {question}\nA:"})


def test_bad_input_fails_before_any_work(dirs, tmp_path):
  """A recipe_args typo or a run_dir that is a file fails before data generation and the SFT
  warm start: nothing is written to the data or cache directories."""
  from scripts import train as train_script

  fresh = dict(data_dir=str(tmp_path / "data"), cache_dir=str(tmp_path / "cache"))
  cfg = tmp_path / "c.json"
  cfg.write_text(json.dumps(learning_config(fresh)))
  (tmp_path / "file").write_text("")
  with pytest.raises(NotADirectoryError, match=r"'run_dir': .*file is a file"):
    train_script.main([str(cfg), f"run_dir={tmp_path / 'file'}", "--no-progress"])
  with pytest.raises(ValueError, match="'recipe_args'"):
    train_script.main([str(cfg), "recipe=dapo", 'recipe_args={"clip_hihg": 0.3}',
                       f"run_dir={tmp_path / 'r'}", "--no-progress"])
  assert not os.path.exists(fresh["data_dir"]) and not os.path.exists(fresh["cache_dir"])
  assert not os.path.exists(tmp_path / "r")


def test_train_script_runs_and_rejects_bad_keys(dirs, tmp_path):
  from scripts import train as train_script

  cfg = tmp_path / "c.json"
  cfg.write_text(json.dumps(dict(task_spec=dict(min_digits=1, max_digits=2), num_train=200,
                                 num_test=40, model=TINY_MODEL, sft_steps=10, sft_batch_size=32,
                                 num_prompts=4, group_size=4, eval_problems=8, eval_samples=4,
                                 eval_batch=32, **dirs)))
  out = train_script.main([str(cfg), "steps=2", "eval_every=2", f"run_dir={tmp_path / 'r'}",
                           "--no-progress"])
  assert int(out["state"].step) == 2
  with pytest.raises(ValueError, match="unknown config key"):
    train_script.main([str(cfg), "stepz=2"])


def test_eight_devices_match_one(dirs, with_devices, tmp_path):
  """The device-count contract. Rollouts split over 8 simulated devices (2-way FSDP) draw the
  same samples as on one device (per-row keys, partitionable threefry); only the order of
  floating-point sums differs. So: rewards agree to within one rollout's reward per step (a
  float difference can flip a token only at a near-tie), gradient norms and KL to 1e-3
  relative, and after three steps the parameters agree within 1% of how far they moved. The
  loss is not compared: GRPO's surrogate is ~0 by value at ratio 1."""
  tr = tiny(dirs)
  state = tr.init_state()
  start = state.params
  single = []
  for _ in range(3):
    state, m = tr.step(state)
    single.append({k: float(v) for k, v in jax.device_get(m).items()})
  out = tmp_path / "multi.npz"
  cfg = learning_config(dirs, mesh_fsdp=2, param_sharding="fsdp")
  with_devices(f"""
import json, jax, numpy as np
from rlpost.train import rl
assert len(jax.devices()) == 8
tr = rl.make_train({cfg!r}, log=lambda s: None)
state = tr.init_state()
rows = []
for _ in range(3):
  state, m = tr.step(state)
  rows.append({{k: float(v) for k, v in jax.device_get(m).items()}})
assert tr.num_traces == 1
leaves = [np.asarray(x) for x in jax.tree.leaves(jax.device_get(state.params))]
np.savez({str(out)!r}, rows=json.dumps(rows), *leaves)
""")
  data = np.load(out)
  multi = json.loads(str(data["rows"]))
  rows = tr.cfg.num_prompts * tr.cfg.group_size
  for i, (s, m) in enumerate(zip(single, multi)):
    assert_moved(s, f"step {i + 1}")
    assert abs(s["reward"] - m["reward"]) <= 1 / rows + 1e-7, (i, s["reward"], m["reward"])
    np.testing.assert_allclose(m["grad_norm"], s["grad_norm"], rtol=1e-3)
    np.testing.assert_allclose(m["kl"], s["kl"], rtol=1e-3, atol=1e-7)
  multi_params = [data[f"arr_{i}"] for i in range(len(jax.tree.leaves(state.params)))]
  gap, moved = max_update_gap(multi_params, state.params, start)
  assert moved > 0 and gap <= 1e-2 * moved, (gap, moved)
  msg = with_devices("""
from rlpost.train import config, rl
try:
  config.from_dict(rl.RLConfig, dict(num_prompts=3, group_size=3))
except ValueError as e:
  print(e)
""")
  assert "config key 'num_prompts'" in msg and "divisible by the 8 devices" in msg


def test_sft_evaluates_averages_beside_raw_weights(dirs):
  from rlpost.models import transformer as tfm
  from rlpost.tasks import arithmetic
  from rlpost.tokenizer import CharTokenizer
  from rlpost.train import sft

  records = arithmetic.generate(arithmetic.ArithmeticSpec(1, 2), 64, seed=0)
  tok = CharTokenizer()
  model = tfm.init_model(tfm.TransformerConfig(vocab_size=tok.vocab_size, **TINY_MODEL))
  cfg = sft.SFTConfig(steps=6, batch_size=16, averaging="lawa:k=2,every=1;ema:decay=0.5")
  _, hist = sft.train_sft(model, records[:48], tok, cfg, log_every=3, log=lambda s: None,
                          eval_records=records[48:])
  assert [h["step"] for h in hist] == [3, 6]
  avg = [k for k in hist[-1] if k.startswith("avg/")]
  assert len(avg) == 2 and all(np.isfinite(hist[-1][k]) for k in avg)
  assert hist[-1]["eval_loss"] != hist[-1][avg[0]]  # an average differs from the raw weights


def test_confidence_metrics_describe_the_wrong_rollouts():
  """The selectivity diagnostics by hand: c = sum_t (logp - ref_logp) of each rollout; over the
  wrong ones (rows 0-3; row 4 is correct, row 5 invalid) the 10/50/90% quantiles (linear
  interpolation) and the share of sum softplus(c) on those with c > 0."""
  from rlpost.types import RolloutBatch

  c = np.array([-1.0, 0.5, 2.0, -0.2, 3.0, 5.0], np.float32)
  batch = RolloutBatch(
      group_id=jnp.zeros(6, jnp.int32), valid=jnp.asarray([1, 1, 1, 1, 1, 0], bool),
      tokens=jnp.zeros((6, 2), jnp.int32), token_mask=jnp.asarray([[1, 1]] * 6, bool),
      rewards=jnp.zeros(6), behaviour_logp=jnp.asarray(np.stack([c / 2, c / 2], 1)),
      ref_logp=jnp.zeros((6, 2)), correct=jnp.asarray([0, 0, 0, 0, 1, 0], bool))
  for fn in (rl._confidence_metrics, jax.jit(rl._confidence_metrics)):
    m = jax.device_get(fn(batch))
    wrong = c[:4]
    for q, key in ((0.1, "shift_wrong_p10"), (0.5, "shift_wrong_p50"), (0.9, "shift_wrong_p90")):
      np.testing.assert_allclose(m[key], np.quantile(wrong, q), rtol=1e-5)
    sp = np.log1p(np.exp(wrong))
    np.testing.assert_allclose(m["penalty_share_overconfident"], sp[wrong > 0].sum() / sp.sum(),
                               rtol=1e-5)
    np.testing.assert_allclose(m["overconfident_errors"], 2 / 5, rtol=1e-6)
  none_wrong = dataclasses.replace(batch, correct=jnp.ones(6, bool))
  m = jax.device_get(rl._confidence_metrics(none_wrong))
  assert m["shift_wrong_p50"] == 0.0 and m["penalty_share_overconfident"] == 0.0


def test_log_confidence_adds_the_diagnostics_not_a_loss_term(dirs):
  """GRPO without KL reads no reference log-probs; log_confidence runs the reference pass for
  the confidence diagnostics only: the step's update is the same (two programs, so to 1% of the
  update's size) and the diagnostics appear."""
  kw = dict(recipe="grpo", recipe_args={"kl_coef": 0.0})
  plain = tiny(dirs, **kw)
  s0 = plain.init_state()
  want, m0 = plain.step(s0)
  m0 = jax.device_get(m0)
  assert_moved(m0, "grpo kl 0")
  assert "overconfident_errors" not in m0
  logged = tiny(dirs, log_confidence=True, **kw)
  got, m1 = logged.step(logged.init_state())
  m1 = jax.device_get(m1)
  for key in ("overconfident_errors", "shift_wrong_p10", "shift_wrong_p50", "shift_wrong_p90",
              "penalty_share_overconfident"):
    assert np.isfinite(m1[key]), key
  assert m1["shift_wrong_p10"] <= m1["shift_wrong_p50"] <= m1["shift_wrong_p90"]
  gap, moved = max_update_gap(got.params, want.params, s0.params)
  assert moved > 0 and gap <= 1e-2 * moved, (gap, moved)
