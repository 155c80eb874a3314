"""Float64 pseudo-spectral time steppers on periodic grids (NumPy).

A state is held in Fourier space: ``rfft`` over the last axis in 1D (``complex128 [..., X//2+1]``),
``rfft2`` over the last two axes in 2D (``complex128 [..., H, W//2+1]``, rows are y, columns x).
Every leading axis is a batch axis. The Nyquist modes are kept at zero (their derivative is not
defined on an even grid); ``project`` removes them from an initial condition.

An equation is written ``u_t = L u + N(u)`` with a diagonal linear operator ``L`` (an array over
the Fourier modes) and a nonlinear term ``N`` (a function of the Fourier state). Quadratic
products are dealiased by the 3/2 rule (evaluated on a grid padded to 3/2 of the points), so no
retained mode is truncated and the semi-discrete KdV and Euler systems conserve the L2 norm.

Two integrators, both valid for a negative step ``h`` (stepping backward in time):

* ``if_rk4``: integrating factor with classical RK4 (Trefethen, *Spectral Methods in MATLAB*,
  2000, program 27). The linear part is exact; for a dispersive ``L`` (``|exp(hL)| = 1``) a step
  of ``-h`` undoes a step of ``h`` up to the O(h^5) local error, which is what makes the
  forward-then-backward check meaningful.
* ``etdrk4``: exponential time differencing RK4 (Cox and Matthews 2002) with coefficients from
  the contour integral of Kassam and Trefethen (2005), for stiff dissipative ``L``. Backward
  (``h < 0``) it amplifies mode k by ``exp(|h| |L_k|)``: the scheme is then as ill posed as the
  equation, and it overflows within a few steps.

``run`` applies a step function ``substeps`` times per output frame.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# scipy (a dependency of jax) transforms these small batched grids faster than numpy.fft.
from scipy import fft as _fft

Step = Callable[[np.ndarray], np.ndarray]


def wavenumbers(n: int, length: float) -> np.ndarray:
  """Angular wavenumbers of ``rfft`` on ``n`` points over a period ``length``: float64 [n//2+1]."""
  return 2.0 * np.pi / length * np.arange(n // 2 + 1, dtype=np.float64)


def wavenumbers_2d(n: int, length: float) -> tuple[np.ndarray, np.ndarray]:
  """``(ky [n, 1], kx [1, n//2+1])`` float64, the wavenumbers of ``rfft2`` on an n x n grid."""
  ky = 2.0 * np.pi / length * np.fft.fftfreq(n, 1.0 / n)
  kx = wavenumbers(n, length)
  return ky[:, None], kx[None, :]


def nyquist_mask(n: int, ndim: int) -> np.ndarray:
  """float64 mask over the Fourier modes, 0 on the Nyquist modes of an even ``n``, else 1.

  Shape ``[n//2+1]`` for ``ndim == 1``, ``[n, n//2+1]`` for ``ndim == 2``.
  """
  m = np.ones(n // 2 + 1)
  if n % 2 == 0:
    m[-1] = 0.0
  if ndim == 1:
    return m
  if ndim != 2:
    raise ValueError(f"ndim must be 1 or 2, got {ndim}")
  rows = np.ones(n)
  if n % 2 == 0:
    rows[n // 2] = 0.0
  return rows[:, None] * m[None, :]


def to_fourier(u: np.ndarray, ndim: int) -> np.ndarray:
  """Physical ``float [..., *S]`` -> Fourier ``complex128``, Nyquist modes removed."""
  u = np.asarray(u, np.float64)
  n = u.shape[-1]
  if ndim == 1:
    return _fft.rfft(u) * nyquist_mask(n, 1)
  return _fft.rfft2(u) * nyquist_mask(n, 2)


def to_physical(u_hat: np.ndarray, n: int, ndim: int) -> np.ndarray:
  """Fourier ``complex128`` -> physical ``float64 [..., *S]`` on ``n`` points per axis."""
  if ndim == 1:
    return _fft.irfft(u_hat, n=n)
  return _fft.irfft2(u_hat, s=(n, n))


def project(u: np.ndarray, ndim: int) -> np.ndarray:
  """The grid function ``u`` float64 [..., *S] without its Nyquist modes (same shape)."""
  return to_physical(to_fourier(u, ndim), u.shape[-1], ndim)


def _padded_size(n: int) -> int:
  return 3 * ((n + 1) // 2)


def _pad_1d(u_hat: np.ndarray, n: int) -> np.ndarray:
  """Physical values on the 3/2-padded grid of a 1D Fourier state: float64 [..., 3n/2]."""
  m = _padded_size(n)
  padded = np.zeros(u_hat.shape[:-1] + (m // 2 + 1,), dtype=np.complex128)
  padded[..., : n // 2 + 1] = u_hat
  return _fft.irfft(padded, n=m) * (m / n)


def _truncate_1d(f: np.ndarray, n: int) -> np.ndarray:
  """Fourier state on ``n`` points of a function sampled on the padded grid [..., 3n/2]."""
  m = f.shape[-1]
  return _fft.rfft(f)[..., : n // 2 + 1] * (n / m) * nyquist_mask(n, 1)


def _pad_2d(u_hat: np.ndarray, n: int) -> np.ndarray:
  """Physical values on the 3/2-padded grid of a 2D Fourier state: float64 [..., 3n/2, 3n/2].

  The two axes are transformed separately so that the zero columns of the padding are not.
  """
  m = _padded_size(n)
  h = n // 2
  rows = np.zeros(u_hat.shape[:-2] + (m, h + 1), dtype=np.complex128)
  rows[..., :h, :] = u_hat[..., :h, :]
  rows[..., m - h:, :] = u_hat[..., n - h:, :]
  cols = _fft.ifft(rows, axis=-2, overwrite_x=True)
  padded = np.zeros(u_hat.shape[:-2] + (m, m // 2 + 1), dtype=np.complex128)
  padded[..., : h + 1] = cols
  return _fft.irfft(padded, n=m, axis=-1, overwrite_x=True) * (m * m / (n * n))


def _truncate_2d(f: np.ndarray, n: int) -> np.ndarray:
  """Fourier state on an n x n grid of a function sampled on the padded grid [..., m, m]."""
  m = f.shape[-1]
  h = n // 2
  cols = _fft.fft(_fft.rfft(f, axis=-1)[..., : h + 1], axis=-2, overwrite_x=True)
  out = np.zeros(f.shape[:-2] + (n, h + 1), dtype=np.complex128)
  out[..., :h, :] = cols[..., :h, :]
  out[..., n - h:, :] = cols[..., m - h:, :]
  return out * (n * n / (m * m)) * nyquist_mask(n, 2)


def kdv_terms(n: int, length: float) -> tuple[np.ndarray, Callable]:
  """Korteweg-de Vries ``u_t + 6 u u_x + u_xxx = 0`` on a periodic 1D grid.

  Returns ``(L, N)``: ``L = i k^3`` complex128 [n//2+1] (dispersive, ``|exp(hL)| = 1``) and
  ``N(u_hat) = -3 i k FFT(u^2)`` (dealiased). One soliton is
  ``u = c/2 sech^2(sqrt(c)/2 (x - c t - x0))``, moving right at speed ``c``.
  """
  k = wavenumbers(n, length) * nyquist_mask(n, 1)
  lin = 1j * k ** 3

  def nonlin(u_hat):
    u = _pad_1d(u_hat, n)
    return -3j * k * _truncate_1d(u * u, n)

  return lin, nonlin


def ks_terms(n: int, length: float) -> tuple[np.ndarray, Callable]:
  """Kuramoto-Sivashinsky ``u_t + u u_x + u_xx + u_xxxx = 0`` on a periodic 1D grid.

  Returns ``(L, N)``: ``L = k^2 - k^4`` float64 [n//2+1] (long waves grow, short ones decay fast)
  and ``N(u_hat) = -i k/2 FFT(u^2)`` (dealiased).
  """
  k = wavenumbers(n, length) * nyquist_mask(n, 1)
  lin = k ** 2 - k ** 4

  def nonlin(u_hat):
    u = _pad_1d(u_hat, n)
    return -0.5j * k * _truncate_1d(u * u, n)

  return lin, nonlin


def ns2d_terms(n: int, length: float, viscosity: float) -> tuple[np.ndarray, Callable]:
  """2D incompressible Navier-Stokes in vorticity form on a periodic n x n grid.

  ``w_t + u w_x + v w_y = nu (w_xx + w_yy)`` with velocity ``(u, v) = (psi_y, -psi_x)`` from the
  stream function ``-lap(psi) = w``. Returns ``(L, N)``: ``L = -nu |k|^2`` float64 [n, n//2+1] and
  ``N(w_hat) = -FFT(d_x(u w) + d_y(v w))`` (divergence form, dealiased). The mean vorticity
  is held at zero.
  """
  ky, kx = wavenumbers_2d(n, length)
  mask = nyquist_mask(n, 2)
  ky, kx = ky * mask, kx * mask
  k2 = kx ** 2 + ky ** 2
  inv_k2 = np.where(k2 > 0, 1.0 / np.where(k2 > 0, k2, 1.0), 0.0)
  lin = -viscosity * k2
  to_u, to_v = 1j * ky * inv_k2, -1j * kx * inv_k2  # vorticity -> velocity, in Fourier space
  dx, dy = -1j * kx, -1j * ky  # minus the derivatives

  def nonlin(w_hat):
    w = _pad_2d(w_hat, n)
    uw = _pad_2d(to_u * w_hat, n) * w
    vw = _pad_2d(to_v * w_hat, n) * w
    return dx * _truncate_2d(uw, n) + dy * _truncate_2d(vw, n)

  return lin, nonlin


def velocity_2d(w_hat: np.ndarray, n: int, length: float) -> tuple[np.ndarray, np.ndarray]:
  """Velocity ``(u, v)`` float64 [..., n, n] of a vorticity Fourier state [..., n, n//2+1]."""
  ky, kx = wavenumbers_2d(n, length)
  k2 = kx ** 2 + ky ** 2
  psi_hat = w_hat * np.where(k2 > 0, 1.0 / np.where(k2 > 0, k2, 1.0), 0.0)
  return (to_physical(1j * ky * psi_hat, n, 2), to_physical(-1j * kx * psi_hat, n, 2))


def if_rk4(lin: np.ndarray, nonlin: Callable, h: float) -> Step:
  """One integrating-factor RK4 step of size ``h`` (may be negative) for ``u_t = L u + N(u)``.

  With ``E = exp(hL/2)``, ``a = h N(u)``, ``b = h N(E(u + a/2))``, ``c = h N(E u + b/2)``,
  ``d = h N(E^2 u + E c)``: ``u' = E^2 u + (E^2 a + 2E(b + c) + d) / 6``.

  Args:
    lin: the diagonal linear operator over the Fourier modes.
    nonlin: ``N``, Fourier state -> Fourier tendency of the same shape.
    h: the step in physical time.

  Returns:
    ``step(u_hat) -> u_hat`` on complex128 Fourier states of any batch shape.
  """
  e = np.exp(0.5 * h * lin)
  e2 = e * e

  def step(u):
    a = h * nonlin(u)
    b = h * nonlin(e * (u + 0.5 * a))
    c = h * nonlin(e * u + 0.5 * b)
    d = h * nonlin(e2 * u + e * c)
    return e2 * u + (e2 * a + 2.0 * e * (b + c) + d) / 6.0

  return step


def etdrk4_coefficients(lin: np.ndarray, h: float, num_points: int = 32) -> tuple[np.ndarray, ...]:
  """ETDRK4 coefficients ``(E, E2, Q, f1, f2, f3)`` for a real diagonal ``L``, float64 like ``lin``.

  ``E = exp(hL)``, ``E2 = exp(hL/2)``; ``Q, f1, f2, f3`` are the phi-function combinations of
  Kassam and Trefethen (2005, eq. 2.5), evaluated as means over ``num_points`` points of a unit
  circle around each ``hL`` to avoid cancellation near ``hL = 0``.
  """
  lin = np.asarray(lin)
  real = not np.iscomplexobj(lin)
  part = (lambda z: z.real) if real else (lambda z: z)
  r = np.exp(2j * np.pi * (np.arange(num_points) + 0.5) / num_points)
  lr = h * lin[..., None] + r
  with np.errstate(over="ignore", invalid="ignore"):
    q = h * part(np.mean((np.exp(lr / 2) - 1) / lr, axis=-1))
    f1 = h * part(np.mean((-4 - lr + np.exp(lr) * (4 - 3 * lr + lr ** 2)) / lr ** 3, axis=-1))
    f2 = h * part(np.mean((2 + lr + np.exp(lr) * (lr - 2)) / lr ** 3, axis=-1))
    f3 = h * part(np.mean((-4 - 3 * lr - lr ** 2 + np.exp(lr) * (4 - lr)) / lr ** 3, axis=-1))
    return np.exp(h * lin), np.exp(0.5 * h * lin), q, f1, f2, f3


def etdrk4(lin: np.ndarray, nonlin: Callable, h: float, num_points: int = 32) -> Step:
  """One ETDRK4 step of size ``h`` (Cox and Matthews 2002) for ``u_t = L u + N(u)``, real ``L``.

  Returns ``step(u_hat) -> u_hat`` on complex128 Fourier states of any batch shape.
  """
  e, e2, q, f1, f2, f3 = etdrk4_coefficients(lin, h, num_points)

  def step(u):
    nu = nonlin(u)
    a = e2 * u + q * nu
    na = nonlin(a)
    b = e2 * u + q * na
    nb = nonlin(b)
    c = e2 * a + q * (2.0 * nb - nu)
    nc = nonlin(c)
    return e * u + nu * f1 + 2.0 * (na + nb) * f2 + nc * f3

  return step


def run(step: Step, u_hat: np.ndarray, frames: int, substeps: int) -> np.ndarray:
  """Apply ``step`` ``substeps`` times per frame; returns the ``frames + 1`` states (start first).

  Args:
    step: one time step, Fourier state -> Fourier state.
    u_hat: complex128 [B, *K], the start.
    frames: number of output frames after the start (>= 0).
    substeps: steps per frame (>= 1).

  Returns:
    complex128 [B, frames + 1, *K].
  """
  out = [u_hat]
  for _ in range(frames):
    for _ in range(substeps):
      u_hat = step(u_hat)
    out.append(u_hat)
  return np.stack(out, axis=1)
