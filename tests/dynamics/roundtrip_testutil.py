"""Synthetic trajectories and tiny models for the round-trip stepper tests."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from rlpost.dynamics import model as mdl


def advected(n: int, t: int, x: int = 32, f: int = 2, shift: int = 1, seed: int = 0,
             modes: int = 5, spatial_dims: int = 1) -> np.ndarray:
  """Random smooth periodic fields translated by ``shift`` cells per frame along every spatial
  axis: float32 [n, t, *S, f] with S = [x] (1D) or [x, x] (2D). Exactly invertible dynamics."""
  rng = np.random.default_rng(seed)
  grid = np.arange(x) / x
  k = np.arange(1, modes + 1)
  shape = (n,) + (x,) * spatial_dims + (f,)
  u0 = np.zeros(shape)
  for axis in range(spatial_dims):
    coef = rng.normal(size=(n, f, modes)) / k
    phase = rng.uniform(0, 2 * np.pi, size=(n, f, modes))
    wave = np.sum(coef[..., None] * np.sin(2 * np.pi * k[None, None, :, None] * grid
                                            + phase[..., None]), axis=2)  # [n, f, x]
    wave = np.moveaxis(wave, 1, -1)  # [n, x, f]
    view = [n] + [1] * spatial_dims + [f]
    view[1 + axis] = x
    u0 = u0 + wave.reshape(view)
  axes = tuple(range(1, 1 + spatial_dims))
  frames = [np.roll(u0, (shift * i,) * spatial_dims, axis=axes) for i in range(t)]
  return np.stack(frames, axis=1).astype(np.float32)


def tiny_config(**kwargs) -> mdl.ModelConfig:
  base = dict(num_fields=2, width=8, num_blocks=1, embed_dim=8, latent_channels=2, ae_width=8)
  base.update(kwargs)
  return mdl.ModelConfig(**base)


def tiny_model(config: mdl.ModelConfig, seed: int = 0):
  """(graphdef, params, stats) of an untrained model with identity-like statistics."""
  model = mdl.init_model(config, jax.random.key(seed))
  graphdef, params = nnx.split(model)
  stats = mdl.identity_stats(config)._replace(delta_std=jax.numpy.full((config.channels,), 0.3))
  return graphdef, params, stats


def denoiser_fn(graphdef, params):
  """The model's denoiser as a jitted function (one compilation instead of one per eager op)."""
  return jax.jit(lambda z, x, d, tau: nnx.merge(graphdef, params).denoiser(z, x, d, tau))
