"""The named dynamical systems: parameters, initial conditions, trajectories, reversibility.

Three systems on periodic grids, each integrated in float64 by a pseudo-spectral solver
(``rlpost.dynamics.solvers``) and stored as ``float32 [N, T, *S, F]``:

* ``kdv1d``: Korteweg-de Vries, conservative and time reversible; the fair test of round trips.
* ``ks1d``: Kuramoto-Sivashinsky, dissipative and chaotic; backward stepping is ill posed (the
  honest stress test).
* ``ns2d``: 2D incompressible Navier-Stokes (vorticity) at low viscosity, near-conservative;
  backward stepping is well posed over a few frames.

Each system also has an out-of-distribution (OOD) initial-condition family or parameter,
described by ``System.ood_description``. ``System.simulate(n, seed, ood)`` is deterministic in
its arguments, and trajectory i does not depend on n (initial conditions are drawn one
trajectory at a time). ``reversibility_error`` runs the exact solver forward then backward.

Measured (``reversibility_error(name, frames, seed=0, n=8)``, worst of 8 trajectories):
``kdv1d`` 4.2e-6 over 16 frames and 2.7e-5 over 40 (OOD 1.7e-5 / 1.0e-4; 32 solver steps per
frame left the fastest solitons at 1.4e-4 over 16 frames); ``ns2d`` 2.3e-5 over
4 frames, 1.8e-4 over 8, 1.2e-3 over 16 (OOD 2.0e-4 / 1.1e-3 / 7.2e-3); ``ks1d`` inf from one
frame on (the backward run overflows).

``kdv1d``'s OOD bumps overlap its solitons in simple statistics of the state (10/50/90%
quantiles over 64 trajectories x 40 frames, seed 0): peak 0.54/0.98/1.18 (OOD 0.52/1.00/1.38),
spatial mean 0.07/0.15/0.24 (OOD 0.07/0.16/0.24), mean square 0.03/0.07/0.14 (OOD
0.03/0.08/0.16).

Why not exponax for ``ks1d``: from the same state on the attractor, exponax 0.2.0's
``KuramotoSivashinskyConservative`` (float32, 2/3-rule dealiasing) agrees with this float64
solver to 1.4e-3 (relative L2) over 1-10 frames with ``order=4``, but its default ``order=2``
is 4.8e-3 off after one frame and 10% off after 20; the own solver keeps every system in
float64 with one dealiasing rule and one code path for the forward and backward checks
(``tests/dynamics/test_data.py`` keeps the order-4 comparison). Its own time-step error: 8 vs 64
steps per frame differ by 1e-5 after one frame.
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib

import numpy as np

from rlpost.dynamics import solvers


@dataclasses.dataclass(frozen=True)
class System(abc.ABC):
  """A dynamical system and its trajectory distribution.

  Attributes:
    name: registry name.
    spatial_shape: grid shape S, ``(X,)`` in 1D or ``(H, W)`` in 2D.
    num_fields: F, the number of fields (channels, last axis).
    field_names: F names.
    dt: physical time between two frames.
    num_frames: default number of frames T per trajectory (the initial state is frame 0).
    reversible: whether stepping backward in time is well posed.
    description: the equation, its parameters and whether backward stepping is well posed.
    ood_description: how the OOD split differs from the training distribution.
    domain_length: period of the domain along each spatial axis.
    substeps: solver steps per frame.
  """

  name: str
  spatial_shape: tuple[int, ...]
  num_fields: int
  field_names: tuple[str, ...]
  dt: float
  num_frames: int
  reversible: bool
  description: str
  ood_description: str
  domain_length: float
  substeps: int

  def __post_init__(self):
    if len(self.field_names) != self.num_fields:
      raise ValueError(f"{self.name}: {len(self.field_names)} field names for {self.num_fields} "
                       "fields")
    if any(s % 2 for s in self.spatial_shape) or len(set(self.spatial_shape)) != 1:
      raise ValueError(f"{self.name}: spatial_shape must be square with even sides, got "
                       f"{self.spatial_shape}")

  @property
  def ndim(self) -> int:
    """Number of spatial dimensions."""
    return len(self.spatial_shape)

  def fingerprint(self) -> str:
    """Short hash of every numeric parameter (changes when the data would change)."""
    skip = {"description", "ood_description"}
    items = [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self) if f.name not in skip]
    return hashlib.sha256(repr(items).encode()).hexdigest()[:8]

  # Subclasses: the equation and the initial conditions.
  @abc.abstractmethod
  def _terms(self, ood: bool):
    """``(L, N)`` of the equation (``solvers.*_terms``) for the in-distribution or OOD variant."""
    raise NotImplementedError

  def _step(self, lin, nonlin, h: float) -> solvers.Step:
    """The integrator for one solver step of size ``h``."""
    return solvers.etdrk4(lin, nonlin, h)

  @abc.abstractmethod
  def _draw_initial(self, rng: np.random.Generator, ood: bool) -> np.ndarray:
    """One initial condition, float64 [*S] (a single field), drawn from ``rng``."""
    raise NotImplementedError

  def _burn_in_frames(self, ood: bool) -> int:
    """Frames integrated and discarded before frame 0."""
    del ood
    return 0

  def initial_state(self, n: int, seed: int, ood: bool = False) -> np.ndarray:
    """Frame 0 of ``n`` trajectories (after any burn-in): float64 [n, *S, F].

    Deterministic in ``(n, seed, ood)``; the first m states equal ``initial_state(m, seed, ood)``
    (bitwise on one machine).
    """
    _check_count(n, "n")
    rng = np.random.default_rng(_check_seed(seed))
    x = np.stack([self._draw_initial(rng, ood) for _ in range(n)])
    x = solvers.project(x, self.ndim)
    burn = self._burn_in_frames(ood)
    if burn:
      x = self.advance(x[..., None], burn, ood=ood)[:, -1, ..., 0]
    return x[..., None]

  def advance(self, x: np.ndarray, frames: int, *, backward: bool = False,
              ood: bool = False) -> np.ndarray:
    """Integrate states ``frames`` frames with the exact solver (backward: time step ``-dt``).

    Args:
      x: float [B, *S, F] states (F = ``num_fields``).
      frames: number of frames to advance (>= 0).
      backward: step with negative time step.
      ood: use the OOD variant's equation parameters (they differ for ``ks1d``).

    Returns:
      float64 [B, frames + 1, *S, F], ``x`` first. Non-finite values are returned as they come
      (backward stepping of a dissipative system overflows).
    """
    if isinstance(frames, bool) or not isinstance(frames, (int, np.integer)) or frames < 0:
      raise ValueError(f"frames must be a non-negative integer, got {frames!r}")
    x = np.asarray(x, np.float64)
    if x.ndim != 2 + self.ndim or x.shape[1:] != (*self.spatial_shape, self.num_fields):
      raise ValueError(f"{self.name}: states must be [B, {', '.join(map(str, self.spatial_shape))}"
                       f", {self.num_fields}], got {x.shape}")
    lin, nonlin = self._terms(ood)
    h = (-1.0 if backward else 1.0) * self.dt / self.substeps
    u_hat = solvers.to_fourier(x[..., 0], self.ndim)
    with np.errstate(over="ignore", invalid="ignore"):
      traj = solvers.run(self._step(lin, nonlin, h), u_hat, frames, self.substeps)
      return solvers.to_physical(traj, self.spatial_shape[0], self.ndim)[..., None]

  def simulate(self, n: int, seed: int, ood: bool = False,
               num_frames: int | None = None) -> np.ndarray:
    """``n`` trajectories, float32 [n, T, *S, F], T = ``num_frames`` (default ``self.num_frames``).

    Deterministic in ``(n, seed, ood, num_frames)``; trajectory i does not depend on ``n``.
    """
    t = self.num_frames if num_frames is None else _check_count(num_frames, "num_frames")
    x0 = self.initial_state(n, seed, ood)
    traj = self.advance(x0, t - 1, ood=ood)
    if not np.all(np.isfinite(traj)):
      bad = int(np.argmax(~np.isfinite(traj).reshape(n, -1).all(-1)))
      raise FloatingPointError(f"{self.name}: trajectory {bad} (seed {seed}) is not finite")
    return traj.astype(np.float32)


def _check_count(n, what: str) -> int:
  if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0:
    raise ValueError(f"{what} must be a positive integer, got {n!r}")
  return int(n)


def _check_seed(seed) -> int:
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
    raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
  return int(seed)


def _grid(n: int, length: float) -> np.ndarray:
  return np.arange(n, dtype=np.float64) * (length / n)


def _periodic_distance(x: np.ndarray, x0: float, length: float) -> np.ndarray:
  """Signed distance from ``x0`` to ``x`` on a circle of circumference ``length``, in
  ``[-length/2, length/2)``."""
  return (x - x0 + 0.5 * length) % length - 0.5 * length


def _separated_positions(rng: np.random.Generator, count: int, length: float,
                         min_separation: float) -> np.ndarray:
  """``count`` uniform positions on a circle, pairwise at least ``min_separation`` apart.

  Rejection sampling, one position at a time (deterministic given ``rng``); float64 [count].
  """
  # Each placed position forbids an arc of 2 * min_separation; this keeps room for the next one.
  if 2 * (count - 1) * min_separation >= length:
    raise ValueError(f"{count} positions {min_separation} apart may not fit in length {length}")
  out: list[float] = []
  while len(out) < count:
    p = rng.uniform(0.0, length)
    if all(abs(_periodic_distance(np.float64(p), q, length)) >= min_separation for q in out):
      out.append(p)
  return np.asarray(out)


@dataclasses.dataclass(frozen=True)
class KdV1D(System):
  """Korteweg-de Vries with random solitons (see ``solvers.kdv_terms`` for the equation).

  Attributes (beyond ``System``):
    num_solitons: inclusive range of the number of solitons per initial condition.
    min_separation: least distance between two solitons' (or bumps') centres, so that their sum
      does not start as one tall, under-resolved peak.
    speed_range: soliton speeds ``c`` (amplitude ``c/2``, width ``2/sqrt(c)``).
    ood_amplitude_range, ood_width_range: Gaussian bumps ``a exp(-x^2 / (2 w^2))`` of the OOD set.
  """

  num_solitons: tuple[int, int]
  min_separation: float
  speed_range: tuple[float, float]
  ood_amplitude_range: tuple[float, float]
  ood_width_range: tuple[float, float]

  def _terms(self, ood):
    del ood
    return solvers.kdv_terms(self.spatial_shape[0], self.domain_length)

  def _draw_initial(self, rng, ood):
    n, length = self.spatial_shape[0], self.domain_length
    x = _grid(n, length)
    count = int(rng.integers(self.num_solitons[0], self.num_solitons[1] + 1))
    u = np.zeros(n)
    for x0 in _separated_positions(rng, count, length, self.min_separation):
      d = _periodic_distance(x, x0, length)
      if ood:
        a = rng.uniform(*self.ood_amplitude_range)
        w = rng.uniform(*self.ood_width_range)
        u += a * np.exp(-0.5 * (d / w) ** 2)
      else:
        c = rng.uniform(*self.speed_range)
        # Periodic images keep the slowly decaying tails of wide solitons smooth at the seam.
        for shift in (-length, 0.0, length):
          u += 0.5 * c / np.cosh(0.5 * np.sqrt(c) * (d + shift)) ** 2
    return u


@dataclasses.dataclass(frozen=True)
class KS1D(System):
  """Kuramoto-Sivashinsky on the attractor (see ``solvers.ks_terms`` for the equation).

  Attributes (beyond ``System``):
    burn_in: physical time integrated and discarded from a small random start.
    ood_domain_length: the OOD set's period (same grid size, so a different dx).
    initial_modes: the random start is a sum of this many lowest Fourier modes.
  """

  burn_in: float
  ood_domain_length: float
  initial_modes: int

  def _length(self, ood):
    return self.ood_domain_length if ood else self.domain_length

  def _terms(self, ood):
    return solvers.ks_terms(self.spatial_shape[0], self._length(ood))

  def _draw_initial(self, rng, ood):
    n, length = self.spatial_shape[0], self._length(ood)
    x = _grid(n, length)
    k = 2 * np.pi / length * np.arange(1, self.initial_modes + 1)
    amp = rng.normal(0.0, 0.5, size=self.initial_modes)
    phase = rng.uniform(0.0, 2 * np.pi, size=self.initial_modes)
    return np.sum(amp[:, None] * np.cos(k[:, None] * x[None, :] + phase[:, None]), axis=0)

  def _burn_in_frames(self, ood):
    del ood
    return round(self.burn_in / self.dt)


@dataclasses.dataclass(frozen=True)
class NS2D(System):
  """2D Navier-Stokes vorticity, decaying (see ``solvers.ns2d_terms`` for the equation).

  Attributes (beyond ``System``):
    viscosity: kinematic viscosity nu.
    band: inclusive range of |k| (integer wavenumbers) of the random initial vorticity.
    rms_range: the initial vorticity's root mean square is drawn uniformly from this range.
    ood_num_vortices: inclusive range of the number of Gaussian vortices in the OOD set.
    ood_radius_range: their radii.
  """

  viscosity: float
  band: tuple[int, int]
  rms_range: tuple[float, float]
  ood_num_vortices: tuple[int, int]
  ood_radius_range: tuple[float, float]

  def _terms(self, ood):
    del ood
    return solvers.ns2d_terms(self.spatial_shape[0], self.domain_length, self.viscosity)

  def _step(self, lin, nonlin, h):
    # The viscous operator is mild (|h L| << 1), so the integrating factor is as accurate as
    # ETDRK4 here, and its exp(h L) factors are cheaper to form.
    return solvers.if_rk4(lin, nonlin, h)

  def _draw_initial(self, rng, ood):
    n, length = self.spatial_shape[0], self.domain_length
    if ood:
      x = _grid(n, length)
      w = np.zeros((n, n))
      count = int(rng.integers(self.ood_num_vortices[0], self.ood_num_vortices[1] + 1))
      for _ in range(count):
        cx, cy = rng.uniform(0.0, length, size=2)
        r = rng.uniform(*self.ood_radius_range)
        sign = rng.choice([-1.0, 1.0])
        dx = _periodic_distance(x, cx, length)[None, :]
        dy = _periodic_distance(x, cy, length)[:, None]
        w += sign * np.exp(-0.5 * (dx ** 2 + dy ** 2) / r ** 2)
    else:
      # Random phases on the modes with band[0] <= |k| <= band[1] (integer wavenumbers for the
      # default period 2 pi), flat amplitude spectrum.
      ky, kx = solvers.wavenumbers_2d(n, length)
      kk = np.sqrt(kx ** 2 + ky ** 2) * length / (2 * np.pi)
      shell = (kk >= self.band[0]) & (kk <= self.band[1])
      coef = rng.normal(size=kk.shape) + 1j * rng.normal(size=kk.shape)
      w = np.fft.irfft2(coef * shell, s=(n, n))
    w = w - w.mean()
    rms = rng.uniform(*self.rms_range)
    return w * (rms / np.sqrt(np.mean(w ** 2)))


_KDV = KdV1D(
    name="kdv1d",
    spatial_shape=(64,),
    num_fields=1,
    field_names=("u",),
    dt=0.5,
    num_frames=40,
    reversible=True,
    description=(
        "Korteweg-de Vries u_t + 6 u u_x + u_xxx = 0 on a periodic domain of length 40 (64 points), "
        "frames 0.5 time units apart, float64 pseudo-spectral solver (ETDRK4, 64 steps per frame, "
        "3/2-rule dealiasing). Initial condition: a sum of 1-4 solitons c/2 sech^2(sqrt(c)/2 x) "
        "with speeds c uniform in [0.2, 2.5] at uniform random positions at least 6 apart, so "
        "difficulty varies widely across trajectories (one slow soliton to four that overtake "
        "each other). Conservative and time reversible (x -> -x, t -> -t): backward stepping is "
        "well posed, and the solver run forward then backward returns to its start."),
    ood_description=(
        "1-4 Gaussian bumps a exp(-x^2/(2 w^2)), at least 6 apart, with amplitude a in "
        "[0.2, 1.2] and width w in [0.8, 1.8] drawn independently, so amplitude and width break "
        "the soliton relation: each bump sheds a dispersive wave train while it resolves into "
        "solitons. The ranges were chosen so that the peak value, mean and energy of OOD "
        "trajectories overlap the training set's (quantiles in ``rlpost/dynamics/systems.py``'s "
        "docstring), so the shift is in the dynamics rather than in simple statistics of the "
        "state."),
    domain_length=40.0,
    substeps=64,
    num_solitons=(1, 4),
    min_separation=6.0,
    speed_range=(0.2, 2.5),
    ood_amplitude_range=(0.2, 1.2),
    ood_width_range=(0.8, 1.8),
)

_KS = KS1D(
    name="ks1d",
    spatial_shape=(64,),
    num_fields=1,
    field_names=("u",),
    dt=1.0,
    num_frames=40,
    reversible=False,
    description=(
        "Kuramoto-Sivashinsky u_t + u u_x + u_xx + u_xxxx = 0 on a periodic domain of length 44 "
        "(64 points), frames 1 time unit apart, float64 ETDRK4 (8 steps per frame, 3/2-rule "
        "dealiasing), started from a random sum of the 6 lowest modes and run 200 time units "
        "before frame 0 so trajectories lie on the chaotic attractor (leading Lyapunov exponent "
        "about 0.09 per time unit). Dissipative: mode k decays like exp(-(k^4 - k^2) t) forward, "
        "so stepping backward multiplies it by exp((k^4 - k^2) t) and is ill posed; the exact "
        "solver run backward overflows within a frame. The honest stress test for round trips."),
    ood_description=(
        "A longer domain, length 56 instead of 44, on the same 64 points: trajectories from the "
        "same chaotic family with more unstable wavelengths per domain and a coarser dx (0.875 vs "
        "0.69), so the dynamics per grid cell differ while amplitudes and the shape of the "
        "spectrum overlap. (Lengths 32, 40 and 48 were avoided: many trajectories settle on "
        "steady or travelling states there.)"),
    domain_length=44.0,
    substeps=8,
    burn_in=200.0,
    ood_domain_length=56.0,
    initial_modes=6,
)

_NS = NS2D(
    name="ns2d",
    spatial_shape=(32, 32),
    num_fields=1,
    field_names=("vorticity",),
    dt=0.25,
    num_frames=40,
    reversible=True,
    description=(
        "2D incompressible Navier-Stokes in vorticity form w_t + u.grad(w) = nu lap(w), "
        "periodic [0, 2 pi)^2 on 32 x 32 points, nu = 1e-3, unforced (decaying), frames 0.25 "
        "time units apart, float64 pseudo-spectral solver (integrating-factor RK4, 4 steps per "
        "frame, 3/2-rule dealiasing). Initial vorticity: random phases on wavenumbers "
        "1 <= |k| <= 4, root mean square uniform in [0.5, 1.5] (so difficulty varies across "
        "trajectories). Near-conservative: the inviscid part is time reversible and conserves "
        "energy and enstrophy; viscosity removes about 8% of the energy over 40 frames, and the "
        "viscous factor exp(nu |k|^2 t) run backward is at most 1.06 per frame on this grid, so "
        "backward stepping is well posed over a few frames (errors grow with depth through that "
        "factor and the flow's chaos)."),
    ood_description=(
        "A different initial-condition family: 3-8 Gaussian vortices of random sign and radius "
        "in [0.4, 0.8], rescaled to the same root mean square vorticity range [0.5, 1.5]: "
        "coherent compact vortices instead of a random-phase band-limited field, with a matched "
        "vorticity scale."),
    domain_length=2 * np.pi,
    substeps=4,
    viscosity=1e-3,
    band=(1, 4),
    rms_range=(0.5, 1.5),
    ood_num_vortices=(3, 8),
    ood_radius_range=(0.4, 0.8),
)

_REGISTRY: dict[str, System] = {s.name: s for s in (_KDV, _KS, _NS)}


def list_systems() -> list[str]:
  """Names of the registered systems, sorted."""
  return sorted(_REGISTRY)


def get_system(name: str) -> System:
  """The system registered as ``name``; ValueError listing the valid names otherwise."""
  if not isinstance(name, str) or name not in _REGISTRY:
    raise ValueError(f"unknown system {name!r}; valid systems: {list_systems()}")
  return _REGISTRY[name]


def simulate(system_name: str, n: int, seed: int, ood: bool = False,
             num_frames: int | None = None) -> np.ndarray:
  """``get_system(system_name).simulate(...)``: float32 [n, T, *S, F]."""
  return get_system(system_name).simulate(n, seed, ood, num_frames)


def reversibility_error(system_name: str, frames: int, seed: int, *, n: int = 2,
                        ood: bool = False) -> float:
  """Forward-then-backward error of a system's exact solver.

  Runs ``n`` initial states (``System.initial_state``) forward ``frames`` frames, then backward
  ``frames`` frames from the end point with the time step negated, and returns
  ``max_i ||back_i - x0_i|| / ||x0_i||`` (relative L2 per trajectory, worst of ``n``). ``inf``
  when the backward run overflows (an ill-posed backward problem).

  Args:
    system_name: a registered system.
    frames: number of frames each way (>= 1).
    seed: seed of the initial states.
    n: number of trajectories.
    ood: start from the OOD distribution instead.

  Returns:
    The worst relative L2 error, a Python float (``inf`` if not finite).
  """
  system = get_system(system_name)
  _check_count(frames, "frames")
  x0 = system.initial_state(n, seed, ood)
  end = system.advance(x0, frames, ood=ood)[:, -1]
  back = system.advance(end, frames, backward=True, ood=ood)[:, -1]
  axes = tuple(range(1, x0.ndim))
  with np.errstate(over="ignore", invalid="ignore"):
    err = np.sqrt(np.sum((back - x0) ** 2, axis=axes) / np.sum(x0 ** 2, axis=axes))
  if not np.all(np.isfinite(err)):
    return float("inf")
  return float(np.max(err))
