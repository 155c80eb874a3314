"""Metrics reported by advantage transforms (``obj.report``), the built-ins' reports against
hand values, the trainer's per-prompt and zero-advantage diagnostics, and registries that
tolerate re-import."""

import importlib
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlpost import objectives as obj
from rlpost.objectives import recipes
from rlpost.tasks import base as task_base


def batch(rewards, group_id, valid=None, t=2, logp=None):
  b = len(rewards)
  return obj.RolloutBatch(group_id=np.asarray(group_id, np.int32),
                          valid=np.ones(b, bool) if valid is None else np.asarray(valid, bool),
                          tokens=np.zeros((b, t), np.int32), token_mask=np.ones((b, t), bool),
                          rewards=np.asarray(rewards, np.float32),
                          behaviour_logp=(np.full((b, t), -1.0, np.float32) if logp is None
                                          else np.asarray(logp, np.float32)),
                          ref_logp=np.full((b, t), -1.0, np.float32))


def reporter(name, value_fn):
  return obj.stateless(lambda adv, b, key: obj.report(adv, **{name: value_fn(adv)}))


def fresh(adv, b, key):  # a stage that builds a new Advantages, as older transforms do
  return obj.Advantages(values=adv.values * 2.0, weights=adv.weights)


@pytest.mark.parametrize("jit", [False, True])
def test_a_chain_keeps_every_stage_report(jit):
  chain = obj.chain(reporter("first", lambda a: jnp.sum(a.values)),
                    obj.stateless(fresh),
                    reporter("second", lambda a: jnp.sum(a.values)))
  fn = lambda b: obj.compute_advantages(chain, b)[0]  # noqa: E731
  adv = (jax.jit(fn) if jit else fn)(batch([1.0, 0.0, 2.0], [0, 0, 1]))
  assert set(adv.metrics) == {"first", "second"}
  np.testing.assert_allclose(adv.metrics["first"], 3.0)
  np.testing.assert_allclose(adv.metrics["second"], 6.0)
  assert adv.metrics["first"].dtype == jnp.float32


@pytest.mark.parametrize("jit", [False, True])
def test_median_reports_its_sign_flips_against_the_mean(jit):
  # Group 0: 0, 0, 1 (mean 1/3, median 0) -> A = 0, 0, 1: two zeroed, no flip.
  # Group 1: 0, 1, 1 (mean 2/3, median 1) -> A = -1, 0, 0: two zeroed, no flip.
  # Group 2: 0, 0.5, 0.6, 1 (mean 0.525, lower median 0.5) -> A = -0.5, 0, 0.1, 0.5: one
  # zeroed (0.5, below the mean), no flip. 10 rows counted, 5 zeroed.
  b = batch([0, 0, 1, 0, 1, 1, 0, 0.5, 0.6, 1], [0, 0, 0, 1, 1, 1, 2, 2, 2, 2])
  t = obj.center_by_group_median(even="lower")
  fn = lambda b: obj.compute_advantages(t, b)[0]  # noqa: E731
  adv = (jax.jit(fn) if jit else fn)(b)
  np.testing.assert_allclose(adv.metrics["median_zeroed"], 5 / 10)
  np.testing.assert_allclose(adv.metrics["median_sign_flips"], 0.0)
  # 0, 0.2, 0.3, 1 (mean 0.375, lower median 0.2) -> A = -0.2, 0, 0.1, 0.8: 0.3 lies below the
  # mean but above the median, a flip; 0.2 is zeroed.
  adv = fn(batch([0, 0.2, 0.3, 1], [0, 0, 0, 0]))
  np.testing.assert_allclose(adv.metrics["median_sign_flips"], 1 / 4)
  np.testing.assert_allclose(adv.metrics["median_zeroed"], 1 / 4)


def test_ace_reports_what_its_penalty_touched():
  b = batch([1.0, 0.0, 0.0, 1.0], [0, 0, 0, 0],
            logp=[[-1, -1], [-0.5, -0.5], [-2, -2], [-1, -1]])
  recipe = obj.get_recipe("ace", alpha=0.5)
  adv, _ = obj.compute_advantages(recipe.advantage, b)
  # The two wrong rollouts have negative advantages; their shifts c = sum(logp - ref) are
  # +1 and -2.
  np.testing.assert_allclose(adv.metrics["ace_penalized"], 0.5)
  q = np.quantile([1.0, -2.0], [0.1, 0.5, 0.9])
  np.testing.assert_allclose([adv.metrics[f"ace_shift_p{p}"] for p in (10, 50, 90)], q,
                             rtol=1e-6)


def test_zero_advantage_groups_count_what_the_loss_sees():
  values = jnp.asarray([0.0, 0.0, 0.3, -0.3, 0.5, 0.0])
  weights = jnp.asarray([1.0, 1.0, 1.0, 1.0, 0.0, 1.0])  # row 4 is excluded from the loss
  group = jnp.asarray([0, 0, 1, 1, 2, 2])
  mask = jnp.ones((6, 2), bool)
  # Group 0 all zero, group 1 has signal, group 2's only nonzero row has weight 0.
  np.testing.assert_allclose(obj.zero_advantage_fraction(values, weights, mask, group), 2 / 3)
  # Per-token values: a row counts when any of its generated tokens is nonzero.
  token_adv = jnp.zeros((6, 2)).at[0, 1].set(1.0)
  np.testing.assert_allclose(obj.zero_advantage_fraction(token_adv, weights, mask, group), 2 / 3)
  np.testing.assert_allclose(
      obj.zero_advantage_fraction(token_adv, weights, mask.at[0, 1].set(False), group), 1.0)
  # An allocation that drops every group (all weights 0) leaves nothing to learn: 1, not 0/0.
  np.testing.assert_allclose(obj.zero_advantage_fraction(values, jnp.zeros(6), mask, group), 1.0)


def test_per_prompt_mean_weighs_each_prompt_once():
  x = jnp.asarray([1.0, 1.0, 1.0, 0.0, 0.0])
  group = jnp.asarray([0, 0, 0, 1, 1])
  valid = jnp.asarray([True, True, True, True, False])
  np.testing.assert_allclose(obj.per_prompt_mean(x, group, valid), 0.5)  # rows would give 0.75
  np.testing.assert_allclose(obj.per_prompt_mean(x, group, jnp.zeros(5, bool)), 0.0)


RECIPE_MODULE = textwrap.dedent('''
    from rlpost import objectives as obj

    def again():
      return obj.get_recipe("grpo")

    obj.register_recipe("test_again", again)
''')

TASK_MODULE = textwrap.dedent('''
    from rlpost.tasks import base

    @base.register_task
    class Again(base.Task):
      name = "test_again_task"

      def load(self, log):
        return {"train": [], "test": []}

      def score(self, completion, finished, record):
        return 0.0
''')


@pytest.mark.parametrize("kind", ["recipe", "task"])
def test_registries_tolerate_reimport(kind, tmp_path, monkeypatch):
  module = f"test_again_{kind}"
  (tmp_path / f"{module}.py").write_text(RECIPE_MODULE if kind == "recipe" else TASK_MODULE)
  monkeypatch.syspath_prepend(str(tmp_path))
  registry = recipes._REGISTRY if kind == "recipe" else task_base._REGISTRY
  name = "test_again" if kind == "recipe" else "test_again_task"
  try:
    mod = importlib.import_module(module)
    importlib.reload(mod)  # a notebook cell run twice: the new objects replace the old
    assert registry[name] is (mod.again if kind == "recipe" else mod.Again)
    with pytest.raises(ValueError, match=f"{kind} '{name}' is already registered"):
      if kind == "recipe":
        obj.register_recipe(name, recipes.grpo)
      else:
        task_base.register_task(type("Other", (mod.Again,), {}))
  finally:
    registry.pop(name, None)
    sys.modules.pop(module, None)
