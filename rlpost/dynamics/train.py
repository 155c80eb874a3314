"""Flow-matching training of the bidirectional stepper (and autoencoder pretraining in latent mode).

Objective (rectified flow, Liu et al. 2022): for a pair of consecutive frames of a trajectory in
the diffusion space, a direction d, the condition ``x`` (the current state in direction d) and
the target ``y`` (``ModelConfig.target`` of the next state in direction d),

  tau ~ U(0, 1) (or logit-normal), noise ~ N(0, I), z_tau = (1 - tau) * noise + tau * y,
  loss = || v(z_tau, x, d, tau) - (y - noise) ||^2, averaged over elements.

Pairs are ``(x_t -> x_{t+1}, d = +1)`` and ``(x_{t+1} -> x_t, d = -1)`` drawn from the same
trajectories; ``directions`` chooses both (half of every batch each way) or one of them, so the
forward and backward specialists come from this same code with the same number of examples.

Pipeline of ``train(config, train_traj, key)``:
  1. per-field mean and std of the raw training fields;
  2. latent mode only: pretrain the autoencoder on normalised frames (mean squared
     reconstruction error), then freeze it;
  3. encode every training frame once, take per-channel latent mean and std and the RMS of
     one-frame increments (``Stats``);
  4. train the denoiser with a jitted optax step.
A run is a function of (config, data, key): the key of step s is ``fold_in(key, s)``.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rlpost.dynamics import model as mdl

DIRECTIONS = ("both", "forward", "backward")
TAU_SAMPLING = ("uniform", "logit_normal")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Training hyperparameters (plain values, static).

  The defaults train a ~110k-parameter 1D model on fields in one to three minutes on two CPU
  cores (64-point grids); raise ``num_steps`` for the reported tables.

  directions: "both" (bidirectional), "forward" or "backward" (specialists).
  num_steps, batch_size, learning_rate, warmup_steps, weight_decay, grad_clip: denoiser
    optimisation (AdamW, linear warmup then cosine decay to ``final_lr_fraction``).
  tau_sampling: flow-time distribution, "uniform" or "logit_normal" (sigmoid of N(0, 1)).
  ae_steps, ae_batch_size, ae_learning_rate: autoencoder pretraining (latent mode only).
  log_every: the history records the mean loss of every ``log_every`` steps.
  """

  model: mdl.ModelConfig = mdl.ModelConfig()
  directions: str = "both"
  num_steps: int = 1500
  batch_size: int = 64
  learning_rate: float = 2e-3
  final_lr_fraction: float = 0.05
  warmup_steps: int = 50
  weight_decay: float = 0.0
  grad_clip: float = 1.0
  tau_sampling: str = "uniform"
  ae_steps: int = 800
  ae_batch_size: int = 32
  ae_learning_rate: float = 2e-3
  log_every: int = 50

  def __post_init__(self):
    if self.directions not in DIRECTIONS:
      raise ValueError(f"TrainConfig.directions must be one of {DIRECTIONS}, got {self.directions!r}")
    if self.tau_sampling not in TAU_SAMPLING:
      raise ValueError(f"TrainConfig.tau_sampling must be one of {TAU_SAMPLING}, "
                       f"got {self.tau_sampling!r}")
    for name in ("num_steps", "batch_size", "ae_batch_size", "log_every"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"TrainConfig.{name} must be a positive int, got {value!r}")
    if self.directions == "both" and self.batch_size < 2:
      raise ValueError("TrainConfig.batch_size must be >= 2 with directions='both'")
    if self.ae_steps < 0 or self.warmup_steps < 0:
      raise ValueError("TrainConfig.ae_steps and warmup_steps must be >= 0")

  def replace(self, **kwargs) -> "TrainConfig":
    return dataclasses.replace(self, **kwargs)


# ----------------------------------------------------------------------------- data and statistics


def check_trajectories(traj: Any, config: mdl.ModelConfig, *, name: str = "train_traj") -> np.ndarray:
  """Validate trajectories float [N, T, *S, F] on the host; returns them as float32 numpy."""
  traj = np.asarray(traj)
  want = config.spatial_dims + 3
  if traj.ndim != want:
    raise ValueError(f"{name} must be [N, T, *S, F] with {config.spatial_dims} spatial axis(es) "
                     f"(rank {want}), got shape {traj.shape}")
  if traj.shape[-1] != config.num_fields:
    raise ValueError(f"{name} has {traj.shape[-1]} fields, the model expects {config.num_fields}")
  if traj.shape[1] < 2:
    raise ValueError(f"{name} needs at least 2 frames per trajectory, got {traj.shape[1]}")
  if traj.shape[0] < 1:
    raise ValueError(f"{name} has no trajectory")
  if not np.all(np.isfinite(traj)):
    raise ValueError(f"{name} contains NaN or inf")
  config.latent_shape(traj.shape[2:-1])  # checks divisibility by ae_downsample
  return traj.astype(np.float32)


def field_stats(traj: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Per-field mean and std (each [F] float32) over every axis but the last; std floored at 1e-6."""
  flat = np.asarray(traj, np.float64).reshape(-1, traj.shape[-1])
  return flat.mean(0).astype(np.float32), np.maximum(flat.std(0), 1e-6).astype(np.float32)


def channel_stats(z: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Latent [N, T, *S', C] -> per-channel (mean, std, RMS of one-frame increments), [C] each.

  The increment RMS is computed after standardising with that mean and std, i.e. in the space
  the denoiser sees.
  """
  z = np.asarray(z, np.float64)
  flat = z.reshape(-1, z.shape[-1])
  mean, std = flat.mean(0), np.maximum(flat.std(0), 1e-6)
  zn = (z - mean) / std
  delta = (zn[:, 1:] - zn[:, :-1]).reshape(-1, z.shape[-1])
  rms = np.maximum(np.sqrt(np.mean(delta ** 2, axis=0)), 1e-6)
  return mean.astype(np.float32), std.astype(np.float32), rms.astype(np.float32)


def encode_trajectories(graphdef: nnx.GraphDef, params: nnx.State, stats: mdl.Stats,
                        traj: np.ndarray, *, chunk: int = 256) -> np.ndarray:
  """Diffusion-space states of every frame: [N, T, *S, F] -> [N, T, *S', C] float32 numpy."""
  n, t = traj.shape[:2]
  frames = np.asarray(traj, np.float32).reshape((n * t,) + traj.shape[2:])
  fn = jax.jit(lambda p, s, x: mdl.encode(nnx.merge(graphdef, p), s, x))
  out = [np.asarray(fn(params, stats, frames[i:i + chunk])) for i in range(0, len(frames), chunk)]
  z = np.concatenate(out, axis=0)
  return z.reshape((n, t) + z.shape[1:])


# ----------------------------------------------------------------------------- objective


def flow_matching_loss(denoiser: mdl.Denoiser, cond: jax.Array, y: jax.Array, direction: jax.Array,
                       tau: jax.Array, noise: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Rectified-flow loss, returned as (sum of squared errors, number of elements).

  ``z_tau = (1 - tau) * noise + tau * y``; the velocity target is ``y - noise``.

  Args:
    denoiser: the velocity network.
    cond: x [B, *S', C] float32, the current state (condition).
    y: [B, *S', C] float32, the regression target (next state or scaled increment).
    direction: [B] float32 in {+1, -1}.
    tau: [B] float32 flow times in [0, 1].
    noise: [B, *S', C] float32 standard normal.
  """
  chex.assert_equal_shape([cond, y, noise])
  chex.assert_shape([direction, tau], (cond.shape[0],))
  t = tau.reshape((-1,) + (1,) * (y.ndim - 1))
  z_tau = (1.0 - t) * noise + t * y
  v = denoiser(z_tau, cond, direction, tau)
  err = jnp.sum(jnp.square(v - (y - noise)))
  return err, jnp.asarray(y.size, jnp.float32)


def direction_flags(directions: str, batch_size: int) -> jax.Array:
  """[B] float32 flags: +1 / -1 halves for "both", all +1 or all -1 for a specialist."""
  if directions == "forward":
    return jnp.ones((batch_size,), jnp.float32)
  if directions == "backward":
    return -jnp.ones((batch_size,), jnp.float32)
  half = batch_size // 2
  return jnp.concatenate([jnp.ones((half,), jnp.float32), -jnp.ones((batch_size - half,), jnp.float32)])


def sample_pairs(data: jax.Array, key: jax.Array, batch_size: int, directions: str
                 ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Random one-frame pairs from trajectories data [N, T, *S', C].

  Returns (cond [B, *S', C], next [B, *S', C], direction [B]): for d = +1 the pair is
  (x_t, x_{t+1}), for d = -1 it is (x_{t+1}, x_t).
  """
  kn, kt = jax.random.split(key)
  n = jax.random.randint(kn, (batch_size,), 0, data.shape[0])
  t = jax.random.randint(kt, (batch_size,), 0, data.shape[1] - 1)
  a, b = data[n, t], data[n, t + 1]
  d = direction_flags(directions, batch_size)
  fwd = (d > 0).reshape((-1,) + (1,) * (a.ndim - 1))
  return jnp.where(fwd, a, b), jnp.where(fwd, b, a), d


def sample_tau(key: jax.Array, batch_size: int, tau_sampling: str) -> jax.Array:
  """[B] float32 flow times: U(0, 1) or sigmoid(N(0, 1))."""
  if tau_sampling == "uniform":
    return jax.random.uniform(key, (batch_size,))
  return jax.nn.sigmoid(jax.random.normal(key, (batch_size,)))


def batch_loss(graphdef: nnx.GraphDef, params: nnx.State, stats: mdl.Stats, data: jax.Array,
               key: jax.Array, *, config: mdl.ModelConfig, batch_size: int, directions: str,
               tau_sampling: str) -> jax.Array:
  """Mean flow-matching loss of one random batch of pairs from data [N, T, *S', C] (diffusion
  space); ``graphdef, params`` are those of the ``Denoiser``."""
  kp, ktau, kn = jax.random.split(key, 3)
  cond, nxt, d = sample_pairs(data, kp, batch_size, directions)
  y = mdl.target_from_next(config, stats, cond, nxt)
  tau = sample_tau(ktau, batch_size, tau_sampling)
  noise = jax.random.normal(kn, y.shape, y.dtype)
  err, count = flow_matching_loss(nnx.merge(graphdef, params), cond, y, d, tau, noise)
  return err / count


def make_optimizer(*, learning_rate: float, num_steps: int, warmup_steps: int,
                   final_lr_fraction: float = 0.05, weight_decay: float = 0.0,
                   grad_clip: float = 1.0) -> optax.GradientTransformation:
  """Global-norm clipping, then AdamW with linear warmup and cosine decay."""
  warmup = min(warmup_steps, max(num_steps - 1, 0))
  schedule = optax.warmup_cosine_decay_schedule(
      0.0, learning_rate, warmup, max(num_steps, warmup + 1), learning_rate * final_lr_fraction)
  return optax.chain(optax.clip_by_global_norm(grad_clip),
                     optax.adamw(schedule, weight_decay=weight_decay))


def make_train_step(graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation,
                    config: TrainConfig):
  """The pure update ``(params, opt_state, stats, data, key) -> (params, opt_state, loss)``.

  ``graphdef, params`` are those of the ``Denoiser``; data is [N, T, *S', C] in diffusion space.
  """
  loss_fn = functools.partial(batch_loss, graphdef, config=config.model,
                              batch_size=config.batch_size, directions=config.directions,
                              tau_sampling=config.tau_sampling)

  def step(params, opt_state, stats, data, key):
    loss, grads = jax.value_and_grad(loss_fn)(params, stats, data, key)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return step


@functools.lru_cache(maxsize=32)
def _jitted_step(make_step: Callable, *static) -> Callable:
  """``jit(make_step(*static))`` with the step key derived in-graph, cached by its static
  arguments so that repeated runs of one configuration (seeds, sweeps) compile once.

  The jitted function is ``(params, opt_state, args, key, s) -> (params, opt_state, loss)`` with
  the key of step s being ``fold_in(key, s)``; params and optimizer state are donated.
  """
  step = make_step(*static)
  return jax.jit(lambda p, o, a, key, s: step(p, o, *a, jax.random.fold_in(key, s)),
                 donate_argnums=(0, 1))


def _run_steps(jstep: Callable, params, opt_state, args, key, num_steps: int, log_every: int
               ) -> tuple[Any, Any, list[int], list[float]]:
  """Run ``num_steps`` updates of a ``_jitted_step`` function.

  Returns the final (params, opt_state) and, every ``log_every`` steps (and at the end), the
  step reached and the mean loss since the previous record.

  The loop is in Python around one jitted step rather than a ``lax.scan``: XLA:CPU runs
  convolution gradients inside a while loop 15-30x slower than at the top level of a program
  (measured with jax 0.10 on this model), while the dispatch cost of a step is negligible here.
  """
  steps, losses, pending = [], [], []
  for s in range(num_steps):
    params, opt_state, loss = jstep(params, opt_state, args, key, jnp.int32(s))
    pending.append(loss)
    if (s + 1) % log_every == 0 or s + 1 == num_steps:
      steps.append(s + 1)
      losses.append(float(np.mean(jax.device_get(pending))))
      pending = []
  return params, opt_state, steps, losses


def _denoiser_optimizer(config: TrainConfig) -> optax.GradientTransformation:
  return make_optimizer(learning_rate=config.learning_rate, num_steps=config.num_steps,
                        warmup_steps=config.warmup_steps, weight_decay=config.weight_decay,
                        grad_clip=config.grad_clip, final_lr_fraction=config.final_lr_fraction)


def _autoencoder_optimizer(config: TrainConfig) -> optax.GradientTransformation:
  return make_optimizer(learning_rate=config.ae_learning_rate, num_steps=config.ae_steps,
                        warmup_steps=config.warmup_steps, weight_decay=config.weight_decay,
                        grad_clip=config.grad_clip, final_lr_fraction=config.final_lr_fraction)


def _make_denoiser_step(graphdef: nnx.GraphDef, config: TrainConfig):
  return make_train_step(graphdef, _denoiser_optimizer(config), config)


def make_autoencoder_step(graphdef: nnx.GraphDef, config: TrainConfig):
  """The pure update ``(params, opt_state, stats, frames, key) -> (params, opt_state, loss)`` of
  the ``Autoencoder`` (``graphdef, params``) on raw frames [n, *S, F]: mean squared
  reconstruction error of ``ae_batch_size`` random normalised frames."""
  optimizer = _autoencoder_optimizer(config)
  bsz = config.ae_batch_size

  def loss_fn(params, stats, frames, key):
    i = jax.random.randint(key, (bsz,), 0, frames.shape[0])
    xn = (frames[i] - stats.field_mean) / stats.field_std
    return jnp.mean(jnp.square(nnx.merge(graphdef, params)(xn) - xn))

  def step(params, opt_state, stats, frames, key):
    loss, grads = jax.value_and_grad(loss_fn)(params, stats, frames, key)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return step


def pretrain_autoencoder(model: mdl.RoundTripModel, stats: mdl.Stats, traj: np.ndarray,
                         key: jax.Array, config: TrainConfig) -> tuple[list[int], list[float]]:
  """Fit ``model.autoencoder`` in place to reconstruct normalised frames (mean squared error).

  Returns the history (steps reached, mean reconstruction loss since the previous record).
  """
  ae_graphdef, ae_params = nnx.split(model.autoencoder)
  frames = jnp.asarray(traj.reshape((-1,) + traj.shape[2:]))
  jstep = _jitted_step(make_autoencoder_step, ae_graphdef, config)
  opt_state = _autoencoder_optimizer(config).init(ae_params)
  ae_params, _, steps, losses = _run_steps(jstep, ae_params, opt_state, (stats, frames), key,
                                           config.ae_steps, config.log_every)
  nnx.update(model.autoencoder, ae_params)
  return steps, losses


def train(config: TrainConfig, train_traj: Any, key: jax.Array
          ) -> tuple[nnx.GraphDef, nnx.State, mdl.Stats, dict[str, Any]]:
  """Train a stepper on trajectories train_traj float32 [N, T, *S, F].

  Returns ``(graphdef, params, stats, history)``: ``graphdef, params`` of the whole
  ``RoundTripModel`` (as from ``nnx.split``), the normalisation ``Stats``, and a history dict with
  ``step`` / ``loss`` (mean loss of each ``log_every`` steps), ``ae_step`` / ``ae_loss``
  (latent mode), ``num_params``, ``train_seconds`` and ``ae_seconds``.

  Deterministic given (config, data, key).
  """
  mcfg = config.model
  traj = check_trajectories(train_traj, mcfg)
  k_init, k_ae, k_fm = jax.random.split(key, 3)
  model = mdl.init_model(mcfg, k_init)
  mean, std = field_stats(traj)
  ident = mdl.identity_stats(mcfg)
  stats = ident._replace(field_mean=jnp.asarray(mean), field_std=jnp.asarray(std))

  history: dict[str, Any] = {"ae_step": [], "ae_loss": [], "ae_seconds": 0.0}
  if mcfg.latent and config.ae_steps > 0:
    t0 = time.perf_counter()
    history["ae_step"], history["ae_loss"] = pretrain_autoencoder(model, stats, traj, k_ae, config)
    history["ae_seconds"] = time.perf_counter() - t0

  graphdef, params = nnx.split(model)
  z = encode_trajectories(graphdef, params, stats, traj)
  lmean, lstd, drms = channel_stats(z)
  if not mcfg.latent:  # the normalised fields are the diffusion space already
    lmean, lstd = np.zeros_like(lmean), np.ones_like(lstd)
  stats = stats._replace(latent_mean=jnp.asarray(lmean), latent_std=jnp.asarray(lstd),
                         delta_std=jnp.asarray(drms))
  data = jnp.asarray((z - lmean) / lstd)

  den_graphdef, den_params = nnx.split(model.denoiser)
  jstep = _jitted_step(_make_denoiser_step, den_graphdef, config)
  opt_state = _denoiser_optimizer(config).init(den_params)
  t0 = time.perf_counter()
  den_params, _, steps, losses = _run_steps(jstep, den_params, opt_state, (stats, data), k_fm,
                                            config.num_steps, config.log_every)
  history["train_seconds"] = time.perf_counter() - t0
  nnx.update(model.denoiser, den_params)
  graphdef, params = nnx.split(model)
  history.update(step=np.asarray(steps), loss=np.asarray(losses),
                 ae_step=np.asarray(history["ae_step"]), ae_loss=np.asarray(history["ae_loss"]),
                 num_params=mdl.num_params(params))
  return graphdef, params, stats, history


def evaluate_loss(graphdef: nnx.GraphDef, params: nnx.State, stats: mdl.Stats, traj: Any,
                  key: jax.Array, *, directions: str = "both", num_pairs: int = 256,
                  tau_sampling: str = "uniform") -> float:
  """Mean flow-matching loss on ``num_pairs`` random pairs of held-out trajectories [N, T, *S, F].

  ``graphdef, params`` are those returned by ``train``. The same key gives the same pairs, flow
  times and noise, so two models compared with one key see identical batches.
  """
  if directions not in DIRECTIONS:
    raise ValueError(f"directions must be one of {DIRECTIONS}, got {directions!r}")
  model = nnx.merge(graphdef, params)
  traj = check_trajectories(traj, model.config, name="traj")
  data = jnp.asarray(encode_trajectories(graphdef, params, stats, traj))
  den_graphdef, den_params = nnx.split(model.denoiser)
  loss_fn = jax.jit(functools.partial(batch_loss, den_graphdef, config=model.config,
                                      batch_size=num_pairs, directions=directions,
                                      tau_sampling=tau_sampling))
  return float(loss_fn(den_params, stats, data, key))
