"""Model and training of the bidirectional flow-matching stepper."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlpost.dynamics import model as mdl
from rlpost.dynamics import train as train_lib
from roundtrip_testutil import advected, denoiser_fn, tiny_config, tiny_model


def _inputs(config, batch=3, size=16, seed=0):
  spatial = (size,) * config.spatial_dims
  shape = (batch,) + config.latent_shape(spatial)
  k1, k2 = jax.random.split(jax.random.key(seed))
  return jax.random.normal(k1, shape), jax.random.normal(k2, shape)


def test_config_validation():
  with pytest.raises(ValueError, match="spatial_dims"):
    mdl.ModelConfig(spatial_dims=3)
  with pytest.raises(ValueError, match="kernel_size"):
    mdl.ModelConfig(kernel_size=4)
  with pytest.raises(ValueError, match="target"):
    mdl.ModelConfig(target="velocity")
  with pytest.raises(ValueError, match="width"):
    mdl.ModelConfig(width=0)
  with pytest.raises(ValueError, match="divisible"):
    mdl.ModelConfig(latent=True, ae_downsample=2).latent_shape((15,))
  with pytest.raises(ValueError, match="directions"):
    train_lib.TrainConfig(directions="sideways")


@pytest.mark.parametrize("spatial_dims,num_fields", [(1, 1), (1, 3), (2, 2)])
def test_default_size_fits_cpu(spatial_dims, num_fields):
  config = mdl.ModelConfig(spatial_dims=spatial_dims, num_fields=num_fields)
  params = nnx.state(nnx.eval_shape(lambda: mdl.init_model(config, jax.random.key(0))))
  assert 50_000 <= mdl.num_params(params) <= 200_000


@pytest.mark.parametrize("spatial_dims,latent", [(1, False), (1, True), (2, False), (2, True)])
def test_shapes(spatial_dims, latent):
  config = tiny_config(spatial_dims=spatial_dims, latent=latent)
  graphdef, params, stats = tiny_model(config)
  model = nnx.merge(graphdef, params)
  spatial = (16,) * spatial_dims
  x = jax.random.normal(jax.random.key(1), (3,) + spatial + (2,))
  z = jax.jit(lambda x: mdl.encode(model, stats, x))(x)
  assert z.shape == (3,) + config.latent_shape(spatial)
  assert jax.eval_shape(lambda z: mdl.decode(model, stats, z), z).shape == x.shape
  v = denoiser_fn(graphdef, params)(z, z, jnp.ones(3), jnp.full((3,), 0.5))
  assert v.shape == z.shape and v.dtype == jnp.float32


@pytest.mark.parametrize("spatial_dims", [1, 2])
def test_direction_flag_changes_prediction(spatial_dims):
  config = tiny_config(spatial_dims=spatial_dims)
  denoise = denoiser_fn(*tiny_model(config)[:2])
  z, x = _inputs(config)
  tau = jnp.full((3,), 0.3)
  fwd = denoise(z, x, jnp.ones(3), tau)
  bwd = denoise(z, x, -jnp.ones(3), tau)
  assert float(jnp.max(jnp.abs(fwd - bwd))) > 1e-3
  # Per-example conditioning: a mixed batch matches the two uniform batches row by row.
  mixed = denoise(z, x, jnp.array([1.0, -1.0, 1.0]), tau)
  np.testing.assert_allclose(mixed[1], bwd[1], atol=1e-6)
  np.testing.assert_allclose(mixed[0], fwd[0], atol=1e-6)
  later = denoise(z, x, jnp.ones(3), jnp.full((3,), 0.9))
  assert float(jnp.max(jnp.abs(fwd - later))) > 1e-3


@pytest.mark.parametrize("spatial_dims", [1, 2])
def test_periodic_convolutions_commute_with_shifts(spatial_dims):
  config = tiny_config(spatial_dims=spatial_dims)
  denoise = denoiser_fn(*tiny_model(config)[:2])
  z, x = _inputs(config)
  d, tau = jnp.array([1.0, -1.0, 1.0]), jnp.full((3,), 0.4)
  axes = tuple(range(1, 1 + spatial_dims))
  shift = (5,) * spatial_dims

  def roll(a):
    return jnp.roll(a, shift, axis=axes)

  out = denoise(roll(z), roll(x), d, tau)
  np.testing.assert_allclose(out, roll(denoise(z, x, d, tau)), atol=1e-5)


def test_latent_autoencoder_commutes_with_even_shifts():
  config = tiny_config(latent=True, ae_downsample=2)
  model = nnx.merge(*tiny_model(config)[:2])
  x = jax.random.normal(jax.random.key(0), (2, 16, 2))
  enc = jax.jit(model.autoencoder.encode)
  np.testing.assert_allclose(enc(jnp.roll(x, 4, axis=1)), jnp.roll(enc(x), 2, axis=1), atol=1e-5)


def test_encode_decode_invert_on_fields():
  config = tiny_config()
  graphdef, params, _ = tiny_model(config)
  model = nnx.merge(graphdef, params)
  stats = mdl.Stats(jnp.array([1.0, -2.0]), jnp.array([0.5, 3.0]), jnp.zeros(2), jnp.ones(2),
                    jnp.ones(2))
  x = jax.random.normal(jax.random.key(0), (2, 16, 2))
  z = mdl.encode(model, stats, x)
  np.testing.assert_allclose(z[..., 1], (x[..., 1] + 2.0) / 3.0, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(mdl.decode(model, stats, z), x, rtol=1e-6, atol=1e-6)


def test_statistics_by_hand():
  traj = np.zeros((1, 3, 2, 2), np.float32)
  traj[0, :, :, 0] = [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]  # mean 1, std sqrt(2/3)
  traj[0, :, :, 1] = 5.0  # constant: std floored
  mean, std = train_lib.field_stats(traj)
  np.testing.assert_allclose(mean, [1.0, 5.0])
  np.testing.assert_allclose(std, [np.sqrt(2 / 3), 1e-6], rtol=1e-6)
  lmean, lstd, rms = train_lib.channel_stats(traj)
  # Standardised channel 0 steps by 1 / sqrt(2/3) every frame.
  np.testing.assert_allclose(rms[0], 1 / np.sqrt(2 / 3), rtol=1e-6)
  np.testing.assert_allclose(rms[1], 1e-6)


@pytest.mark.parametrize("directions", ["both", "forward", "backward"])
def test_pairs_follow_the_direction(directions):
  data = jnp.asarray(advected(4, 6, x=16, f=1, shift=1))
  cond, nxt, d = train_lib.sample_pairs(data, jax.random.key(0), 10, directions)
  expect = {"both": [1.0] * 5 + [-1.0] * 5, "forward": [1.0] * 10, "backward": [-1.0] * 10}
  np.testing.assert_array_equal(d, expect[directions])
  # Advection by +1 cell per frame: the next state in direction d is the condition rolled by d.
  for i in range(10):
    np.testing.assert_array_equal(nxt[i], jnp.roll(cond[i], int(d[i]), axis=0))


def test_flow_matching_loss_by_hand():
  """A denoiser that predicts zero velocity incurs || y - noise ||^2."""

  class Zero:
    def __call__(self, z_tau, x, direction, tau):
      return jnp.zeros_like(z_tau)

  y = jnp.full((2, 4, 1), 2.0)
  noise = jnp.ones((2, 4, 1))
  err, count = train_lib.flow_matching_loss(Zero(), y, y, jnp.ones(2), jnp.full((2,), 0.5), noise)
  assert float(err) == pytest.approx(8.0) and float(count) == 8.0


def test_bad_training_data():
  config = train_lib.TrainConfig(model=tiny_config(), num_steps=1)
  good = advected(2, 3, x=16)
  with pytest.raises(ValueError, match="rank"):
    train_lib.train(config, good[0], jax.random.key(0))
  with pytest.raises(ValueError, match="fields"):
    train_lib.train(config, good[..., :1], jax.random.key(0))
  with pytest.raises(ValueError, match="at least 2 frames"):
    train_lib.train(config, good[:, :1], jax.random.key(0))
  bad = good.copy()
  bad[0, 1, 3, 0] = np.nan
  with pytest.raises(ValueError, match="NaN"):
    train_lib.train(config, bad, jax.random.key(0))


def test_short_training_reduces_loss_and_is_deterministic():
  data = advected(16, 8, x=32, f=2)
  config = train_lib.TrainConfig(model=tiny_config(width=16), num_steps=60, batch_size=16,
                                 log_every=10, learning_rate=3e-3, warmup_steps=5)
  graphdef, params, stats, history = train_lib.train(config, data, jax.random.key(0))
  loss = history["loss"]
  assert loss.shape == (6,) and np.all(np.isfinite(loss))
  assert loss[-1] < 0.75 * loss[0], loss
  assert history["num_params"] == mdl.num_params(params)
  # The same key gives the same run, bit for bit (the second run reuses the compiled step).
  first10 = train_lib.train(config.replace(num_steps=10), data, jax.random.key(0))
  again = train_lib.train(config.replace(num_steps=10), data, jax.random.key(0))
  jax.tree.map(np.testing.assert_array_equal, again[1], first10[1])
  np.testing.assert_array_equal(again[3]["loss"], first10[3]["loss"])
  # A held-out loss of the trained model is below that of the 10-step one on the same batch.
  held = advected(4, 8, x=32, f=2, seed=1)
  trained = train_lib.evaluate_loss(graphdef, params, stats, held, jax.random.key(3))
  early = train_lib.evaluate_loss(first10[0], first10[1], first10[2], held, jax.random.key(3))
  assert trained < early


def test_latent_training_pretrains_the_autoencoder():
  data = advected(8, 4, x=16, f=2)
  config = train_lib.TrainConfig(model=tiny_config(latent=True, ae_width=16), num_steps=5,
                                 ae_steps=40, batch_size=8, ae_batch_size=8, log_every=10,
                                 ae_learning_rate=3e-3, warmup_steps=2)
  graphdef, params, stats, history = train_lib.train(config, data, jax.random.key(0))
  ae = history["ae_loss"]
  assert ae.shape == (4,) and ae[-1] < 0.5 * ae[0], ae
  assert stats.latent_mean.shape == (2,) and stats.delta_std.shape == (2,)
  # The latent statistics standardise the encoded training frames.
  z = train_lib.encode_trajectories(graphdef, params, stats, data)
  np.testing.assert_allclose(z.reshape(-1, 2).mean(0), 0.0, atol=1e-3)
  np.testing.assert_allclose(z.reshape(-1, 2).std(0), 1.0, atol=1e-3)
