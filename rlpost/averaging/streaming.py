"""Streaming weighted means of parameter pytrees: memory independent of the number of checkpoints.

Shape legend: ``params`` any pytree of arrays; L its number of leaves; D devices of the mesh the
parameters live on.

A ``StreamingMean`` holds one float32 accumulator per leaf (also for bfloat16 parameters), placed
with the same sharding as the parameters. Each checkpoint is folded in by one jitted program that
runs under ``jax.shard_map`` on every device's own shards: acc <- acc + w * float32(theta), with the
accumulator donated so it is updated in place. The same program counts non-finite values per
leaf and per device shard, so a NaN checkpoint is caught in the pass that reads it, and the error
names the step and the leaf; no collective (all-gather, all-reduce) is ever emitted, which
``accumulate_hlo`` lets tests check.

``SlidingWindowMean`` keeps the mean of the K latest snapshots in O(1) work per new snapshot:
add the newest, re-read and subtract the oldest, divide by the number in the window (not by K
before the window is full), and recompute from scratch every ``recompute_every`` pushes.
"""

from __future__ import annotations

import collections
import functools
from typing import Any, Callable, Hashable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

Params = Any
ACC_DTYPE = jnp.float32


def _mesh_and_specs(tree: Params) -> tuple[Mesh, list[P]]:
  """A mesh all leaves live on and each leaf's PartitionSpec on it.

  Leaves with a ``NamedSharding`` must share one mesh; leaves on a single device (or host
  arrays) are treated as replicated on a one-device mesh.
  """
  leaves = jax.tree.leaves(tree)
  meshes = {l.sharding.mesh for l in leaves
            if isinstance(l, jax.Array) and isinstance(l.sharding, NamedSharding)}
  if len(meshes) > 1:
    raise ValueError("parameters live on more than one mesh; place them on one mesh first")
  if meshes:
    mesh = meshes.pop()
    specs = []
    for l in leaves:
      if not (isinstance(l, jax.Array) and isinstance(l.sharding, NamedSharding)):
        raise ValueError("some parameters are on a mesh and some are not; place all on one mesh")
      specs.append(l.sharding.spec)
    return mesh, specs
  devices = {d for l in leaves if isinstance(l, jax.Array) for d in l.devices()}
  device = devices.pop() if len(devices) == 1 else jax.devices()[0]
  return Mesh(np.asarray([device]), ("_one",)), [P() for _ in leaves]


def leaf_names(tree: Params) -> list[str]:
  return [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


_PROGRAMS: dict = {}


def _program_for(like: Params) -> "_Program":
  """One compiled accumulate step per (tree structure, shapes, dtypes, mesh, specs)."""
  mesh, specs = _mesh_and_specs(like)
  leaves, treedef = jax.tree.flatten(like)
  key = (treedef, tuple((tuple(x.shape), str(x.dtype)) for x in leaves), mesh, tuple(specs))
  if key not in _PROGRAMS:
    if len(_PROGRAMS) > 64:
      _PROGRAMS.clear()
    _PROGRAMS[key] = _Program(mesh, specs)
  return _PROGRAMS[key]


class _Program:
  """The jitted, shard-local accumulate step for one mesh and list of leaf specs."""

  def __init__(self, mesh: Mesh, specs: list):
    self.mesh, self.specs = mesh, specs
    self.num_devices = self.mesh.devices.size
    self.shardings = [NamedSharding(self.mesh, s) for s in self.specs]
    axes = tuple(self.mesh.axis_names)
    n_leaves = len(self.specs)

    def local(acc, params, w):
      out, bad = [], []
      for a, x in zip(acc, params):
        x32 = x.astype(ACC_DTYPE)
        out.append(a + w * x32)
        # 1 where the shard holds NaN or inf: x * 0 is NaN exactly there, and one float sum
        # vectorises (counting with an integer reduction of ~isfinite cost 6x the add on
        # XLA:CPU). The values are counted only when a leaf is flagged (``_count_nonfinite``).
        bad.append(jnp.isnan(jnp.sum(x32 * 0.0)).astype(jnp.int32))
      return out, jnp.stack(bad)[None] if n_leaves else jnp.zeros((1, 0), jnp.int32)

    mapped = jax.shard_map(local, mesh=self.mesh,
                           in_specs=(self.specs, self.specs, P()),
                           out_specs=(self.specs, P(axes)), check_vma=False)
    self.accumulate = jax.jit(mapped, donate_argnums=0)
    self._zeros: dict = {}

  def put(self, leaves: list) -> list:
    return [x if isinstance(x, jax.Array) and x.sharding == s else jax.device_put(x, s)
            for x, s in zip(leaves, self.shardings)]

  def zeros(self, shapes: list[tuple]) -> list:
    key = tuple(shapes)
    if key not in self._zeros:
      self._zeros[key] = jax.jit(lambda: [jnp.zeros(s, ACC_DTYPE) for s in key],
                                 out_shardings=self.shardings)
    return self._zeros[key]()


@jax.jit
def _nonfinite(x: jax.Array) -> jax.Array:
  return jnp.sum(~jnp.isfinite(x), dtype=jnp.int64 if jax.config.jax_enable_x64 else jnp.int32)


def _count_nonfinite(x: jax.Array) -> int:
  """Number of NaN and inf values in ``x`` (a global count, on any sharding)."""
  return int(_nonfinite(x))


class StreamingMean:
  """sum_i w_i theta_i / sum_i w_i over parameter pytrees fed one at a time.

  like: a pytree of arrays (or ``jax.ShapeDtypeStruct`` with shardings) giving the structure,
    shapes, dtypes and placement; the accumulator takes the same shardings.
  check_finite: raise a ``FloatingPointError`` naming the step and leaves when an added tree
    holds NaN or inf (the accumulator then refuses to give a result).
  """

  def __init__(self, like: Params, *, check_finite: bool = True):
    leaves, self.treedef = jax.tree.flatten(like)
    self.names = leaf_names(like)
    self.shapes = [tuple(x.shape) for x in leaves]
    self.dtypes = [jax.dtypes.canonicalize_dtype(x.dtype) for x in leaves]
    self._program = _program_for(like)
    self.check_finite = check_finite
    self.acc = self._program.zeros(self.shapes)
    self._poisoned = False
    self.total_weight = 0.0
    self.count = 0
    self.steps: list = []

  @property
  def shardings(self) -> Params:
    return jax.tree.unflatten(self.treedef, self._program.shardings)

  def _validate(self, params: Params, step: Hashable) -> list:
    leaves, treedef = jax.tree.flatten(params)
    if treedef != self.treedef:
      raise ValueError(f"checkpoint at step {step}: parameter tree does not match the first one "
                       f"({len(leaves)} leaves vs {len(self.shapes)}; {treedef} vs {self.treedef})")
    for name, x, shape in zip(self.names, leaves, self.shapes):
      if tuple(np.shape(x)) != shape:
        raise ValueError(f"checkpoint at step {step}: leaf {name} has shape {tuple(np.shape(x))}, "
                         f"expected {shape}")
    return leaves

  def add(self, params: Params, weight: float = 1.0, *, step: Hashable = None) -> None:
    """Fold ``params`` in with ``weight`` (may be negative: subtracting a snapshot)."""
    leaves = self._program.put(self._validate(params, step))
    self.acc, bad = self._program.accumulate(self.acc, leaves, jnp.float32(weight))
    if self.check_finite:
      per_device = np.asarray(jax.device_get(bad)).reshape(-1, len(self.names))
      flagged = np.flatnonzero(per_device.any(axis=0))
      if flagged.size:
        names = [f"{self.names[i]} ({_count_nonfinite(leaves[i])} values)" for i in flagged]
        self._poisoned = True
        raise FloatingPointError(f"checkpoint at step {step} holds non-finite values in "
                                 f"{len(names)} leaves: {', '.join(names[:5])}")
    self.total_weight += float(weight)
    self.count += 1
    self.steps.append(step)

  def result(self, *, normalize: bool = True, dtypes: Sequence | None = None) -> Params:
    """The weighted mean (or the raw weighted sum with ``normalize=False``) in the parameters'
    dtypes (or ``dtypes``), with the accumulator's shardings."""
    if self.count == 0:
      raise ValueError("nothing was averaged (the selection was empty)")
    if self._poisoned:
      raise FloatingPointError("the accumulator holds a non-finite checkpoint; start again")
    scale = 1.0 / self.total_weight if normalize else 1.0
    if normalize and abs(self.total_weight) < 1e-12:
      raise ValueError(f"the weights sum to {self.total_weight}; cannot normalise")
    dtypes = list(self.dtypes if dtypes is None else dtypes)
    out = [_finish(a, jnp.float32(scale), d) for a, d in zip(self.acc, dtypes)]
    return jax.tree.unflatten(self.treedef, out)


@functools.partial(jax.jit, static_argnums=2)
def _finish(a, scale, dtype):
  return (a * scale).astype(dtype)


def accumulate_hlo(like: Params) -> str:
  """The compiled HLO text of the accumulate step for ``like`` (for checking collectives)."""
  prog = _program_for(like)
  acc = prog.zeros([tuple(x.shape) for x in jax.tree.leaves(like)])
  leaves = prog.put(jax.tree.leaves(like))
  return prog.accumulate.lower(acc, leaves, jnp.float32(1.0)).compile().as_text()


class SlidingWindowMean:
  """Mean of the ``k`` most recently pushed snapshots with O(1) reads per push.

  load: step -> params; called once for the pushed step and once more for the step that leaves
    the window (re-read, e.g. from disk, instead of kept in memory).
  recompute_every: after this many pushes the window sum is rebuilt by re-reading the k
    snapshots in the window, which bounds floating-point drift from repeated add/subtract.
  """

  def __init__(self, k: int, load: Callable[[Hashable], Params], *, recompute_every: int = 64,
               check_finite: bool = True):
    if k < 1:
      raise ValueError(f"window length k must be >= 1, got {k}")
    if recompute_every < 1:
      raise ValueError(f"recompute_every must be >= 1, got {recompute_every}")
    self.k = k
    self.load = load
    self.recompute_every = recompute_every
    self.check_finite = check_finite
    self.window: collections.deque = collections.deque()
    self._acc: StreamingMean | None = None
    self._pushes = 0
    self.reads = 0

  def _read(self, step):
    self.reads += 1
    return self.load(step)

  def push(self, step: Hashable) -> None:
    params = self._read(step)
    if self._acc is None:
      self._acc = StreamingMean(params, check_finite=self.check_finite)
    self._acc.add(params, 1.0, step=step)
    self.window.append(step)
    if len(self.window) > self.k:
      old = self.window.popleft()
      self._acc.add(self._read(old), -1.0, step=old)
    self._pushes += 1
    if self._pushes % self.recompute_every == 0:
      self.recompute()

  def recompute(self) -> None:
    """Rebuild the window sum from the snapshots in the window."""
    if not self.window:
      return
    acc = None
    for step in self.window:
      params = self._read(step)
      if acc is None:
        acc = StreamingMean(params, check_finite=self.check_finite)
      acc.add(params, 1.0, step=step)
    self._acc = acc

  def mean(self) -> Params:
    """The mean of the snapshots now in the window (divided by how many there are)."""
    if not self.window:
      raise ValueError("the sliding window is empty")
    acc = self._acc
    scale = 1.0 / len(self.window)
    out = [_finish(a, jnp.float32(scale), d) for a, d in zip(acc.acc, acc.dtypes)]
    return jax.tree.unflatten(acc.treedef, out)
