"""The allocation registry: built-in rules as plug-ins, declared plans, argument checks, the
rows check at trace time, and registration that tolerates re-import."""

import dataclasses
import importlib
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlpost.rollouts import allocate
from rlpost.train import config as config_lib
from rlpost.train.rl_config import RLConfig


def fake_sampler(idx, key):
  """Prompt i is right on every row when i is odd; rows carry their prompt id."""
  del key
  r = idx.shape[0]
  ok = idx % 2 == 1
  return allocate.Rollouts(idx, jnp.zeros((r, 2), jnp.int32), jnp.ones((r, 2), bool),
                           {"tokens": jnp.zeros((r, 3), jnp.int32)}, ok.astype(jnp.float32), ok)


def stream(k):
  return jnp.arange(k, dtype=jnp.int32) % 10


def test_builtins_are_registered_with_their_plans():
  assert set(allocate.list_allocations()) >= {"plain", "dynamic_sampling", "dars", "dars_b"}
  p, g = 4, 3
  plans = {name: allocate.get_allocation(name).plan(allocate.get_allocation(name).parse(args),
                                                    p, g)
           for name, args in (("plain", {}), ("dynamic_sampling", {"factor": 2}),
                              ("dars", {"n_max": 5}), ("dars_b", {"n_max": 5, "budget": 6}))}
  assert plans["plain"] == allocate.Plan((12,), 12)
  assert plans["dynamic_sampling"] == allocate.Plan((24,), 12)  # k P G sampled, P G kept
  assert plans["dars"] == allocate.Plan((12, 8), 20)  # budget 0: P (n_max - G)
  assert plans["dars_b"] == allocate.Plan((12, 6), 18)
  with pytest.raises(ValueError, match="unknown allocation 'nope'; registered: .*plain"):
    allocate.get_allocation("nope")


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("name, args", [("plain", {}), ("dynamic_sampling", {"factor": 2}),
                                        ("dars", {"n_max": 4, "budget": 4})])
def test_each_rule_returns_the_rows_it_declares(jit, name, args):
  rule = allocate.get_allocation(name)
  a_ = rule.parse(args)
  run = lambda key: rule(a_, fake_sampler, stream, key, num_prompts=4, group_size=2)  # noqa
  out = (jax.jit(run) if jit else run)(jax.random.key(0))
  rows = rule.plan(a_, 4, 2).rows
  assert out.group_id.shape == out.valid.shape == out.rollouts.rewards.shape == (rows,)
  assert int(jnp.max(out.group_id)) < 4


def mixed_sampler(idx, key):
  """Odd prompts are always right; even prompts are right on every third row (so stage 1 leaves
  them all wrong and stage 2 can rescue them)."""
  del key
  r = idx.shape[0]
  ok = (idx % 2 == 1) | ((idx % 2 == 0) & (jnp.arange(r) % 3 == 2))
  return allocate.Rollouts(idx, jnp.zeros((r, 2), jnp.int32), jnp.ones((r, 2), bool),
                           {"tokens": jnp.zeros((r, 3), jnp.int32)}, ok.astype(jnp.float32), ok)


def test_the_registered_dars_rule_matches_the_function():
  # Both sides run the same eager computation on one device: the registry adds no arithmetic,
  # so the outputs agree exactly.
  rule = allocate.get_allocation("dars")
  got = rule(rule.parse({"schedule": "hw", "n_max": 6, "budget": 5}), mixed_sampler, stream,
             jax.random.key(1), num_prompts=3, group_size=2)
  want = allocate.dars(mixed_sampler, stream, jax.random.key(1), num_prompts=3, group_size=2,
                       n_max=6, schedule="hw", budget=5)
  # Something moved: stage 2 drew rows, and some merged group is mixed (kept for the update).
  assert float(want.metrics["dars_extra_rollouts"]) > 0 and bool(jnp.any(want.valid))
  for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(x, y)


def test_a_rule_that_returns_other_rows_than_declared_is_named():
  def short(sample, prompts, key, *, num_prompts, group_size):
    a = allocate.plain(sample, prompts, key, num_prompts=num_prompts, group_size=group_size)
    return jax.tree.map(lambda x: x[:-1] if jnp.ndim(x) else x, a)

  rule = allocate.Rule("short", short, calls=lambda p, g, a: (p * g,))
  with pytest.raises(ValueError, match=r"allocation 'short' returned 7 rows .* declares 8"):
    rule(None, fake_sampler, stream, jax.random.key(0), num_prompts=4, group_size=2)


def test_arguments_are_checked_naming_the_key():
  dars = allocate.get_allocation("dars")
  with pytest.raises(ValueError, match=r"allocation 'dars': unknown argument key\(s\) \['nmax'\]"):
    dars.parse({"nmax": 3})
  with pytest.raises(ValueError, match=r"allocation 'dars': argument 'n_max' must be an int"):
    dars.parse({"n_max": "many"})
  with pytest.raises(ValueError, match="allocation 'dars': schedule must be 'et' or 'hw'"):
    dars.parse({"schedule": "xx"})
  with pytest.raises(ValueError, match="allocation 'plain' takes no arguments"):
    allocate.get_allocation("plain").parse({"factor": 2})


def _cfg(**kw) -> RLConfig:
  return config_lib.from_dict(RLConfig, kw)


def test_the_config_validates_the_rule_before_any_work():
  with pytest.raises(ValueError, match="^config key 'allocation': unknown allocation 'x'"):
    _cfg(allocation="x")
  with pytest.raises(ValueError, match="^config key 'allocation_args': allocation 'dars': n_max "
                                       r"\(4\) must be >= group_size \(8\)"):
    _cfg(recipe="dars", allocation="dars", allocation_args={"n_max": 4})
  with pytest.raises(ValueError, match=r"^config key 'num_minibatches': DARS-B \(allocation "
                                       r"'dars_b'\) updates on the full batch"):
    _cfg(recipe="dars", allocation="dars_b", num_minibatches=2)
  with pytest.raises(ValueError, match="^config key 'allocation_args': allocation 'dars': n_max "
                                       "equals group_size"):
    _cfg(recipe="dars", allocation="dars", allocation_args={"n_max": 8, "budget": 16})
  # rollout_chunk must divide every sampling call the rule declares: 16 * 8 * 3 = 384 rows.
  assert _cfg(allocation="dynamic_sampling", rollout_chunk=96).rollout_chunk == 96
  with pytest.raises(ValueError, match=r"^config key 'rollout_chunk': .*\[384\]"):
    _cfg(allocation="dynamic_sampling", rollout_chunk=100)
  # DARS: the stage-2 call of P (n_max - G) = 16 * 8 rows as well as stage 1's 128.
  with pytest.raises(ValueError, match=r"^config key 'rollout_chunk': .*\[128, 128\]"):
    _cfg(recipe="dars", allocation="dars", allocation_args={"n_max": 16}, rollout_chunk=48)
  # The step's batch (P G + stage 2 = 128 + 8 rows) must split into the mini-batches.
  with pytest.raises(ValueError, match="^config key 'num_minibatches': must divide the rollout "
                                       "batch of 136 rows"):
    _cfg(recipe="dars", allocation="dars", allocation_args={"n_max": 16, "budget": 8},
         num_minibatches=3)


def test_a_recipe_that_declares_its_allocations_needs_one_of_them():
  with pytest.raises(ValueError, match=r"^config key 'allocation': recipe 'dars' runs with one "
                                       r"of the allocations \['dars', 'dars_b', 'plain'\]"):
    _cfg(recipe="dars")
  with pytest.raises(ValueError, match="not 'dynamic_sampling'"):
    _cfg(recipe="dars", allocation="dynamic_sampling")
  assert _cfg(recipe="dars", allocation="plain").allocation == "plain"
  assert _cfg(recipe="dapo", allocation="dars").allocation == "dars"  # dapo declares none


def test_older_configs_are_read_in_todays_keys():
  up = RLConfig.upgrade
  assert up(dict(recipe="dars", dars_schedule="hw", dars_n_max=16, dars_budget=8)) == dict(
      recipe="dars", allocation="dars", allocation_args=dict(schedule="hw", n_max=16, budget=8))
  assert up(dict(dynamic_sampling_factor=3)) == dict(
      allocation="dynamic_sampling", allocation_args=dict(factor=3))
  # A stored config of a plain run: DARS's objective names its plain allocation, others none.
  assert up(dict(recipe="dars", dars_schedule="", dynamic_sampling_factor=1))["allocation"] == \
      "plain"
  assert up(dict(recipe="grpo", dars_schedule="", dynamic_sampling_factor=1))["allocation"] == ""
  assert up(dict(recipe="grpo")) == dict(recipe="grpo")
  with pytest.raises(ValueError, match="exclusive"):
    up(dict(dars_schedule="et", dynamic_sampling_factor=2))
  with pytest.raises(ValueError, match="conflict with 'allocation'"):
    up(dict(dars_schedule="et", allocation="plain"))
  c = _cfg(recipe="dars", dars_schedule="et", dars_n_max=16)
  assert (c.allocation, c.allocation_args) == ("dars", dict(schedule="et", n_max=16, budget=0,
                                                                  chunk=0))
  # A factor the old keys refused is refused still, by the rule's arguments.
  with pytest.raises(ValueError, match="factor must be >= 1"):
    _cfg(dynamic_sampling_factor=0)
  # Arguments are stored with the rule's defaults filled in, however few were spelled out.
  assert _cfg(allocation="dynamic_sampling").allocation_args == {"factor": 3}


MODULE = textwrap.dedent('''
    import dataclasses
    from rlpost.rollouts import allocate

    @dataclasses.dataclass(frozen=True)
    class Args:
      repeat: int = 1

    def twice(sample, prompts, key, *, num_prompts, group_size, repeat):
      return allocate.plain(sample, prompts, key, num_prompts=num_prompts, group_size=group_size)

    allocate.register_allocation("test_twice", twice, args=Args,
                                 calls=lambda p, g, a: (p * g,))
''')


def test_registration_tolerates_reimport_and_refuses_another_owner(tmp_path, monkeypatch):
  (tmp_path / "reimported_rule.py").write_text(MODULE)
  monkeypatch.syspath_prepend(str(tmp_path))
  try:
    mod = importlib.import_module("reimported_rule")
    first = allocate.get_allocation("test_twice")
    importlib.reload(mod)  # a notebook cell run again
    assert allocate.get_allocation("test_twice") is not first
    assert allocate.get_allocation("test_twice").fn is mod.twice
    with pytest.raises(ValueError, match="allocation 'test_twice' is already registered "
                                         r"\(by reimported_rule.twice\)"):
      allocate.register_allocation("test_twice", allocate.plain, calls=lambda p, g, a: (p * g,))
    with pytest.raises(TypeError, match="args must be a dataclass"):
      allocate.register_allocation("test_bad", allocate.plain, args=dict,
                                   calls=lambda p, g, a: (p * g,))
  finally:
    allocate._REGISTRY.pop("test_twice", None)
    sys.modules.pop("reimported_rule", None)
  assert dataclasses.is_dataclass(allocate.DarsArgs)
