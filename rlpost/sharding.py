"""Device mesh construction and partition rules.

rlpost programs are written once for a global batch and run on any mesh: ``jax.jit`` partitions
them from the shardings of their inputs (``NamedSharding`` over a ``Mesh``).

Mesh axes:
  ``data``  pure data parallelism: the batch is split, parameters are replicated;
  ``fsdp``  the batch is split too, and parameters are sharded along one dimension
            (fully-sharded data parallelism); XLA gathers each weight where it is used.

Relation to ``pmap``: a mesh axis is the modern form of a pmap axis. ``pmap(f, axis_name="data")``
over a batch with a leading device dimension corresponds to ``jit(f)`` with the batch placed by
``NamedSharding(mesh, P("data"))``; collectives that ``pmap`` code writes by hand
(``lax.pmean(x, "data")``) are inserted by the compiler, or written explicitly inside
``jax.shard_map`` over the same mesh when per-device code is clearer.

Multi-host: call ``initialize_distributed()`` first on every process; ``jax.devices()`` then lists
the devices of all hosts and the same mesh code applies.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

DATA = "data"
FSDP = "fsdp"
BATCH_AXES = (DATA, FSDP)


def make_mesh(data: int = -1, fsdp: int = 1, devices=None) -> Mesh:
  """A ``(data, fsdp)`` mesh. ``data=-1`` takes every device not used by ``fsdp``.

  Axes are ``Auto``: ``jit`` propagates shardings from the inputs, as ``pmap``-era code expects.
  """
  devices = list(jax.devices() if devices is None else devices)
  n = len(devices)
  if fsdp < 1 or n % fsdp:
    raise ValueError(f"fsdp={fsdp} must be >= 1 and divide the number of devices ({n})")
  if data == -1:
    data = n // fsdp
  if data * fsdp != n:
    raise ValueError(f"mesh data={data} x fsdp={fsdp} does not match the {n} devices available")
  return Mesh(np.asarray(devices).reshape(data, fsdp), BATCH_AXES,
              axis_types=(AxisType.Auto, AxisType.Auto))


def batch_spec(ndim: int) -> P:
  """PartitionSpec splitting the leading (batch) dimension over both mesh axes."""
  return P(BATCH_AXES, *([None] * (ndim - 1)))


def batch_size_multiple(mesh: Mesh) -> int:
  """Global batch sizes must be multiples of this."""
  return mesh.shape[DATA] * mesh.shape[FSDP]


def put(x: Any, sharding: NamedSharding) -> jax.Array:
  """Place ``x`` (the same global value on every process) with ``sharding``.

  On one process this is ``jax.device_put``. When the sharding spans devices of other processes,
  each process builds its own shards from its host copy (``jax.make_array_from_callback``), so no
  cross-host transfer is needed.
  """
  if sharding.is_fully_addressable:
    return jax.device_put(x, sharding)
  host = np.asarray(jax.device_get(x) if isinstance(x, jax.Array) else x)
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def shard_batch(tree: Any, mesh: Mesh) -> Any:
  """Place every array of ``tree`` with its leading dimension split over the mesh."""
  k = batch_size_multiple(mesh)

  def place(x):
    x = np.asarray(x) if not isinstance(x, jax.Array) else x
    if x.ndim == 0:
      return put(x, NamedSharding(mesh, P()))
    if x.shape[0] % k:
      raise ValueError(f"batch dimension {x.shape[0]} is not divisible by the mesh's "
                       f"{k} batch shards (data x fsdp)")
    return put(x, NamedSharding(mesh, batch_spec(x.ndim)))

  return jax.tree.map(place, tree)


def param_spec(shape: tuple[int, ...], fsdp_size: int, *, min_size: int = 2 ** 14,
               skip: int = 0) -> P:
  """FSDP rule: shard the largest dimension divisible by the fsdp size; small arrays replicate.

  ``skip``: leading dimensions never sharded (1 for the layer axis of layers stored stacked,
  which the layer scan slices one entry at a time)."""
  if fsdp_size == 1 or int(np.prod(shape, dtype=np.int64)) < min_size:
    return P()
  order = sorted(range(skip, len(shape)), key=lambda i: -shape[i])
  for i in order:
    if shape[i] % fsdp_size == 0:
      spec = [None] * len(shape)
      spec[i] = FSDP
      return P(*spec)
  return P()


def _stacked_layer(path) -> bool:
  """Whether a parameter path is under ``layers`` stored stacked (``layers/attn/...``, with no
  layer index after ``layers``)."""
  keys = [getattr(k, "key", getattr(k, "idx", getattr(k, "name", None))) for k in path]
  return any(k == "layers" and i + 1 < len(keys) and isinstance(keys[i + 1], str)
             for i, k in enumerate(keys))


def param_shardings(params: Any, mesh: Mesh, *, mode: str = "replicate",
                    min_size: int = 2 ** 14) -> Any:
  """NamedShardings for a parameter pytree: ``replicate`` or ``fsdp`` (``param_spec``; the
  layer axis of layers stored stacked stays whole)."""
  if mode not in ("replicate", "fsdp"):
    raise ValueError(f"sharding mode must be 'replicate' or 'fsdp', got {mode!r}")
  size = mesh.shape[FSDP] if mode == "fsdp" else 1
  return jax.tree_util.tree_map_with_path(
      lambda path, x: NamedSharding(mesh, param_spec(tuple(x.shape), size, min_size=min_size,
                                                     skip=int(_stacked_layer(path)))), params)


def shard_params(params: Any, mesh: Mesh, *, mode: str = "replicate", min_size: int = 2 ** 14) -> Any:
  """Place a parameter pytree on the mesh following ``param_shardings``."""
  return jax.tree.map(put, params, param_shardings(params, mesh, mode=mode, min_size=min_size))


def initialize_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None, *, cpu_collectives: str = "gloo") -> None:
  """Start JAX's distributed runtime for multi-host runs (no-op for a single process).

  Arguments default to the environment variables ``RLPOST_COORDINATOR`` (host:port),
  ``RLPOST_NUM_PROCESSES`` and ``RLPOST_PROCESS_ID``; on managed clusters (SLURM, TPU pods,
  Open MPI) ``jax.distributed.initialize()`` detects them itself when all are None.
  ``cpu_collectives`` selects the collectives of the CPU backend (``gloo`` lets several CPU
  processes, e.g. on one machine for testing, run sharded programs together); GPU and TPU
  backends use their own (NCCL, ICI/DCN) whatever it says. Call before any other JAX use.
  """
  coordinator_address = coordinator_address or os.environ.get("RLPOST_COORDINATOR")
  if num_processes is None and "RLPOST_NUM_PROCESSES" in os.environ:
    num_processes = int(os.environ["RLPOST_NUM_PROCESSES"])
  if process_id is None and "RLPOST_PROCESS_ID" in os.environ:
    process_id = int(os.environ["RLPOST_PROCESS_ID"])
  if num_processes == 1:
    return
  if cpu_collectives:
    jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id)
