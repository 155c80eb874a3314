"""What a fork relies on in the trainer: run facts reach recipe factories, every source's
metrics reach the step metrics by name (two sources of one name are refused), and the trainer's
own metrics stay true under ragged groups."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from rl_testutil import assert_moved, learning_config

from rlpost import objectives as obj
from rlpost import registry
from rlpost.objectives import recipes
from rlpost.rollouts import allocate
from rlpost.tokenizer import CharTokenizer
from rlpost.train import rl


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("seams")
  return dict(data_dir=str(root / "data"), cache_dir=str(root / "cache"))


def test_run_facts_reach_the_recipe_factory(dirs):
  seen = []

  def facts_probe(*, max_length=None, group_size=None, num_prompts=None, rows=None,
                  prompt_length=None, tokenizer=None, stop_tokens=None, pad_id=None):
    seen.append(dict(max_length=max_length, group_size=group_size, num_prompts=num_prompts,
                     rows=rows, prompt_length=prompt_length, tokenizer=tokenizer,
                     stop_tokens=stop_tokens, pad_id=pad_id))
    return obj.get_recipe("grpo").replace(name="facts_probe")

  recipes.register_recipe("facts_probe", facts_probe)
  try:
    tr = rl.make_train(learning_config(dirs, recipe="facts_probe"), log=lambda s: None)
  finally:
    recipes._REGISTRY.pop("facts_probe")
  # Validation builds the recipe before the data and tokenizer exist; the trainer with all.
  assert seen[0]["tokenizer"] is None and seen[0]["rows"] == 32
  got = seen[-1]
  assert isinstance(got["tokenizer"], CharTokenizer)
  assert got["stop_tokens"] == tuple(tr.stop_tokens) and got["pad_id"] == tr.pad_id
  assert (got["group_size"], got["num_prompts"], got["rows"]) == (4, 8, 32)
  assert got["max_length"] == tr.max_new_tokens
  assert got["prompt_length"] == tr.train_data.prompt_tokens.shape[1]


def test_a_renamed_fact_reaches_an_argument_of_its_earlier_name():
  def old_recipe(*, stop_ids=None, pad_id=None):
    seen.append((stop_ids, pad_id))
    return obj.get_recipe("grpo")

  def old_rule(sample, prompts, key, *, stop_ids=None):
    return None

  seen = []
  facts = dict(stop_tokens=(2, 7), pad_id=0, tokenizer=None)
  assert registry.facts_for(old_rule, facts) == {"stop_ids": (2, 7)}
  recipes.register_recipe("old_fact_names", old_recipe)
  try:
    obj.get_recipe("old_fact_names", obj.RecipeContext(stop_tokens=(2, 7), pad_id=0))
  finally:
    recipes._REGISTRY.pop("old_fact_names")
  assert seen == [((2, 7), 0)]


def test_every_source_reports_by_name(dirs):
  # MC-GRPO's chain reports its sign flips against the mean baseline; DARS's allocation its
  # stage-2 demand; ACE's penalty what it touched.
  for kw, names in ((dict(recipe="mc_grpo", group_size=5), {"median_sign_flips",
                                                            "median_zeroed"}),
                    (dict(recipe="dars", allocation="dars",
                          allocation_args=dict(n_max=8, budget=16)),
                     {"dars_demand", "dars_truncated", "dars_extra_rollouts"}),
                    (dict(recipe="ace", recipe_args={"alpha": 0.5}),
                     {"ace_penalized", "ace_shift_p50"})):
    tr = rl.make_train(learning_config(dirs, **kw), log=lambda s: None)
    _, m = tr.step(tr.init_state())
    m = jax.device_get(m)
    assert_moved(m, str(kw))
    assert names <= set(m), (kw, sorted(m))
    assert all(np.isfinite(m[k]) for k in names)
  assert 0 <= m["ace_penalized"] <= 1


def test_two_sources_of_one_metric_name_are_refused(dirs):
  def clashing(sample, prompts, key, *, num_prompts, group_size):
    a = allocate.plain(sample, prompts, key, num_prompts=num_prompts, group_size=group_size)
    return a._replace(metrics={"reward": jnp.float32(0.0)})

  allocate.register_allocation("test_clashing", clashing, calls=lambda p, g, a: (p * g,))
  try:
    tr = rl.make_train(learning_config(dirs, allocation="test_clashing"), log=lambda s: None)
    with pytest.raises(ValueError, match="metric 'reward' is reported by both the trainer and "
                                         "the allocation"):
      tr.step(tr.init_state())
  finally:
    allocate._REGISTRY.pop("test_clashing")


def test_prompt_metrics_weigh_each_prompt_once_under_ragged_groups(dirs):
  tr = rl.make_train(learning_config(dirs, recipe="dars", allocation="dars",
                                     allocation_args=dict(n_max=8, budget=16)),
                     log=lambda s: None)
  state = tr.init_state()
  key = jax.random.wrap_key_data(state.key)
  alloc = jax.jit(tr.fns.collect)(state.params, state.cursor, key, jax.random.key(1),
                                  tr.train_data)
  _, m = jax.jit(tr.fns.update)(state, alloc, tr.ref_params, jax.random.key(2),
                                jax.random.key(3))
  valid, group = np.asarray(alloc.valid), np.asarray(alloc.group_id)
  correct = np.asarray(alloc.rollouts.correct, np.float64)
  sizes = np.bincount(group[valid], minlength=8)
  assert sizes.max() > sizes[sizes > 0].min()  # ragged: some prompts got stage-2 rows
  per_prompt = [correct[valid & (group == g)].mean() for g in range(8) if sizes[g]]
  np.testing.assert_allclose(m["prompt_accuracy"], np.mean(per_prompt), rtol=1e-6)
  np.testing.assert_allclose(m["accuracy"], correct[valid].mean(), rtol=1e-6)
  # DARS drops the groups its merge left unmixed: those are the step's groups with no signal.
  mixed = [g for g in range(8) if 0 < correct[valid & (group == g)].sum() < sizes[g]]
  np.testing.assert_allclose(m["zero_advantage_groups"], 1 - len(mixed) / 8, rtol=1e-6)


def test_setup_builds_the_policy_once(dirs, monkeypatch):
  """The start, the warm start and the adapters act on one module, split into a Policy once."""
  from rlpost.models import transformer as tfm
  from rlpost.models.policy import Policy
  from rlpost.train import setup

  calls = {"init": 0, "split": 0, "merge": 0}
  init, from_model, merge = tfm.init_model, Policy.from_model.__func__, Policy.model

  def count(name, fn):
    def wrapped(*a, **k):
      calls[name] += 1
      return fn(*a, **k)
    return wrapped

  monkeypatch.setattr(tfm, "init_model", count("init", init))
  monkeypatch.setattr(Policy, "from_model", classmethod(count("split", from_model)))
  monkeypatch.setattr(Policy, "model", count("merge", merge))
  s = setup.build(rl.RLConfig(**learning_config(dirs, lora_rank=2)), lambda m: None,
                  progress=False)
  assert calls == {"init": 1, "split": 1, "merge": 0}
  assert any("lora_a" in "/".join(map(str, p)) for p, _ in jax.tree_util.tree_flatten_with_path(
      s.policy.params)[0])


def test_make_train_from_explicit_parts_matches_the_config_path(dirs):
  """``make_train(policy, task, recipe, allocation, optimizer, mesh, spec=...)`` gives the pure
  functions with no config and no Trainer; one step matches the config path's step (same
  computation, another jitted program: within float32 rounding)."""
  from rlpost import sharding
  from rlpost.train import setup

  cfg = rl.RLConfig(**learning_config(dirs, recipe="dapo", allocation="dynamic_sampling",
                                      allocation_args={"factor": 2}))
  tr = rl.make_train(cfg, log=lambda s: None)
  s = setup.build(cfg, lambda m: None, progress=False)
  fns = rl.make_train(s.policy, rl.TaskData(s.task, s.records, s.train_data, s.test_data),
                      obj.get_recipe("dapo", max_length=s.max_new_tokens),
                      ("dynamic_sampling", {"factor": 2}), tr.optimizer,
                      sharding.make_mesh(fsdp=1),
                      spec=rl.StepSpec(num_prompts=8, group_size=4,
                                       max_new_tokens=s.max_new_tokens))
  assert isinstance(fns, rl.TrainFns)
  state, m = jax.jit(fns.step)(fns.init(s.policy.params, cfg.seed), s.train_data,
                               s.policy.params)
  _, want = tr.step(tr.init_state())
  m, want = jax.device_get(m), jax.device_get(want)
  assert_moved(want, "config path")
  assert set(m) == set(want)
  for k in ("reward", "accuracy", "kept_groups", "loss", "grad_norm"):
    np.testing.assert_allclose(m[k], want[k], rtol=1e-5, atol=1e-7, err_msg=k)
  with pytest.raises(TypeError, match="needs task, recipe, optimizer, mesh and spec"):
    rl.make_train(s.policy, recipe=obj.get_recipe("grpo"))
  with pytest.raises(ValueError, match="rollout_chunk 5 must divide"):
    rl.make_train(s.policy, rl.TaskData(s.task, s.records, s.train_data, s.test_data),
                  obj.get_recipe("grpo"), "plain", tr.optimizer, sharding.make_mesh(fsdp=1),
                  spec=rl.StepSpec(num_prompts=8, group_size=4, max_new_tokens=4,
                                   rollout_chunk=5))
