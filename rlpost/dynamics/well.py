"""Trajectories from The Well's HDF5 files (https://polymathic-ai.org/the_well).

A Well file holds one dataset's trajectories on a uniform grid at constant time steps:

* root attributes ``n_spatial_dims``, ``n_trajectories`` (and ``dataset_name``, ``grid_type``, ...);
* ``dimensions``: attribute ``spatial_dims`` (e.g. ``['x', 'y']``), a ``time`` dataset
  ``[n_steps]`` and one coordinate dataset per spatial dimension; the spatial axes of every field
  follow the order of ``spatial_dims``;
* ``t0_fields`` / ``t1_fields`` / ``t2_fields``: scalar, vector and tensor fields, each group with
  attribute ``field_names``; a field's dataset is ``[n_traj, n_steps, *spatial]`` followed by
  ``D`` (vectors) or ``D, D`` (tensors), with attributes ``sample_varying`` and ``time_varying``
  (when false, the trajectory or time axis is absent) and ``dim_varying`` (one flag per spatial
  axis; an axis whose flag is false is absent);
* ``boundary_conditions`` and ``scalars`` (not read here).

``load_well`` returns the time-varying fields as one ``float32 [N, T, *S, F]`` array, vector and
tensor components flattened into channels named like The Well's own loader does
(``velocity_x``, ``velocity_y``, ``stress_xy``, ...). h5py is an optional dependency (extra
``well``); it is imported when a file is read.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence

import numpy as np

FIELD_GROUPS = ("t0_fields", "t1_fields", "t2_fields")


def _import_h5py():
  try:
    import h5py
  except ImportError as e:
    raise ImportError("reading The Well's HDF5 files needs h5py; install the 'well' extra: "
                      "pip install 'rlpost[well]'") from e
  return h5py


def _strings(value) -> list[str]:
  """An HDF5 string or string-list attribute as a list of str."""
  return [v.decode() if isinstance(v, bytes) else str(v) for v in np.atleast_1d(value)]


def _flag(ds, key: str, default: bool = True) -> bool:
  return bool(ds.attrs[key]) if key in ds.attrs else default


def _time_slice(time_slice, num_steps: int) -> slice:
  if time_slice is None:
    return slice(0, num_steps, 1)
  if isinstance(time_slice, slice):
    s = time_slice
  elif isinstance(time_slice, (tuple, list)) and 1 <= len(time_slice) <= 3:
    s = slice(*time_slice)
  else:
    raise ValueError(f"time_slice must be a slice or (start, stop[, step]), got {time_slice!r}")
  start, stop, step = s.indices(num_steps)
  if step <= 0:
    raise ValueError(f"time_slice step must be positive, got {step}")
  if len(range(start, stop, step)) == 0:
    raise ValueError(f"time_slice {time_slice!r} selects no frames of {num_steps}")
  return slice(start, stop, step)


class _Field:
  """One field's dataset and the channels it contributes."""

  def __init__(self, group: str, name: str, order: int, ds, spatial_dims: Sequence[str]):
    self.group, self.name, self.order, self.ds = group, name, order, ds
    self.path = f"{group}/{name}"
    self.time_varying = _flag(ds, "time_varying")
    self.sample_varying = _flag(ds, "sample_varying")
    dim_varying = ds.attrs.get("dim_varying", None)
    self.dim_varying = ([True] * len(spatial_dims) if dim_varying is None
                        else [bool(v) for v in np.atleast_1d(dim_varying)])
    self.components = ["".join(c) for c in itertools.product(spatial_dims, repeat=order)]
    self.channels = [f"{name}_{c}" if c else name for c in self.components]


def _open_fields(f, path: str):
  """Validate the layout; returns (fields by name, spatial_dims, spatial_shape, n_traj, n_steps)."""
  missing = [g for g in ("dimensions",) + FIELD_GROUPS if g not in f]
  if missing:
    raise ValueError(f"{path}: not in The Well's layout, missing group(s) {missing} "
                     f"(found {sorted(f.keys())})")
  for key in ("n_spatial_dims", "n_trajectories"):
    if key not in f.attrs:
      raise ValueError(f"{path}: missing root attribute {key!r}")
  ndim = int(f.attrs["n_spatial_dims"])
  n_traj = int(f.attrs["n_trajectories"])
  dims = f["dimensions"]
  if "spatial_dims" not in dims.attrs:
    raise ValueError(f"{path}: group 'dimensions' lacks attribute 'spatial_dims'")
  spatial_dims = _strings(dims.attrs["spatial_dims"])
  if len(spatial_dims) != ndim:
    raise ValueError(f"{path}: dimensions/spatial_dims {spatial_dims} does not have "
                     f"n_spatial_dims={ndim} entries")
  for d in spatial_dims + ["time"]:
    if d not in dims:
      raise ValueError(f"{path}: missing dataset 'dimensions/{d}'")
  spatial_shape = tuple(int(dims[d].shape[-1]) for d in spatial_dims)
  n_steps = int(dims["time"].shape[-1])
  fields: dict[str, _Field] = {}
  for order, group in enumerate(FIELD_GROUPS):
    g = f[group]
    names = _strings(g.attrs["field_names"]) if "field_names" in g.attrs else sorted(g.keys())
    for name in names:
      if name not in g:
        raise ValueError(f"{path}: {group} lists field {name!r} but has no dataset "
                         f"'{group}/{name}'")
      fields[name] = _Field(group, name, order, g[name], spatial_dims)
  return fields, spatial_dims, spatial_shape, n_traj, n_steps


def _expected_shape(fd: _Field, n_traj: int, n_steps: int, spatial_shape, ndim: int):
  lead = ((n_traj,) if fd.sample_varying else ()) + ((n_steps,) if fd.time_varying else ())
  space = tuple(s for s, v in zip(spatial_shape, fd.dim_varying) if v)
  return lead + space + (ndim,) * fd.order


def _read_field(fd: _Field, path: str, n: int, t: slice, n_steps: int, spatial_shape,
                ndim: int, n_traj: int) -> np.ndarray:
  """The field's values, float32 [n, T, *S, D**order] (constant axes broadcast)."""
  want = _expected_shape(fd, n_traj, n_steps, spatial_shape, ndim)
  if tuple(fd.ds.shape) != want or len(fd.dim_varying) != ndim:
    raise ValueError(
        f"{path}: dataset '{fd.path}' has shape {tuple(fd.ds.shape)}, expected {want} "
        f"(n_trajectories={n_traj}, time steps={n_steps}, spatial shape={spatial_shape}, "
        f"sample_varying={fd.sample_varying}, time_varying={fd.time_varying}, "
        f"dim_varying={fd.dim_varying}, tensor order {fd.order})")
  index = ((slice(0, n),) if fd.sample_varying else ()) + ((t,) if fd.time_varying else ())
  x = np.asarray(fd.ds[index] if index else fd.ds[()], dtype=np.float32)
  if not fd.sample_varying:
    x = x[None]
  if not fd.time_varying:
    x = x[:, None]
  for axis, varying in enumerate(fd.dim_varying):
    if not varying:
      x = np.expand_dims(x, 2 + axis)
  num_t = len(range(t.start, t.stop, t.step))
  x = np.broadcast_to(x, (n, num_t, *spatial_shape) + (ndim,) * fd.order)
  x = x.reshape(n, num_t, *spatial_shape, ndim ** fd.order)
  bad = ~np.isfinite(x)
  if bad.any():
    i = int(np.argmax(bad.reshape(n, -1).any(-1)))
    frame = int(np.argmax(bad[i].reshape(num_t, -1).any(-1)))
    raise ValueError(f"{path}: dataset '{fd.path}' contains NaN or inf (trajectory {i}, "
                     f"frame {t.start + frame * t.step} of the file)")
  return x


def load_well(path: str | os.PathLike, fields: Sequence[str] | None = None,
              max_trajectories: int | None = None,
              time_slice: slice | tuple | None = None) -> tuple[np.ndarray, list[str]]:
  """Read trajectories from one HDF5 file in The Well's layout.

  Args:
    path: the ``.hdf5`` / ``.h5`` file.
    fields: names to load, in output order: a field (``"velocity"``: all its components) or one
      component (``"velocity_x"``). Default: every time-varying field, scalars then vectors
      then tensors, each group in its ``field_names`` order. A requested field that is constant
      in time (or across trajectories, or along an axis) is broadcast.
    max_trajectories: read at most this many trajectories (the first ones).
    time_slice: frames to read, a ``slice`` or ``(start, stop[, step])`` with a positive step.

  Returns:
    ``(x, names)``: x float32 [N, T, *S, F] (spatial axes in ``dimensions.spatial_dims`` order)
    and the F channel names.

  Raises:
    ImportError: h5py is not installed.
    FileNotFoundError: ``path`` does not exist.
    ValueError: not an HDF5 file, not in The Well's layout (naming the missing group, attribute
      or dataset), a dataset whose shape does not match the others (naming it), NaN / inf
      values (naming the dataset and trajectory), unknown field names, bad arguments.
  """
  h5py = _import_h5py()
  path = os.fspath(path)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: no such file")
  if os.path.isdir(path) or not h5py.is_hdf5(path):
    raise ValueError(f"{path}: not an HDF5 file")
  if max_trajectories is not None and (
      isinstance(max_trajectories, bool) or not isinstance(max_trajectories, (int, np.integer))
      or max_trajectories <= 0):
    raise ValueError(f"max_trajectories must be a positive integer, got {max_trajectories!r}")
  if isinstance(fields, str):
    fields = [fields]
  with h5py.File(path, "r") as f:
    by_name, spatial_dims, spatial_shape, n_traj, n_steps = _open_fields(f, path)
    ndim = len(spatial_dims)
    if n_traj <= 0 or n_steps <= 0:
      raise ValueError(f"{path}: no data (n_trajectories={n_traj}, time steps={n_steps})")
    # (field, component index or None for all) per requested name.
    channel_of = {c: (fd, j) for fd in by_name.values() for j, c in enumerate(fd.channels)}
    if fields is None:
      wanted = [(fd, None) for fd in by_name.values() if fd.time_varying]
      if not wanted:
        raise ValueError(f"{path}: no time-varying fields (fields: {sorted(by_name)})")
    else:
      wanted = []
      for name in fields:
        if name in by_name:
          wanted.append((by_name[name], None))
        elif name in channel_of:
          wanted.append(channel_of[name])
        else:
          raise ValueError(f"{path}: unknown field {name!r}; fields: {sorted(by_name)}, "
                           f"components: {sorted(c for c in channel_of if c not in by_name)}")
      if not wanted:
        raise ValueError("fields must name at least one field")
    n = n_traj if max_trajectories is None else min(int(max_trajectories), n_traj)
    t = _time_slice(time_slice, n_steps)
    cache: dict[str, np.ndarray] = {}
    parts, names = [], []
    for fd, j in wanted:
      if fd.name not in cache:
        cache[fd.name] = _read_field(fd, path, n, t, n_steps, spatial_shape, ndim, n_traj)
      x = cache[fd.name]
      if j is None:
        parts.append(x)
        names.extend(fd.channels)
      else:
        parts.append(x[..., j:j + 1])
        names.append(fd.channels[j])
  return np.ascontiguousarray(np.concatenate(parts, axis=-1), dtype=np.float32), names
