"""The trainer honours the objective contract: a stateful advantage chain's state is carried
and checkpointed, everything a recipe requires is computed (TIS's ``current_logp``)."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlpost import objectives as obj
from rlpost.train import loop, rl
from rl_testutil import assert_moved, learning_config


class Baseline(NamedTuple):
  mean: jax.Array  # [] float32 running mean reward
  count: jax.Array  # [] int32 steps seen


def running_baseline(decay: float = 0.5) -> obj.AdvantageTransform:
  """A_i = r_i - b with b an exponential average of past steps' mean rewards (0 at step 1)."""

  def init():
    return Baseline(jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32))

  def update(adv, state, batch, key=None):
    w = adv.weights
    batch_mean = jnp.sum(batch.rewards * w) / jnp.maximum(jnp.sum(w), 1.0)
    mean = jnp.where(state.count > 0, decay * state.mean + (1 - decay) * batch_mean, batch_mean)
    return adv._replace(values=adv.values - state.mean), Baseline(mean, state.count + 1)

  return obj.AdvantageTransform(init=init, update=update)


def _register():
  if "running_baseline_test" not in obj.list_recipes():
    obj.register_recipe("running_baseline_test", lambda: obj.make_recipe(
        "running_baseline_test", running_baseline(), obj.PolicyLossConfig(kl_coef=0.0)))


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("contract")
  return dict(data_dir=str(root / "data"), cache_dir=str(root / "cache"))


def test_advantage_state_is_carried_and_checkpointed(dirs, tmp_path):
  _register()
  cfg = learning_config(dirs, recipe="running_baseline_test", steps=3, eval_every=100,
                        checkpoint_every=1)
  tr = rl.make_train(cfg, log=lambda s: None)
  state = tr.init_state()
  rewards = []
  for _ in range(3):
    state, m = tr.step(state)
    assert_moved(m)
    rewards.append(float(m["reward"]))
  # The chain's state after 3 steps is the running mean of the steps' mean rewards.
  want = rewards[0]
  for r in rewards[1:]:
    want = 0.5 * want + 0.5 * r
  assert int(state.adv_state.count) == 3
  np.testing.assert_allclose(float(state.adv_state.mean), want, rtol=1e-6)
  # A run stopped after 2 steps resumes with the chain's state of step 2: same end state.
  loop.run(rl.make_train(dict(cfg, steps=2), log=lambda s: None), str(tmp_path / "r"),
           progress=False)
  resumed = loop.run(rl.make_train(cfg, log=lambda s: None), str(tmp_path / "r"), progress=False)
  assert resumed["resumed_from"] == 2
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(resumed["state"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_tis_cap_gets_the_trainers_log_probs(dirs):
  tr = rl.make_train(learning_config(dirs, recipe_args={"tis_cap": 2.0}), log=lambda s: None)
  assert "current_logp" in tr.recipe.requires
  state, m = tr.step(tr.init_state())
  assert_moved(m)
  # Same parameters for sampler and trainer: the truncated weights exp(current - behaviour)
  # are 1 up to the two programs' rounding.
  assert abs(float(m["tis_weight"]) - 1.0) < 1e-3, float(m["tis_weight"])


def entropy_weighted_tokens() -> obj.AdvantageTransform:
  """Token-level advantages: the group-centred reward times the sampling policy's per-token
  entropy (a chain that reads ``batch.entropy`` and returns [B, T])."""

  def fn(adv, batch, key):
    return adv._replace(values=adv.values[:, None] * batch.entropy)

  return obj.stateless(fn)


def test_token_level_advantages_from_the_chains_entropy(dirs):
  if "entropy_tokens_test" not in obj.list_recipes():
    obj.register_recipe("entropy_tokens_test", lambda: obj.make_recipe(
        "entropy_tokens_test", obj.chain(obj.center_by_group_mean(), entropy_weighted_tokens()),
        obj.PolicyLossConfig(kl_coef=0.0), advantage_requires=("entropy",)))
  tr = rl.make_train(learning_config(dirs, recipe="entropy_tokens_test"), log=lambda s: None)
  assert tr.recipe.requires == ("entropy",)
  state, m = tr.step(tr.init_state())
  assert_moved(m)
  assert np.isfinite(float(m["loss"])) and float(m["adv_abs"]) > 0


def test_a_recipe_needing_what_the_trainer_does_not_compute_is_rejected_at_validation(dirs):
  if "needs_values_test" not in obj.list_recipes():
    obj.register_recipe("needs_values_test", lambda: obj.get_recipe("grpo").replace(
        name="needs_values_test", advantage_requires=("values",)))
  with pytest.raises(ValueError, match="config key 'recipe'.*needs values"):
    rl.make_train(learning_config(dirs, recipe="needs_values_test"), log=lambda s: None)
