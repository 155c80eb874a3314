"""Recipes: defaults, the registry's errors and every recipe end to end under jit (a new
objective's file and test are README examples, run by tests/test_readme_examples.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rlpost.objectives as O
from rlpost.objectives import recipes
from objectives_testutil import make_batch

TOY = {"max_length": 6, "overlong_buffer": 2}
NEEDS = {
    "dapo": {"max_length": 6, "overlong_buffer": 2},
    "dr_grpo": {"max_length": 6},
    "dars": {"max_length": 6},
    "ace": {"alpha": 0.5},
}


def test_registry_lists_every_method():
  assert set(O.list_recipes()) >= {
      "grpo",
      "dr_grpo",
      "dapo",
      "gspo",
      "gspo_token",
      "pnpo",
      "rloo",
      "mc_grpo",
      "ace",
      "dars",
  }


def test_unknown_recipe_and_override_errors():
  with pytest.raises(ValueError, match=r"unknown recipe 'grpoo'; registered recipes: .*grpo"):
    O.get_recipe("grpoo")
  with pytest.raises(ValueError, match=r"unknown override\(s\) \['clip_eps'\] for recipe 'grpo'"):
    O.get_recipe("grpo", clip_eps=0.3)
  with pytest.raises(ValueError, match="needs max_length"):
    O.get_recipe("dr_grpo")
  with pytest.raises(ValueError, match="needs alpha"):
    O.get_recipe("ace")
  with pytest.raises(ValueError, match="unknown base 'ppo'"):
    O.get_recipe("mc_grpo", base="ppo")


def test_defaults_follow_the_papers_and_official_code():
  c = O.get_recipe("grpo").loss_config
  assert (c.ratio, c.eps_low, c.eps_high, c.aggregation, c.kl_coef, c.kl_estimator) == (
      "token",
      0.2,
      0.2,
      "seq_mean_token_mean",
      0.04,
      "k3",
  )
  c = O.get_recipe("dapo", max_length=100, overlong_buffer=20).loss_config
  assert (c.eps_low, c.eps_high, c.aggregation, c.dual_clip, c.kl_coef) == (
      0.2,
      0.28,
      "token_mean",
      3.0,
      0.0,
  )
  c = O.get_recipe("dr_grpo", max_length=100).loss_config
  assert (c.aggregation, c.max_length, c.kl_coef) == ("seq_sum_const_len", 100, 0.0)
  c = O.get_recipe("gspo").loss_config
  assert (c.ratio, c.eps_low, c.eps_high) == ("sequence", 3e-4, 4e-4)
  assert O.get_recipe("gspo_token").loss_config.ratio == "sequence_token"
  assert O.get_recipe("pnpo").loss_config.ratio == "prefix"
  c = O.get_recipe("dars", max_length=100).loss_config
  assert (c.eps_low, c.aggregation, c.entropy_coef, c.kl_coef) == (
      0.2,
      "seq_sum_const_len",
      0.001,
      0.0,
  )
  assert O.get_recipe("dars", max_length=100).requires == ("entropy",)
  assert O.get_recipe("grpo").requires == ("ref_logp",)
  assert O.get_recipe("grpo", kl_coef=0.0).requires == ()
  assert O.get_recipe("ace", alpha=1.0, kl_coef=0.0).requires == ("ref_logp",)
  c = O.get_recipe("mc_grpo", base="dapo", max_length=100, overlong_buffer=20).loss_config
  assert (c.eps_high, c.aggregation) == (0.28, "token_mean")
  for name in O.list_recipes():
    doc = getattr(recipes, name).__doc__
    assert doc and ("code" in doc.lower()), name


def test_overrides_reach_factory_and_loss():
  r = O.get_recipe("dapo", max_length=8, overlong_buffer=2, eps_high=0.3, kl_coef=0.01)
  assert r.loss_config.eps_high == 0.3 and r.loss_config.kl_coef == 0.01
  assert r.name == "dapo" and "ref_logp" in r.requires
  with pytest.raises(ValueError, match="unknown aggregation"):
    O.get_recipe("grpo", aggregation="sum")


CASES = [
    ("grpo", {}),
    ("dr_grpo", NEEDS["dr_grpo"]),
    ("dapo", NEEDS["dapo"]),
    ("gspo", {}),
    ("gspo_token", {}),
    ("pnpo", {}),
    ("rloo", {}),
    ("mc_grpo", {}),
    ("mc_grpo", {"base": "dapo", **TOY}),
    ("mc_grpo", {"base": "dr_grpo", "max_length": 6}),
    ("mc_grpo", {"baseline": "mean"}),
    ("ace", {"alpha": 0.5}),
    ("ace", {"alpha": 0.5, "base": "dapo", "mode": "additive", "fn": "relu", **TOY}),
    ("dars", NEEDS["dars"]),
]


@pytest.mark.parametrize(
    "name,overrides", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)]
)
def test_every_recipe_trains_one_step_under_jit(name, overrides):
  recipe = O.get_recipe(name, **overrides)
  b = make_batch([[1, 0, 0], [1, 1, 0], [0.5, 0, 1]], 3, seq_len=6, seed=11)
  noise = jnp.asarray(np.random.default_rng(0).normal(size=b.token_mask.shape), jnp.float32)
  ent = jnp.ones(b.token_mask.shape) * 0.7

  @jax.jit
  def step(logp, batch):
    adv, _ = O.compute_advantages(recipe.advantage, batch)

    def loss(lp):
      parts, metrics = recipe.loss_fn(lp, batch, adv.values, adv.weights, entropy=ent)
      return O.finalize(parts), O.finalize_metrics(metrics)

    (value, metrics), grad = jax.value_and_grad(loss, has_aux=True)(logp)
    return value, grad, metrics, adv

  value, grad, metrics, adv = step(b.current_logp + 0.1 * noise, b)
  assert np.isfinite(value) and np.all(np.isfinite(grad))
  assert all(np.isfinite(v) for v in metrics.values())
  assert "pg_loss" in metrics and "clip_frac_high" in metrics
  if name == "mc_grpo" and overrides.get("baseline", "median") == "median":
    np.testing.assert_array_equal(np.asarray(adv.weights).reshape(3, 3).sum(1), [2, 2, 2])


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", ["grpo", "mc_grpo"])
def test_injected_sign_flips(name, jit):
  batch = make_batch([[1.0, 0.0, 0.0], [0.5, 1.0, 0.0]], 3)
  key = jax.random.key(3)

  def adv(prob):
    r = O.get_recipe(name, signflip_prob=prob)
    fn = lambda b, k: O.compute_advantages(r.advantage, b, key=k)[0]
    out = (jax.jit(fn) if jit else fn)(batch, key)
    return np.asarray(out.values), np.asarray(out.weights)

  clean, w = adv(0.0)
  flipped, w1 = adv(1.0)
  np.testing.assert_array_equal(w, w1)
  np.testing.assert_allclose(flipped, -clean, atol=0)  # probability 1 negates every advantage
  assert np.any(clean != 0)
  half, _ = adv(0.5)
  assert np.all((half == clean) | (half == -clean))
  with pytest.raises(ValueError, match="flip probability"):
    O.get_recipe(name, signflip_prob=1.5)
