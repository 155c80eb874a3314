"""Conditional flow-matching stepper with a direction flag, for periodic 1D and 2D fields.

One network steps a dynamical system forward (``d = +1``) or backward (``d = -1``) in time. It is
a velocity field ``v(z_tau, x, d, tau)`` of rectified flow (Liu et al. 2022, "Flow straight and
fast"): ``z_tau = (1 - tau) * noise + tau * y`` goes from Gaussian noise at ``tau = 0`` to the
target ``y`` at ``tau = 1``, where ``y`` is the next state in the chosen direction (or its scaled
increment, ``ModelConfig.target``) and ``x`` the current state. Integrating the learned ODE
from noise is one physical step (``rlpost.dynamics.rollout``).

Shape legend:
  B batch, S spatial axes (``[X]`` in 1D, ``[H, W]`` in 2D), F physical fields, C channels of the
  diffusion space (``C = F`` on fields, ``C = latent_channels`` in latent mode), S' the latent
  grid (S divided by ``ae_downsample`` in latent mode, S otherwise), E embedding width.

Architecture (``Denoiser``): the noisy target and the condition are concatenated as channels,
lifted by a periodic convolution, passed through residual blocks
``x + conv(gelu(FiLM(conv(gelu(norm(x))))))`` whose FiLM scale and shift come from an embedding
of (tau, d), then projected back to C channels. Every convolution pads circularly, matching the
periodic domains of the systems in ``rlpost.dynamics``. ``Autoencoder`` is an optional small
convolutional autoencoder (one strided stage) so that diffusion runs in a latent space, the
paper's setting; ``ModelConfig.latent=False`` diffuses the normalised fields directly.

The whole model is one NNX module (``RoundTripModel``); ``nnx.split`` turns it into
``(graphdef, params)``, and ``Stats`` carries the normalisation constants computed from training
data, so ``(graphdef, params, stats)`` is everything a rollout needs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from flax import nnx

TARGETS = ("delta", "state")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyperparameters of the stepper. Plain Python values (hashable, static).

  num_fields: F, physical fields (last axis of a state).
  spatial_dims: 1 or 2.
  width: channels of the residual blocks.
  num_blocks: residual blocks (two convolutions each).
  kernel_size: convolution size per axis; None picks 5 in 1D and 3 in 2D.
  embed_dim: E, width of the (tau, direction) embedding.
  target: "delta" regresses the increment ``(x_next - x) / delta_std`` (scaled to unit RMS on
    training pairs), "state" the next state itself. Increments are small and smooth for the
    short frame steps of the systems here, which makes "delta" the easier target.
  latent: diffuse in the latent space of ``Autoencoder`` instead of on the fields.
  latent_channels: C in latent mode.
  ae_width: channels of the autoencoder.
  ae_downsample: spatial stride of the encoder's one strided stage (1 = no downsampling);
    every spatial size must be divisible by it.
  """

  num_fields: int = 1
  spatial_dims: int = 1
  width: int = 48
  num_blocks: int = 4
  kernel_size: int | None = None
  embed_dim: int = 32
  target: str = "delta"
  latent: bool = False
  latent_channels: int = 4
  ae_width: int = 32
  ae_downsample: int = 2

  def __post_init__(self):
    for name in ("num_fields", "width", "num_blocks", "embed_dim", "latent_channels", "ae_width",
                 "ae_downsample"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
    if self.spatial_dims not in (1, 2):
      raise ValueError(f"ModelConfig.spatial_dims must be 1 or 2, got {self.spatial_dims!r}")
    if self.kernel_size is not None and (self.kernel_size < 1 or self.kernel_size % 2 == 0):
      raise ValueError(f"ModelConfig.kernel_size must be a positive odd int, got {self.kernel_size!r}")
    if self.target not in TARGETS:
      raise ValueError(f"ModelConfig.target must be one of {TARGETS}, got {self.target!r}")

  @property
  def resolved_kernel_size(self) -> int:
    if self.kernel_size is not None:
      return self.kernel_size
    return 5 if self.spatial_dims == 1 else 3

  @property
  def channels(self) -> int:
    """C, channels of the diffusion space."""
    return self.latent_channels if self.latent else self.num_fields

  def latent_shape(self, spatial: tuple[int, ...]) -> tuple[int, ...]:
    """S' + (C,): the shape of one diffusion-space state for a field of spatial shape S."""
    if len(spatial) != self.spatial_dims:
      raise ValueError(f"expected {self.spatial_dims} spatial axes, got shape {spatial}")
    if not self.latent:
      return tuple(spatial) + (self.channels,)
    bad = [s for s in spatial if s % self.ae_downsample]
    if bad:
      raise ValueError(f"spatial sizes {tuple(spatial)} must be divisible by ae_downsample="
                       f"{self.ae_downsample}")
    return tuple(s // self.ae_downsample for s in spatial) + (self.channels,)

  def replace(self, **kwargs) -> "ModelConfig":
    return dataclasses.replace(self, **kwargs)


class Stats(NamedTuple):
  """Normalisation constants (a pytree of float32 arrays), computed from training data.

  field_mean, field_std: [F], per-field statistics of the raw fields.
  latent_mean, latent_std: [C], per-channel statistics of the encoded normalised fields (zeros and
    ones on fields, where the normalised fields are already the diffusion space).
  delta_std: [C], root mean square of one-frame increments in the diffusion space; the "delta"
    target is the increment divided by it.
  """

  field_mean: jax.Array
  field_std: jax.Array
  latent_mean: jax.Array
  latent_std: jax.Array
  delta_std: jax.Array


def identity_stats(config: ModelConfig) -> Stats:
  """Stats that leave states unchanged (unit scales, zero means)."""
  f, c = config.num_fields, config.channels
  return Stats(jnp.zeros((f,), jnp.float32), jnp.ones((f,), jnp.float32),
               jnp.zeros((c,), jnp.float32), jnp.ones((c,), jnp.float32),
               jnp.ones((c,), jnp.float32))


def _pad_periodic(x: jax.Array, lo: int, hi: int, spatial_dims: int) -> jax.Array:
  """Wrap-pads the spatial axes of x [B, *S, C] by (lo, hi) cells."""
  if lo == 0 and hi == 0:
    return x
  pad = [(0, 0)] + [(lo, hi)] * spatial_dims + [(0, 0)]
  return jnp.pad(x, pad, mode="wrap")


class PeriodicConv(nnx.Module):
  """Convolution with circular padding: [B, *S, Cin] -> [B, *S / stride, Cout].

  The input is wrap-padded by ``k - 1`` cells in total (split as evenly as possible), so a stride-1
  convolution keeps the grid size and a stride-s one divides it by s (for sizes divisible by s).
  """

  def __init__(self, in_features: int, out_features: int, kernel_size: int, spatial_dims: int, *,
               stride: int = 1, rngs: nnx.Rngs, kernel_init=None):
    self.spatial_dims = spatial_dims
    self.pad = ((kernel_size - 1) // 2, kernel_size - 1 - (kernel_size - 1) // 2)
    kwargs = {} if kernel_init is None else {"kernel_init": kernel_init}
    self.conv = nnx.Conv(in_features, out_features, (kernel_size,) * spatial_dims,
                         strides=stride, padding="VALID", rngs=rngs, **kwargs)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.conv(_pad_periodic(x, *self.pad, self.spatial_dims))


def timestep_embedding(tau: jax.Array, dim: int, max_period: float = 10000.0) -> jax.Array:
  """Sinusoidal features of the flow time: tau [B] float in [0, 1] -> [B, dim] float32.

  tau is scaled by 1000 so that the geometric frequency ladder of Vaswani et al. resolves it.
  """
  half = dim // 2
  freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
  angles = 1000.0 * tau.astype(jnp.float32)[:, None] * freqs[None, :]
  emb = jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)
  if dim % 2:
    emb = jnp.pad(emb, ((0, 0), (0, 1)))
  return emb


class ResBlock(nnx.Module):
  """Pre-norm residual block with FiLM: x + conv(gelu(FiLM(conv(gelu(norm(x))), c)))."""

  def __init__(self, width: int, kernel_size: int, spatial_dims: int, embed_dim: int, *,
               rngs: nnx.Rngs):
    self.spatial_dims = spatial_dims
    self.norm = nnx.LayerNorm(width, rngs=rngs)
    self.conv1 = PeriodicConv(width, width, kernel_size, spatial_dims, rngs=rngs)
    self.conv2 = PeriodicConv(width, width, kernel_size, spatial_dims, rngs=rngs)
    self.film = nnx.Linear(embed_dim, 2 * width, rngs=rngs)

  def __call__(self, x: jax.Array, cond: jax.Array) -> jax.Array:
    """x [B, *S, width], cond [B, E] -> [B, *S, width]."""
    h = self.conv1(jax.nn.gelu(self.norm(x)))
    scale, shift = jnp.split(self.film(cond), 2, axis=-1)  # [B, width] each
    bcast = (slice(None),) + (None,) * self.spatial_dims
    h = h * (1.0 + scale[bcast]) + shift[bcast]
    return x + self.conv2(jax.nn.gelu(h))


class Denoiser(nnx.Module):
  """Velocity network v(z_tau, x, d, tau) of rectified flow, FiLM-conditioned on (tau, d).

  Call: ``(z_tau [B, *S', C], x [B, *S', C], direction [B] (+1 / -1), tau [B] in [0, 1])
  -> v [B, *S', C] float32``. The direction selects one of two learned embeddings; its sum with
  the tau embedding goes through an MLP, and each residual block reads its own FiLM from that.
  """

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    c, w, e, k, sd = (config.channels, config.width, config.embed_dim,
                      config.resolved_kernel_size, config.spatial_dims)
    self.direction_embed = nnx.Embed(2, e, rngs=rngs)
    self.cond_in = nnx.Linear(e, e, rngs=rngs)
    self.cond_out = nnx.Linear(e, e, rngs=rngs)
    self.lift = PeriodicConv(2 * c, w, k, sd, rngs=rngs)
    self.blocks = nnx.List([ResBlock(w, k, sd, e, rngs=rngs) for _ in range(config.num_blocks)])
    self.out_norm = nnx.LayerNorm(w, rngs=rngs)
    self.out = PeriodicConv(w, c, k, sd, rngs=rngs)

  def embed(self, direction: jax.Array, tau: jax.Array) -> jax.Array:
    """direction [B], tau [B] -> conditioning vector [B, E]."""
    index = (direction < 0).astype(jnp.int32)  # +1 -> row 0, -1 -> row 1
    h = timestep_embedding(tau, self.config.embed_dim) + self.direction_embed(index)
    return self.cond_out(jax.nn.gelu(self.cond_in(h)))

  def __call__(self, z_tau: jax.Array, x: jax.Array, direction: jax.Array,
               tau: jax.Array) -> jax.Array:
    b = z_tau.shape[0]
    chex.assert_rank(z_tau, self.config.spatial_dims + 2)
    chex.assert_equal_shape([z_tau, x])
    chex.assert_shape([direction, tau], (b,))
    cond = self.embed(direction, tau)
    h = self.lift(jnp.concatenate([z_tau, x], axis=-1))
    for block in self.blocks:
      h = block(h, cond)
    return self.out(jax.nn.gelu(self.out_norm(h)))


class Autoencoder(nnx.Module):
  """Small periodic convolutional autoencoder: [B, *S, F] <-> [B, *S', C].

  encode: conv(F -> w), strided conv (stride ``ae_downsample``), conv, 1x1 conv to C;
  decode: conv(C -> w), nearest upsampling, two convs, 1x1 conv to F; GELU in between.
  """

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    f, c, w, k, sd, s = (config.num_fields, config.latent_channels, config.ae_width,
                         config.resolved_kernel_size, config.spatial_dims, config.ae_downsample)
    self.enc = nnx.List([
        PeriodicConv(f, w, k, sd, rngs=rngs),
        PeriodicConv(w, w, 2 * s if s > 1 else k, sd, stride=s, rngs=rngs),
        PeriodicConv(w, w, k, sd, rngs=rngs),
    ])
    self.enc_out = PeriodicConv(w, c, 1, sd, rngs=rngs)
    self.dec_in = PeriodicConv(c, w, k, sd, rngs=rngs)
    self.dec = nnx.List([PeriodicConv(w, w, k, sd, rngs=rngs), PeriodicConv(w, w, k, sd, rngs=rngs)])
    self.dec_out = PeriodicConv(w, f, 1, sd, rngs=rngs)

  def encode(self, x: jax.Array) -> jax.Array:
    """x [B, *S, F] (normalised fields) -> latent [B, *S', C]."""
    chex.assert_rank(x, self.config.spatial_dims + 2)
    h = x
    for conv in self.enc:
      h = jax.nn.gelu(conv(h))
    return self.enc_out(h)

  def decode(self, z: jax.Array) -> jax.Array:
    """latent [B, *S', C] -> normalised fields [B, *S, F]."""
    chex.assert_rank(z, self.config.spatial_dims + 2)
    h = jax.nn.gelu(self.dec_in(z))
    s = self.config.ae_downsample
    for axis in range(1, 1 + self.config.spatial_dims):
      h = jnp.repeat(h, s, axis=axis)
    for conv in self.dec:
      h = jax.nn.gelu(conv(h))
    return self.dec_out(h)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.decode(self.encode(x))


class RoundTripModel(nnx.Module):
  """The denoiser and, in latent mode, the autoencoder (``None`` on fields)."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    self.denoiser = Denoiser(config, rngs=rngs)
    self.autoencoder = Autoencoder(config, rngs=rngs) if config.latent else None


def init_model(config: ModelConfig, key: jax.Array) -> RoundTripModel:
  """A randomly initialised model; the key fixes every parameter."""
  return RoundTripModel(config, rngs=nnx.Rngs(params=key))


def num_params(params) -> int:
  """Number of scalars in a parameter pytree (e.g. the state from ``nnx.split``)."""
  return int(sum(x.size for x in jax.tree.leaves(params)))


def _bcast_last(v: jax.Array, ndim: int) -> jax.Array:
  return v.reshape((1,) * (ndim - 1) + (-1,))


def encode(model: RoundTripModel, stats: Stats, x: jax.Array) -> jax.Array:
  """Physical fields x [B, *S, F] -> diffusion-space state z [B, *S', C] (normalised)."""
  chex.assert_rank(x, model.config.spatial_dims + 2)
  xn = (x - _bcast_last(stats.field_mean, x.ndim)) / _bcast_last(stats.field_std, x.ndim)
  z = model.autoencoder.encode(xn) if model.config.latent else xn
  return (z - _bcast_last(stats.latent_mean, z.ndim)) / _bcast_last(stats.latent_std, z.ndim)


def decode(model: RoundTripModel, stats: Stats, z: jax.Array) -> jax.Array:
  """Diffusion-space state z [B, *S', C] -> physical fields [B, *S, F] (inverse of ``encode``)."""
  chex.assert_rank(z, model.config.spatial_dims + 2)
  z = z * _bcast_last(stats.latent_std, z.ndim) + _bcast_last(stats.latent_mean, z.ndim)
  xn = model.autoencoder.decode(z) if model.config.latent else z
  return xn * _bcast_last(stats.field_std, xn.ndim) + _bcast_last(stats.field_mean, xn.ndim)


def target_from_next(config: ModelConfig, stats: Stats, z: jax.Array, z_next: jax.Array) -> jax.Array:
  """The regression target y of a pair (z -> z_next), both [B, *S', C] in diffusion space."""
  if config.target == "delta":
    return (z_next - z) / _bcast_last(stats.delta_std, z.ndim)
  return z_next


def next_from_target(config: ModelConfig, stats: Stats, z: jax.Array, y: jax.Array) -> jax.Array:
  """Inverse of ``target_from_next``: the next diffusion-space state from a sampled y."""
  if config.target == "delta":
    return z + y * _bcast_last(stats.delta_std, z.ndim)
  return y
