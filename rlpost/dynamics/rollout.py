"""Rollouts of a learned (or exact) stepper, forward or backward, and the round-trip discrepancy.

Shape legend: B start states (rollouts), D depth (physical steps), S spatial axes, F fields,
S' and C the diffusion-space grid and channels (see ``rlpost.dynamics.model``), K depths of a
round trip, M stochastic samples.

Steppers. Every function here takes a *stepper*, a pytree with ``encode(x [B, *S, F]) -> z``,
``decode(z) -> x`` and ``step(z, direction, key) -> z_next`` (plus ``spatial_dims``,
``num_fields`` and ``needs_key`` for input checks):
  * ``make_stepper(graphdef, params, stats, sampler)``: the trained model. Its parameters are
    pytree leaves, so they are ordinary jit arguments (new parameters do not recompile), and the
    rollout runs in the diffusion space (the latent space in latent mode: the backward leg of a
    round trip starts from the forward end's latent, never from a re-encoded decoded state).
  * ``as_stepper(fn)``: any callable ``(x, direction) -> x_next`` (or ``(x, direction, key)``),
    e.g. a PDE solver run forwards or backwards or a linear map and its inverse, with identity
    encode/decode. Plain callables passed to ``rollout`` / ``round_trip`` are wrapped
    automatically. ``direction`` reaches ``fn`` as a Python int, so ``fn`` may branch on it.

One physical step of the model integrates the learned flow ODE from tau = 0 to 1 in
``SamplerConfig.num_steps`` Euler or Heun steps (deterministic given the noise key; ``init="zero"``
starts from zero noise and removes the key altogether) or with the stochastic sampler
``method="sde"``: at each sub-step from t to t' it predicts the clean target
``y_hat = y + (1 - t) v`` and the noise ``e_hat = y - t v`` and re-noises
``y' = t' y_hat + (1 - t') (sqrt(1 - eta^2) e_hat + eta xi)`` with fresh xi ~ N(0, I);
``eta = 0`` is exactly the Euler step, ``eta = 1`` draws all of the noise afresh (ancestral-like).

Randomness. Physical step i of a rollout uses ``fold_in(key, i)``; within it, the initial noise
and the SDE noise come from splits of that key. Noise is drawn for the global batch, and JAX's
threefry is partitionable, so a rollout sharded over a mesh equals the one-device rollout.

Compilation. ``direction`` and ``depth`` (and a round trip's tuple of depths) are static:
one compilation per (stepper structure, shapes, direction, depth); new keys, start states or
parameters of the same shapes reuse it. ``TRACE_COUNTS`` counts traces per entry point.

Round trip (``round_trip``). C_i = ||back_i(fwd_i(x_0)) - x_0|| / ||x_0||: roll forward to the
largest requested depth D once, then for each requested depth i roll backward i steps from the
forward state at depth i. Cost: D + sum_i i physical steps, i.e. the forward rollout one would
run anyway plus exactly one extra rollout of depth i per depth i. Requesting every depth
1..D costs D + D (D + 1) / 2 steps; the doubling set 1, 2, 4, ..., D costs about 3 D.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct
from jax.sharding import NamedSharding, PartitionSpec

from rlpost.dynamics import model as mdl

METHODS = ("euler", "heun", "sde")
INITS = ("noise", "zero")

# Number of times each jitted entry point was traced (= compiled), by name.
TRACE_COUNTS: collections.Counter = collections.Counter()


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
  """How one physical step integrates the learned flow (static).

  num_steps: flow-time sub-steps (network calls: num_steps, twice that for Heun).
  method: "euler", "heun" (deterministic ODE) or "sde" (noise injection, see module docstring).
  init: "noise" starts from N(0, I) (drawn from the step key), "zero" from zeros: with a
    deterministic method the step is then a fixed function of the state.
  eta: fraction of fresh noise per sub-step for "sde", in [0, 1].
  """

  num_steps: int = 8
  method: str = "euler"
  init: str = "noise"
  eta: float = 1.0

  def __post_init__(self):
    if not isinstance(self.num_steps, int) or self.num_steps < 1:
      raise ValueError(f"SamplerConfig.num_steps must be an int >= 1, got {self.num_steps!r}")
    if self.method not in METHODS:
      raise ValueError(f"SamplerConfig.method must be one of {METHODS}, got {self.method!r}")
    if self.init not in INITS:
      raise ValueError(f"SamplerConfig.init must be one of {INITS}, got {self.init!r}")
    if not 0.0 <= self.eta <= 1.0:
      raise ValueError(f"SamplerConfig.eta must lie in [0, 1], got {self.eta!r}")

  @property
  def stochastic(self) -> bool:
    """Whether the step depends on its key."""
    return self.init == "noise" or (self.method == "sde" and self.eta > 0)


def integrate_flow(velocity: Callable[[jax.Array, jax.Array], jax.Array], shape: tuple[int, ...],
                   key: jax.Array, sampler: SamplerConfig) -> jax.Array:
  """Integrate dy/dtau = velocity(y, tau) from tau = 0 to 1; returns y(1) of ``shape``.

  Args:
    velocity: ``(y [B, ...], tau [B]) -> [B, ...]``.
    shape: [B, ...], the shape of y.
    key: the key of this physical step (unused by a deterministic sampler with ``init="zero"``).
    sampler: the integration scheme.
  """
  k_init, k_sde = jax.random.split(key)
  if sampler.init == "noise":
    y = jax.random.normal(k_init, shape, jnp.float32)
  else:
    y = jnp.zeros(shape, jnp.float32)
  n, b = sampler.num_steps, shape[0]

  def v(y, t):
    return velocity(y, jnp.full((b,), t, jnp.float32))

  def body(i, y):
    t0 = i.astype(jnp.float32) / n
    t1 = (i + 1).astype(jnp.float32) / n
    h = t1 - t0
    if sampler.method == "euler":
      return y + h * v(y, t0)
    if sampler.method == "heun":
      v0 = v(y, t0)
      v1 = v(y + h * v0, t1)
      return y + 0.5 * h * (v0 + v1)
    v0 = v(y, t0)
    y_hat = y + (1.0 - t0) * v0
    e_hat = y - t0 * v0
    xi = jax.random.normal(jax.random.fold_in(k_sde, i), shape, jnp.float32)
    eta = sampler.eta
    return t1 * y_hat + (1.0 - t1) * (jnp.sqrt(1.0 - eta ** 2) * e_hat + eta * xi)

  return jax.lax.fori_loop(0, n, body, y)


# ----------------------------------------------------------------------------- steppers


@struct.dataclass
class ModelStepper:
  """The trained model as a stepper; ``params`` and ``stats`` are its pytree leaves."""

  params: nnx.State
  stats: mdl.Stats
  graphdef: nnx.GraphDef = struct.field(pytree_node=False)
  config: mdl.ModelConfig = struct.field(pytree_node=False)
  sampler: SamplerConfig = struct.field(pytree_node=False)

  @property
  def spatial_dims(self) -> int:
    return self.config.spatial_dims

  @property
  def num_fields(self) -> int:
    return self.config.num_fields

  @property
  def needs_key(self) -> bool:
    return self.sampler.stochastic

  def model(self) -> mdl.RoundTripModel:
    return nnx.merge(self.graphdef, self.params)

  def encode(self, x: jax.Array) -> jax.Array:
    """x [B, *S, F] -> z [B, *S', C]."""
    return mdl.encode(self.model(), self.stats, x)

  def decode(self, z: jax.Array) -> jax.Array:
    """z [B, *S', C] -> x [B, *S, F]."""
    return mdl.decode(self.model(), self.stats, z)

  def step(self, z: jax.Array, direction: int, key: jax.Array) -> jax.Array:
    """One physical step in the diffusion space: z [B, *S', C] -> [B, *S', C]."""
    denoiser = self.model().denoiser
    d = jnp.full((z.shape[0],), direction, jnp.float32)
    y = integrate_flow(lambda y, tau: denoiser(y, z, d, tau), z.shape, key, self.sampler)
    return mdl.next_from_target(self.config, self.stats, z, y)


@struct.dataclass
class FunctionStepper:
  """A callable ``(x, direction) -> x_next`` (or with a key) as a stepper; no pytree leaves."""

  fn: Callable[..., jax.Array] = struct.field(pytree_node=False)
  spatial_dims: int | None = struct.field(pytree_node=False, default=None)
  num_fields: int | None = struct.field(pytree_node=False, default=None)
  needs_key: bool = struct.field(pytree_node=False, default=False)

  def encode(self, x: jax.Array) -> jax.Array:
    return x

  def decode(self, z: jax.Array) -> jax.Array:
    return z

  def step(self, z: jax.Array, direction: int, key: jax.Array) -> jax.Array:
    return self.fn(z, direction, key) if self.needs_key else self.fn(z, direction)


def make_stepper(graphdef: nnx.GraphDef, params: nnx.State, stats: mdl.Stats,
                 sampler: SamplerConfig = SamplerConfig()) -> ModelStepper:
  """The model from ``train`` (``graphdef, params, stats``) as a stepper with this sampler."""
  config = nnx.merge(graphdef, params).config
  return ModelStepper(params=params, stats=stats, graphdef=graphdef, config=config,
                      sampler=sampler)


def as_stepper(fn: Callable[..., jax.Array], *, spatial_dims: int | None = None,
               num_fields: int | None = None, takes_key: bool = False) -> FunctionStepper:
  """Wrap ``fn(x [B, *S, F], direction: int) -> x_next`` (``fn(x, direction, key)`` when
  ``takes_key``) as a stepper. ``fn`` must be traceable by jax; the same function object
  compiles once."""
  return FunctionStepper(fn=fn, spatial_dims=spatial_dims, num_fields=num_fields,
                         needs_key=takes_key)


Stepper = ModelStepper | FunctionStepper


def _coerce(stepper: Any) -> Stepper:
  if isinstance(stepper, (ModelStepper, FunctionStepper)):
    return stepper
  if callable(stepper):
    return as_stepper(stepper)
  raise TypeError(f"expected a stepper (make_stepper / as_stepper) or a callable "
                  f"(x, direction) -> x_next, got {type(stepper).__name__}")


# ----------------------------------------------------------------------------- results


class Path(NamedTuple):
  """A rollout. x: physical states [B, D+1, *S, F]; z: diffusion-space states [B, D+1, *S', C].

  ``x[:, 0]`` is the start state as given (not re-decoded); ``x[:, i]`` for i >= 1 is the
  decoded state after i steps. For a function stepper z equals x.
  """

  x: jax.Array
  z: jax.Array


class RoundTrip(NamedTuple):
  """Forward-then-backward rollouts at K depths and their discrepancies.

  depths: the K depths (sorted, distinct).
  forward: the forward rollout to D = max(depths), [B, D+1, ...].
  backward: K backward rollouts; ``backward[k]`` starts at the forward state of depth
    ``depths[k]`` and has ``depths[k] + 1`` states. Its last state is the round trip's return.
  c_latent: [B, K] relative L2 of the returned diffusion-space state to the start's, pooled over
    space and channels (on fields, the normalised fields: a scale-free pooled variant).
  c_field: [B, K] relative L2 of the returned physical state to x0, pooled over space and fields.
  c_field_per: [B, K, F] the same per field.
  """

  depths: tuple[int, ...]
  forward: Path
  backward: tuple[Path, ...]
  c_latent: jax.Array
  c_field: jax.Array
  c_field_per: jax.Array


# ----------------------------------------------------------------------------- checks


def check_inputs(stepper: Stepper, x0: Any, direction: int | None, depths: Sequence[int],
                 key: Any) -> None:
  """Raise ValueError naming the problem for malformed rollout inputs (host side)."""
  for depth in depths:
    if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth < 1:
      raise ValueError(f"depth must be an int >= 1, got {depth!r}")
  if direction is not None and (isinstance(direction, bool) or direction not in (1, -1)):
    raise ValueError(f"direction must be +1 (forward) or -1 (backward), got {direction!r}")
  shape = np.shape(x0)
  sd = stepper.spatial_dims
  if sd is not None and len(shape) != sd + 2:
    raise ValueError(f"x0 must be [B, *S, F] with {sd} spatial axis(es) (rank {sd + 2}), "
                     f"got shape {shape}")
  if len(shape) < 2:
    raise ValueError(f"x0 must be [B, *S, F] (rank >= 2), got shape {shape}")
  if shape[0] < 1:
    raise ValueError("x0 has an empty batch")
  if stepper.num_fields is not None and shape[-1] != stepper.num_fields:
    raise ValueError(f"x0 has {shape[-1]} fields, the stepper expects {stepper.num_fields}")
  if isinstance(stepper, ModelStepper):
    stepper.config.latent_shape(tuple(shape[1:-1]))
  if not bool(jnp.all(jnp.isfinite(jnp.asarray(x0)))):
    raise ValueError("x0 contains NaN or inf")
  if stepper.needs_key and key is None:
    raise ValueError("this stepper is stochastic: pass a PRNG key")


def _prepare(stepper: Stepper, x0: Any, key: Any) -> tuple[Stepper, jax.Array, jax.Array]:
  """Arrays for the jitted core; on a mesh, stepper leaves and key are replicated over it."""
  key = jax.random.key(0) if key is None else key
  x0 = x0 if isinstance(x0, jax.Array) else jnp.asarray(x0, jnp.float32)
  sharding = getattr(x0, "sharding", None)
  if isinstance(sharding, NamedSharding) and sharding.mesh.size > 1:
    replicated = NamedSharding(sharding.mesh, PartitionSpec())
    stepper, key = jax.device_put((stepper, key), replicated)
  return stepper, x0.astype(jnp.float32), key


# ----------------------------------------------------------------------------- traced cores


def _scan_steps(stepper: Stepper, z0: jax.Array, direction: int, depth: int,
                key: jax.Array) -> jax.Array:
  """States after 1..depth steps: z0 [B, ...] -> [depth, B, ...]; step i uses fold_in(key, i)."""

  def body(z, i):
    z = stepper.step(z, direction, jax.random.fold_in(key, i))
    return z, z

  _, zs = jax.lax.scan(body, z0, jnp.arange(depth))
  return zs


def _path(stepper: Stepper, x_start: jax.Array, z_start: jax.Array, zs: jax.Array) -> Path:
  """Assemble a Path from the start (x, z) [B, ...] and the stepped states zs [D, B, ...]."""
  d, b = zs.shape[:2]
  xs = stepper.decode(zs.reshape((d * b,) + zs.shape[2:]))
  xs = xs.reshape((d, b) + xs.shape[1:])
  x = jnp.concatenate([x_start[:, None], jnp.moveaxis(xs, 0, 1)], axis=1)
  z = jnp.concatenate([z_start[:, None], jnp.moveaxis(zs, 0, 1)], axis=1)
  return Path(x=x, z=z)


def _relative_l2(a: jax.Array, b: jax.Array, axes: tuple[int, ...]) -> jax.Array:
  """||a - b|| / ||b|| over ``axes`` (the same definition as ``rlpost.eval.trust.relative_l2``)."""
  num = jnp.sqrt(jnp.sum(jnp.square(a - b), axis=axes))
  den = jnp.sqrt(jnp.sum(jnp.square(b), axis=axes))
  return num / jnp.maximum(den, 1e-30)


def _rollout_core(stepper: Stepper, x0: jax.Array, key: jax.Array, direction: int,
                  depth: int) -> Path:
  z0 = stepper.encode(x0)
  chex.assert_equal_shape_prefix([x0, z0], 1)
  return _path(stepper, x0, z0, _scan_steps(stepper, z0, direction, depth, key))


@functools.partial(jax.jit, static_argnames=("direction", "depth"))
def _rollout_jit(stepper, x0, key, direction, depth):
  TRACE_COUNTS["rollout"] += 1  # Python side effect: runs at trace time only
  return _rollout_core(stepper, x0, key, direction, depth)


@functools.partial(jax.jit, static_argnames=("direction", "depth", "num_samples"))
def _samples_jit(stepper, x0, key, direction, depth, num_samples):
  TRACE_COUNTS["sample_rollouts"] += 1
  keys = jax.random.split(key, num_samples)
  return jax.vmap(lambda k: _rollout_core(stepper, x0, k, direction, depth))(keys)


@functools.partial(jax.jit, static_argnames=("direction",))
def _step_jit(stepper, x, key, direction):
  TRACE_COUNTS["step"] += 1
  return stepper.decode(stepper.step(stepper.encode(x), direction, jax.random.fold_in(key, 0)))


@functools.partial(jax.jit, static_argnames=("depths",))
def _round_trip_jit(stepper, x0, key, depths):
  TRACE_COUNTS["round_trip"] += 1
  k_fwd, k_bwd = jax.random.split(key)
  forward = _rollout_core(stepper, x0, k_fwd, +1, max(depths))
  z0 = forward.z[:, 0]
  spatial = tuple(range(1, x0.ndim - 1))
  backward, c_latent, c_field, c_per = [], [], [], []
  for depth in depths:
    z_start, x_start = forward.z[:, depth], forward.x[:, depth]
    zs = _scan_steps(stepper, z_start, -1, depth, jax.random.fold_in(k_bwd, depth))
    path = _path(stepper, x_start, z_start, zs)
    backward.append(path)
    c_latent.append(_relative_l2(path.z[:, -1], z0, tuple(range(1, z0.ndim))))
    c_field.append(_relative_l2(path.x[:, -1], x0, spatial + (x0.ndim - 1,)))
    c_per.append(_relative_l2(path.x[:, -1], x0, spatial))
  return (forward, tuple(backward), jnp.stack(c_latent, 1), jnp.stack(c_field, 1),
          jnp.stack(c_per, 1))


# ----------------------------------------------------------------------------- public API


def step(stepper: Any, x: Any, direction: int, key: jax.Array | None = None, *,
         validate: bool = True) -> jax.Array:
  """One physical step from x [B, *S, F] in ``direction`` (+1 / -1): returns [B, *S, F] float32.

  Equals ``rollout(stepper, x, direction, 1, key).x[:, 1]``. In latent mode this encodes, steps
  and decodes; use ``rollout`` for several steps so the state stays in the latent space.
  """
  stepper = _coerce(stepper)
  if validate:
    check_inputs(stepper, x, direction, (1,), key)
  stepper, x, key = _prepare(stepper, x, key)
  return _step_jit(stepper, x, key, int(direction))


def rollout(stepper: Any, x0: Any, direction: int, depth: int, key: jax.Array | None = None, *,
            validate: bool = True) -> Path:
  """Roll ``depth`` physical steps from every start state x0 [B, *S, F] in ``direction``.

  Args:
    stepper: ``make_stepper(...)``, ``as_stepper(fn)`` or a callable ``(x, direction) -> x_next``.
    x0: [B, *S, F] float32 start states; place them with ``rlpost.sharding.shard_batch`` to
      split the batch over a mesh (the stepper is replicated over it automatically).
    direction: +1 forward, -1 backward (static).
    depth: number of physical steps, >= 1 (static).
    key: PRNG key; required for a stochastic stepper, ignored by a deterministic one.
    validate: check the inputs on the host first (shapes, values, NaNs).

  Returns:
    ``Path`` with x [B, depth+1, *S, F] and z [B, depth+1, *S', C].
  """
  stepper = _coerce(stepper)
  if validate:
    check_inputs(stepper, x0, direction, (depth,), key)
  stepper, x0, key = _prepare(stepper, x0, key)
  return _rollout_jit(stepper, x0, key, int(direction), int(depth))


def sample_rollouts(stepper: Any, x0: Any, direction: int, depth: int, key: jax.Array,
                    num_samples: int, *, validate: bool = True) -> Path:
  """``num_samples`` independent rollouts of each start state: Path with leading [M] axis.

  Sample m equals ``rollout(stepper, x0, direction, depth, jax.random.split(key, M)[m])``; use
  with a stochastic sampler for the sampling-dispersion baseline
  (``rlpost.eval.trust.dispersion``).
  """
  stepper = _coerce(stepper)
  if not isinstance(num_samples, int) or num_samples < 1:
    raise ValueError(f"num_samples must be an int >= 1, got {num_samples!r}")
  if validate:
    check_inputs(stepper, x0, direction, (depth,), key)
  stepper, x0, key = _prepare(stepper, x0, key)
  return _samples_jit(stepper, x0, key, int(direction), int(depth), num_samples)


def round_trip(stepper: Any, x0: Any, depths: int | Sequence[int], key: jax.Array | None = None,
               *, validate: bool = True) -> RoundTrip:
  """Forward i steps then backward i steps from x0 [B, *S, F], for each depth i in ``depths``.

  Args:
    stepper: as for ``rollout``.
    x0: [B, *S, F] start states.
    depths: an int D (every depth 1..D) or a sequence of depths >= 1 (deduplicated, sorted).
    key: PRNG key. The forward leg is exactly ``rollout(stepper, x0, +1, D, split(key)[0])``;
      the backward leg of depth i uses ``fold_in(split(key)[1], i)``.
    validate: check the inputs on the host first.

  Returns:
    ``RoundTrip``; the forward path also gives the rollout error E_i against a reference
    trajectory (``rlpost.eval.trust.rollout_error``). Cost: see the module docstring.
  """
  stepper = _coerce(stepper)
  if isinstance(depths, (int, np.integer)) and not isinstance(depths, bool):
    if depths < 1:
      raise ValueError(f"depth must be an int >= 1, got {depths!r}")
    depths = tuple(range(1, int(depths) + 1))
  if isinstance(depths, (str, bytes)) or not isinstance(depths, Sequence) or not depths:
    raise ValueError(f"depths must be an int or a non-empty sequence of ints, got {depths!r}")
  if validate:
    check_inputs(stepper, x0, None, depths, key)
  depths = tuple(sorted({int(d) for d in depths}))
  stepper, x0, key = _prepare(stepper, x0, key)
  forward, backward, c_lat, c_fld, c_per = _round_trip_jit(stepper, x0, key, depths)
  return RoundTrip(depths=depths, forward=forward, backward=backward, c_latent=c_lat,
                   c_field=c_fld, c_field_per=c_per)


def returned_states(rt: RoundTrip) -> jax.Array:
  """The K round-trip return states, [B, K, *S, F] (the last state of each backward leg)."""
  return jnp.stack([p.x[:, -1] for p in rt.backward], axis=1)

