"""Rollouts, round trips and exact steppers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlpost.dynamics import rollout as rollout_lib
from rlpost.eval import trust
from roundtrip_testutil import advected, tiny_config, tiny_model

SAMPLER = rollout_lib.SamplerConfig(num_steps=2)


@pytest.fixture(scope="module")
def field_model():
  return tiny_model(tiny_config())


@pytest.fixture(scope="module")
def stepper(field_model):
  return rollout_lib.make_stepper(*field_model, SAMPLER)


@pytest.fixture(scope="module")
def x0():
  return advected(4, 1, x=16, f=2)[:, 0]


def shift(x, direction):
  """Exact invertible dynamics: translate by one cell in the direction of time."""
  return jnp.roll(x, direction, axis=1)


def test_exact_stepper_has_zero_error_and_zero_round_trip():
  traj = advected(3, 9, x=16, f=2, shift=1)
  x0 = traj[:, 0]
  path = rollout_lib.rollout(shift, x0, +1, 8)
  pooled, per_field = trust.rollout_error(np.asarray(path.x), traj, spatial_dims=1)
  assert pooled.shape == (3, 9) and per_field.shape == (3, 9, 2)
  np.testing.assert_array_equal(pooled, 0.0)  # E_i = 0 exactly
  rt = rollout_lib.round_trip(shift, x0, 8)
  assert rt.depths == tuple(range(1, 9))
  np.testing.assert_array_equal(rt.c_field, 0.0)
  np.testing.assert_array_equal(rt.c_latent, 0.0)
  np.testing.assert_array_equal(rt.c_field_per, 0.0)
  # Backward from the truth recovers the start (the inverse problem).
  back = rollout_lib.rollout(shift, traj[:, -1], -1, 8)
  np.testing.assert_array_equal(back.x[:, ::-1], traj)


def test_linear_map_and_its_inverse_round_trip_to_rounding():
  rng = np.random.default_rng(0)
  a = np.eye(16) + 0.1 * rng.normal(size=(16, 16))
  fwd, bwd = jnp.asarray(a, jnp.float32), jnp.asarray(np.linalg.inv(a), jnp.float32)

  def linear(x, direction):
    m = fwd if direction > 0 else bwd  # direction arrives as a Python int
    return jnp.einsum("ij,bjf->bif", m, x)

  x0 = advected(4, 1, x=16, f=2)[:, 0]
  stepper = rollout_lib.as_stepper(linear, spatial_dims=1, num_fields=2)
  rt = rollout_lib.round_trip(stepper, x0, (1, 4))
  assert np.max(np.asarray(rt.c_field)) < 1e-4
  truth = np.stack([np.einsum("ij,bjf->bif", np.linalg.matrix_power(a, i), x0)
                    for i in range(5)], axis=1)
  pooled, _ = trust.rollout_error(np.asarray(rt.forward.x), truth, 1)
  assert pooled.max() < 1e-5


def test_round_trip_structure_and_discrepancy_definition(stepper, x0):
  key = jax.random.key(3)
  rt = rollout_lib.round_trip(stepper, x0, [4, 1, 4], key)
  assert rt.depths == (1, 4)
  assert rt.forward.x.shape == (4, 5, 16, 2) and rt.forward.z.shape == (4, 5, 16, 2)
  assert [p.x.shape[1] for p in rt.backward] == [2, 5]
  assert rt.c_latent.shape == (4, 2) and rt.c_field.shape == (4, 2)
  assert rt.c_field_per.shape == (4, 2, 2)
  # The forward leg is the plain rollout with the first half of the key.
  fwd = rollout_lib.rollout(stepper, x0, +1, 4, jax.random.split(key)[0])
  np.testing.assert_array_equal(rt.forward.x, fwd.x)
  np.testing.assert_array_equal(rt.forward.x[:, 0], x0)
  for k, depth in enumerate(rt.depths):
    back = rt.backward[k]
    np.testing.assert_array_equal(back.z[:, 0], rt.forward.z[:, depth])
    ret = np.asarray(back.x[:, -1])
    np.testing.assert_allclose(rt.c_field[:, k],
                               trust.round_trip_discrepancy(ret, x0, axes=(1, 2)), rtol=1e-5)
    np.testing.assert_allclose(rt.c_field_per[:, k],
                               trust.round_trip_discrepancy(ret, x0, axes=1), rtol=1e-5)
    np.testing.assert_allclose(
        rt.c_latent[:, k],
        trust.round_trip_discrepancy(np.asarray(back.z[:, -1]), np.asarray(rt.forward.z[:, 0]),
                                     axes=(1, 2)), rtol=1e-5)
  np.testing.assert_array_equal(rollout_lib.returned_states(rt)[:, 1], rt.backward[1].x[:, -1])
  assert np.all(np.asarray(rt.c_field) > 0)  # an untrained model does not come back


def test_rollouts_compile_once_and_are_deterministic(field_model, stepper, x0):
  graphdef, params, stats = field_model
  before = rollout_lib.TRACE_COUNTS["rollout"]
  a = rollout_lib.rollout(stepper, x0, +1, 3, jax.random.key(0))
  b = rollout_lib.rollout(stepper, x0, +1, 3, jax.random.key(0))
  np.testing.assert_array_equal(a.x, b.x)  # the same key gives the same rollout
  c = rollout_lib.rollout(stepper, x0 * 0.5, +1, 3, jax.random.key(1))
  assert not np.allclose(c.x[:, 1:], a.x[:, 1:])
  # New parameters of the same structure are jit arguments too: no retrace.
  other = rollout_lib.make_stepper(graphdef, jax.tree.map(lambda p: p * 1.01, params), stats,
                                   SAMPLER)
  rollout_lib.rollout(other, x0, +1, 3, jax.random.key(2))
  assert rollout_lib.TRACE_COUNTS["rollout"] - before == 1
  # a new static direction compiles once more
  rollout_lib.rollout(stepper, x0, -1, 3, jax.random.key(2))
  assert rollout_lib.TRACE_COUNTS["rollout"] - before == 2
  rt_before = rollout_lib.TRACE_COUNTS["round_trip"]
  rollout_lib.round_trip(stepper, x0, (1, 2), jax.random.key(0))
  rollout_lib.round_trip(stepper, x0 + 0.1, (2, 1), jax.random.key(5))
  assert rollout_lib.TRACE_COUNTS["round_trip"] - rt_before == 1


def test_zero_noise_start_is_key_free(field_model, x0):
  det = rollout_lib.make_stepper(*field_model, rollout_lib.SamplerConfig(num_steps=2, init="zero"))
  assert not det.needs_key
  a = rollout_lib.rollout(det, x0, +1, 2, jax.random.key(0))
  b = rollout_lib.rollout(det, x0, +1, 2, jax.random.key(1))
  np.testing.assert_array_equal(a.x, b.x)
  np.testing.assert_array_equal(rollout_lib.rollout(det, x0, +1, 2).x, a.x)  # no key needed
  noisy = rollout_lib.rollout(rollout_lib.make_stepper(*field_model, SAMPLER), x0, +1, 2,
                              jax.random.key(0))
  assert not np.allclose(noisy.x[:, 1:], a.x[:, 1:])


def test_samplers(field_model, x0):
  key = jax.random.key(4)

  def run(**kw):
    stepper = rollout_lib.make_stepper(*field_model, rollout_lib.SamplerConfig(num_steps=3, **kw))
    return rollout_lib.rollout(stepper, x0, -1, 2, key).x

  euler = run(method="euler")
  # The stochastic sampler with no fresh noise is algebraically the Euler step.
  np.testing.assert_allclose(run(method="sde", eta=0.0), euler, atol=1e-5)
  sde = run(method="sde", eta=1.0)
  assert not np.allclose(sde[:, 1:], euler[:, 1:])
  np.testing.assert_array_equal(sde, run(method="sde", eta=1.0))  # deterministic given the key
  heun = run(method="heun")
  assert heun.shape == euler.shape and np.all(np.isfinite(heun))
  # The stochastic sampler stays stochastic from a zero start.
  assert rollout_lib.SamplerConfig(method="sde", init="zero").stochastic


def test_flow_integration_is_exact_for_a_straight_flow():
  """Rectified flow toward a fixed target: v = (y1 - y) / (1 - tau) is integrated exactly."""
  target = jnp.arange(6.0).reshape(2, 3)

  def velocity(y, tau):
    return (target - y) / (1.0 - tau[:, None])

  for method in ("euler", "sde"):
    y = rollout_lib.integrate_flow(velocity, (2, 3), jax.random.key(0),
                                   rollout_lib.SamplerConfig(num_steps=4, method=method))
    np.testing.assert_allclose(y, target, atol=1e-5)


def test_sample_rollouts_match_rollouts_with_split_keys(stepper, x0):
  key = jax.random.key(7)
  samples = rollout_lib.sample_rollouts(stepper, x0, +1, 2, key, 3)
  assert samples.x.shape == (3, 4, 3, 16, 2)
  keys = jax.random.split(key, 3)
  for m in range(3):
    np.testing.assert_allclose(samples.x[m], rollout_lib.rollout(stepper, x0, +1, 2, keys[m]).x,
                               atol=1e-5)
  raw, rel = trust.dispersion(np.asarray(samples.x[:, :, -1]))
  assert raw.shape == (4,) and np.all(raw > 0) and np.all(rel > 0)


def test_step_matches_one_step_rollout(stepper, x0):
  key = jax.random.key(9)
  one = rollout_lib.step(stepper, x0, -1, key)
  np.testing.assert_allclose(one, rollout_lib.rollout(stepper, x0, -1, 1, key).x[:, 1], atol=1e-5)


def test_latent_rollouts_stay_in_latent_space():
  config = tiny_config(latent=True)
  stepper = rollout_lib.make_stepper(*tiny_model(config), SAMPLER)
  x0 = advected(2, 1, x=16, f=2)[:, 0]
  rt = rollout_lib.round_trip(stepper, x0, (1, 2), jax.random.key(0))
  assert rt.forward.x.shape == (2, 3, 16, 2) and rt.forward.z.shape == (2, 3, 8, 2)
  np.testing.assert_array_equal(rt.backward[1].z[:, 0], rt.forward.z[:, 2])
  assert np.all(np.isfinite(rt.c_latent)) and np.all(np.isfinite(rt.c_field))


def test_bad_inputs(stepper, x0):
  key = jax.random.key(0)
  with pytest.raises(ValueError, match="depth"):
    rollout_lib.rollout(stepper, x0, +1, 0, key)
  with pytest.raises(ValueError, match="depth"):
    rollout_lib.rollout(stepper, x0, +1, 2.0, key)
  with pytest.raises(ValueError, match="depth"):
    rollout_lib.round_trip(stepper, x0, 0, key)
  with pytest.raises(ValueError, match="depth"):
    rollout_lib.round_trip(stepper, x0, [1, -2], key)
  with pytest.raises(ValueError, match="depths"):
    rollout_lib.round_trip(stepper, x0, [], key)
  for direction in (0, 2, -2, True, 0.5):
    with pytest.raises(ValueError, match="direction"):
      rollout_lib.rollout(stepper, x0, direction, 1, key)
  with pytest.raises(ValueError, match="rank 3"):
    rollout_lib.rollout(stepper, x0[0], +1, 1, key)
  with pytest.raises(ValueError, match="rank 3"):
    rollout_lib.round_trip(stepper, x0[:, :, None], 2, key)
  with pytest.raises(ValueError, match="fields"):
    rollout_lib.rollout(stepper, x0[..., :1], +1, 1, key)
  bad = np.array(x0)
  bad[1, 3, 0] = np.nan
  with pytest.raises(ValueError, match="NaN"):
    rollout_lib.rollout(stepper, bad, +1, 1, key)
  with pytest.raises(ValueError, match="NaN"):
    rollout_lib.round_trip(shift, bad, 1)
  with pytest.raises(ValueError, match="key"):
    rollout_lib.rollout(stepper, x0, +1, 1)
  with pytest.raises(ValueError, match="num_samples"):
    rollout_lib.sample_rollouts(stepper, x0, +1, 1, key, 0)
  with pytest.raises(ValueError, match="method"):
    rollout_lib.SamplerConfig(method="rk4")
  with pytest.raises(TypeError, match="stepper"):
    rollout_lib.rollout(42, x0, +1, 1, key)


CODE = """
import sys
import jax, numpy as np
sys.path.insert(0, "tests/dynamics")
from roundtrip_testutil import advected, tiny_config, tiny_model
from rlpost import sharding
from rlpost.dynamics import rollout as rollout_lib
stepper = rollout_lib.make_stepper(*tiny_model(tiny_config()),
                                   rollout_lib.SamplerConfig(num_steps=2))
x0 = advected(8, 1, x=16, f=2, seed=3)[:, 0]
if len(jax.devices()) > 1:
  mesh = sharding.make_mesh(data=4, fsdp=2)
  x0 = sharding.shard_batch(x0, mesh)
  assert not x0.sharding.is_fully_replicated
fwd = rollout_lib.rollout(stepper, x0, +1, 3, jax.random.key(11))
rt = rollout_lib.round_trip(stepper, x0, (1, 3), jax.random.key(12))
if len(jax.devices()) > 1:
  assert fwd.x.sharding.spec[0] is not None, fwd.x.sharding
np.savez(sys.argv[1] if len(sys.argv) > 1 else {path!r}, fwd=np.asarray(fwd.x),
         c=np.asarray(rt.c_field), back=np.asarray(rt.backward[1].x))
print("OK")
"""


def test_eight_devices_match_one(with_devices, tmp_path):
  multi, single = tmp_path / "multi.npz", tmp_path / "single.npz"
  assert "OK" in with_devices(CODE.format(path=str(multi)), 8)
  assert "OK" in with_devices(CODE.format(path=str(single)), 1)
  a, b = np.load(multi), np.load(single)
  for name in ("fwd", "c", "back"):
    np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6)
