"""Recipes: run facts through ``RecipeContext``, a recipe's own loss function surviving
overrides, and ``Recipe.check_provided``."""

import dataclasses
import inspect

import jax.numpy as jnp
import numpy as np
import pytest

import rlpost.objectives as O
from rlpost.objectives import recipes
from objectives_testutil import VARIANTS, make_batch


def _trainer_before(name, recipe_args, max_len):
  """What the trainer did before RecipeContext (by introspecting the registry)."""
  args = dict(recipe_args)
  params = inspect.signature(recipes._REGISTRY[name]).parameters
  if "max_length" in params and "max_length" not in args:
    args["max_length"] = max_len
  if "overlong_buffer" in params and "overlong_buffer" not in args:
    args["overlong_buffer"] = max(1, args.get("max_length", max_len) // 5)
  return O.get_recipe(name, **args)


CASES = [
    ("dapo", {}),
    ("dapo", {"max_length": 8}),
    ("dapo", {"max_length": 8, "overlong_buffer": 3}),
    ("dapo", {"overlong_buffer": 4}),
    ("mc_grpo", {"base": "dapo"}),
    ("mc_grpo", {"base": "dapo", "max_length": 9}),
    ("mc_grpo", {}),
    ("ace", {"alpha": 0.5, "base": "dapo"}),
    ("dr_grpo", {}),
    ("dars", {}),
    ("grpo", {"kl_coef": 0.0}),
]


def _long_batch(seq_len):
  """Lengths 1..seq_len, so overlong shaping of any buffer acts on some rollouts."""
  lengths = list(range(1, seq_len + 1))
  rewards = [[float(i % 2) for i in range(seq_len)]]
  return make_batch(rewards, seq_len, seq_len=seq_len, lengths=lengths, seed=4)


@pytest.mark.parametrize("name,args", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_context_gives_what_the_trainer_computed(name, args):
  max_len = 10
  old = _trainer_before(name, args, max_len)
  new = O.get_recipe(name, O.RecipeContext(max_length=max_len, group_size=4), **args)
  assert new.loss_config == old.loss_config and new.requires == old.requires
  assert new.name == name and new.loss is old.loss is O.policy_loss
  b = _long_batch(max_len)
  a_old, _ = O.compute_advantages(old.advantage, b)
  a_new, _ = O.compute_advantages(new.advantage, b)
  np.testing.assert_array_equal(a_new.values, a_old.values)
  np.testing.assert_array_equal(a_new.weights, a_old.weights)


def test_overlong_buffer_defaults_to_the_papers_ratio():
  assert O.default_overlong_buffer(20480) == 4096 and O.default_overlong_buffer(4) == 1
  b = _long_batch(10)

  def adv(**kw):
    return np.asarray(O.compute_advantages(O.get_recipe("dapo", **kw).advantage, b)[0].values)

  np.testing.assert_array_equal(adv(max_length=10), adv(max_length=10, overlong_buffer=2))
  assert not np.array_equal(adv(max_length=10), adv(max_length=10, overlong_buffer=4))
  # The paper's setting: L_max 20480 keeps the 4096-token buffer.
  long = make_batch([[0.0, 1.0, 0.0, 1.0]], 4, seq_len=20480, lengths=[16384, 16385, 18432,
                                                                      20480], logps=False)
  got = O.compute_advantages(O.get_recipe("dapo", max_length=20480).advantage, long)[0]
  want = O.compute_advantages(
      O.get_recipe("dapo", max_length=20480, overlong_buffer=4096).advantage, long
  )[0]
  other = O.compute_advantages(
      O.get_recipe("dapo", max_length=20480, overlong_buffer=2048).advantage, long
  )[0]
  np.testing.assert_array_equal(got.values, want.values)
  assert not np.array_equal(got.values, other.values)


def test_context_rules():
  ctx = O.RecipeContext(max_length=100, group_size=8)
  assert O.get_recipe("dr_grpo", ctx).loss_config.max_length == 100
  assert O.get_recipe("dr_grpo", ctx, max_length=50).loss_config.max_length == 50  # override wins
  assert O.get_recipe("grpo", ctx).loss_config == O.get_recipe("grpo").loss_config  # not taken
  assert O.get_recipe("dars", context=ctx).loss_config.max_length == 100
  with pytest.raises(ValueError, match="needs max_length"):
    O.get_recipe("dr_grpo", O.RecipeContext(group_size=8))
  with pytest.raises(ValueError, match=r"unknown override\(s\) \['clip_eps'\] for recipe 'grpo'"):
    O.get_recipe("grpo", ctx, clip_eps=0.3)
  with pytest.raises(ValueError, match="unknown recipe 'grpoo'"):
    O.get_recipe("grpoo", ctx)
  with pytest.raises(TypeError, match="RecipeContext"):
    O.get_recipe("grpo", {"max_length": 100})
  with pytest.raises(dataclasses.FrozenInstanceError):
    ctx.max_length = 3


def group_scaled(*, group_size=None, eps_high: float = 0.2):
  """Toy factory taking a context fact: eps_high / G. Paper: none. Official code: none."""
  return O.make_recipe(
      "group_scaled",
      O.center_by_group_mean(),
      O.PolicyLossConfig(eps_high=eps_high / (group_size or 1)),
  )


# A recipe that brings its own loss function.


def length_cost_loss(logp, batch, advantages, sample_weight, *, config, entropy=None):
  """policy_loss's terms plus a cost of 0.01 per valid token (metric "length_cost")."""
  x = O.loss_inputs(logp, batch, advantages, sample_weight, entropy=entropy)
  cost = 0.01 * x.token_mask.astype(jnp.float32)
  terms = O.policy_terms(x, batch, config=config) + (
      O.Term(values=cost, metrics={"length_cost": cost}),
  )
  return O.sum_terms(terms, x, aggregation=config.aggregation, max_length=config.max_length)


def length_grpo(*, std_eps: float = 1e-6):
  """GRPO with a per-token length cost (example). Paper: none. Official code: none."""
  return O.make_recipe(
      "length_grpo",
      O.chain(O.center_by_group_mean(), O.scale_by_group_std(eps=std_eps)),
      O.PolicyLossConfig(kl_coef=0.0),
      loss=length_cost_loss,
  )


@pytest.fixture
def registered():
  O.register_recipe("length_grpo", length_grpo)
  O.register_recipe("group_scaled", group_scaled)
  yield
  recipes._REGISTRY.pop("length_grpo")
  recipes._REGISTRY.pop("group_scaled")


def test_context_fact_reaches_a_factory_that_takes_it(registered):
  r = O.get_recipe("group_scaled", O.RecipeContext(max_length=7, group_size=4))
  assert r.loss_config.eps_high == pytest.approx(0.05)
  assert O.get_recipe("group_scaled", O.RecipeContext(group_size=4), group_size=2).loss_config \
      .eps_high == pytest.approx(0.1)


@VARIANTS
def test_overrides_keep_the_recipes_own_loss(variant, registered):
  r = O.get_recipe("length_grpo", O.RecipeContext(max_length=6), eps_high=0.28, kl_coef=0.02)
  assert r.loss is length_cost_loss and r.loss_config.eps_high == 0.28
  assert r.requires == ("ref_logp",)  # from kl_coef
  assert r.loss_fn is r.loss_fn  # bound once
  b = make_batch([[1, 0, 0.5], [1, 1, 0]], 3, seq_len=5, seed=8)
  logp = b.current_logp + 0.3

  def run(b, logp):
    adv, _ = O.compute_advantages(r.advantage, b)
    return r.loss_fn(logp, b, adv.values, adv.weights)

  parts, metrics = variant(run)(b, logp)
  assert "length_cost" in metrics and "kl" in metrics
  np.testing.assert_allclose(O.finalize(metrics["length_cost"]), 0.01, rtol=1e-5)
  adv, _ = O.compute_advantages(r.advantage, b)
  want, _ = length_cost_loss(logp, b, adv.values, adv.weights, config=r.loss_config)
  std, _ = O.policy_loss(logp, b, adv.values, adv.weights, config=r.loss_config)
  np.testing.assert_allclose(parts, want, rtol=1e-6)
  assert not np.allclose(parts.sum, std.sum)
  again = r.with_loss(eps_high=0.3)
  assert again.loss is length_cost_loss and again.loss_config.eps_high == 0.3


def test_make_recipe_inputs_and_check_provided():
  adv = O.center_by_group_mean()
  r = O.make_recipe("r", adv, O.PolicyLossConfig(), loss_requires=("ref_logp",))
  assert r.requires == ("ref_logp",) and r.loss_inputs == ("ref_logp",)
  assert r.with_loss(eps_high=0.3).requires == ("ref_logp",)
  r2 = O.make_recipe("r2", adv, O.PolicyLossConfig(tis_cap=2.0), advantage_requires=("key",))
  assert r2.requires == ("behaviour_logp", "current_logp", "key")
  with pytest.raises(ValueError, match=r"recipe 'r2' needs current_logp, key"):
    r2.check_provided({"behaviour_logp", "ref_logp"})
  r2.check_provided({"behaviour_logp", "current_logp", "key"})
  with pytest.raises(ValueError, match=r"unknown input\(s\) \['ref_lopg'\]"):
    O.make_recipe("r3", adv, O.PolicyLossConfig(), advantage_requires=("ref_lopg",))
  with pytest.raises(TypeError, match="loss must be callable"):
    O.make_recipe("r4", adv, O.PolicyLossConfig(), loss="policy_loss")
  grpo = O.get_recipe("grpo")
  with pytest.raises(ValueError, match=r"recipe 'grpo' needs ref_logp.*provided: none"):
    grpo.check_provided(set())
  grpo.check_provided({"ref_logp", "current_logp", "behaviour_logp", "entropy", "key"})
  assert grpo.loss is O.policy_loss
