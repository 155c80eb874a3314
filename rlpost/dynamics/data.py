"""Trajectory datasets of the named systems, built once with tensorflow-datasets (array_record).

``load(system, split)`` simulates the four splits of a system (``train``, ``validation``,
``test``: in distribution; ``ood``: the system's out-of-distribution family, see
``System.ood_description``) the first time a configuration is asked for, writes them as
array_record through a tfds builder, and reads them back with ``as_data_source`` (no TensorFlow,
no ``tfds.load``). The configuration (system and a fingerprint of its parameters, number of
frames, split sizes, seed) is encoded in the builder config's name, so later calls read from
``data_dir``. Each split draws its initial conditions from its own seed stream.

Default sizes fit a CPU experiment: 128 / 32 / 32 / 32 trajectories of 40 frames. Building all
four splits takes about 1-2 s for ``kdv1d`` and ``ks1d`` and about 10 s for ``ns2d`` on one
core (NumPy, single-threaded).

Every array is ``float32 [N, T, *S, F]``. ``check_trajectories`` and ``check_depth`` validate
inputs for the code that consumes them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from rlpost import local_data
from rlpost.dynamics import systems as systems_lib

# A sibling of the synthetic tasks' folder (``rlpost.tasks.builders.DEFAULT_DATA_DIR``).
DEFAULT_DATA_DIR = os.path.join(os.path.expanduser("~"), ".cache", "rlpost", "dynamics")

SPLITS = ("train", "validation", "test", "ood")


@dataclasses.dataclass(eq=False)
class DynamicsConfig(tfds.core.BuilderConfig):
  """A system's dataset: split sizes, frames per trajectory and seed."""

  system: str = "kdv1d"
  num_frames: int = 40
  num_train: int = 128
  num_val: int = 32
  num_test: int = 32
  num_ood: int = 32
  seed: int = 0

  def sizes(self) -> dict[str, int]:
    return {"train": self.num_train, "validation": self.num_val, "test": self.num_test,
            "ood": self.num_ood}


def split_seed(seed: int, split: str) -> int:
  """The simulation seed of ``split``: independent streams per (seed, split)."""
  return int(np.random.SeedSequence([seed, SPLITS.index(split)]).generate_state(1)[0])


class DynamicsTrajectories(local_data.LocalBuilder, tfds.core.GeneratorBasedBuilder,
                           skip_registration=True):
  """Trajectories of one system: records ``{"trajectory": float32 [T, *S, F], "index": int32}``."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "kdv1d, ks1d and ns2d with float64 pseudo-spectral solvers."}
  # tfds otherwise locates its metadata and checksum files through the top-level package's
  # resources, which fails for editable installs; this builder ships no such files.
  pkg_dir_path = epath.Path(os.path.dirname(os.path.abspath(__file__)))

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    return epath.Path(os.path.abspath(__file__))

  def _info(self):
    cfg = self.builder_config
    system = systems_lib.get_system(cfg.system)
    shape = (cfg.num_frames, *system.spatial_shape, system.num_fields)
    return self.dataset_info_from_configs(
        description=system.description,
        features=tfds.features.FeaturesDict({
            "trajectory": tfds.features.Tensor(shape=shape, dtype=np.float32,
                                               encoding=tfds.features.Encoding.BYTES),
            "index": np.int32,
        }))

  def _split_generators(self, dl_manager):
    del dl_manager
    cfg = self.builder_config
    system = systems_lib.get_system(cfg.system)
    return {split: self._generate_examples(system, split, n) for split, n in cfg.sizes().items()}

  def _generate_examples(self, system, split, n):
    cfg = self.builder_config
    x = system.simulate(n, split_seed(cfg.seed, split), ood=split == "ood",
                        num_frames=cfg.num_frames)
    for i in range(n):
      yield i, {"trajectory": x[i], "index": i}


def config_name(system: systems_lib.System, num_frames: int, sizes: Mapping[str, int],
                seed: int) -> str:
  """Builder config name: system, parameter fingerprint, frames, split sizes and seed."""
  n = "-".join(str(sizes[s]) for s in SPLITS)
  return f"{system.name}_{system.fingerprint()}_T{num_frames}_n{n}_s{seed}"


def _positive(value, what: str) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
    raise ValueError(f"{what} must be a positive integer, got {value!r}")
  return int(value)


def _builder(system_name, *, data_dir, num_train, num_val, num_test, num_ood, num_frames, seed,
             log=print):
  system = systems_lib.get_system(system_name)
  sizes = {"train": _positive(num_train, "num_train"), "validation": _positive(num_val, "num_val"),
           "test": _positive(num_test, "num_test"), "ood": _positive(num_ood, "num_ood")}
  frames = system.num_frames if num_frames is None else _positive(num_frames, "num_frames")
  if frames < 2:
    raise ValueError(f"num_frames must be >= 2 (a transition needs two frames), got {frames}")
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
    raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
  if data_dir is not None and not isinstance(data_dir, (str, os.PathLike)):
    raise ValueError(f"data_dir must be a path, got {data_dir!r}")
  cfg = DynamicsConfig(name=config_name(system, frames, sizes, int(seed)), system=system.name,
                       num_frames=frames, num_train=sizes["train"], num_val=sizes["validation"],
                       num_test=sizes["test"], num_ood=sizes["ood"], seed=int(seed))
  data_dir = os.fspath(data_dir or DEFAULT_DATA_DIR)
  builder = DynamicsTrajectories(config=cfg, data_dir=data_dir, file_format="array_record")
  counts = " / ".join(f"{n:,} {split}" for split, n in sizes.items())
  local_data.prepare(builder, f"{system.name} trajectories ({counts})", data_dir, log)
  return builder


def _read(source, name: str, spatial_rank: int) -> np.ndarray:
  x = np.stack([source[i]["trajectory"] for i in range(len(source))])
  return check_trajectories(x, name, spatial_rank=spatial_rank)


def load(system_name: str, split: str, *, data_dir: str | os.PathLike | None = None,
         num_train: int = 128, num_val: int = 32, num_test: int = 32, num_ood: int = 32,
         num_frames: int | None = None, seed: int = 0) -> np.ndarray:
  """One split of a system's dataset, built on first use.

  Args:
    system_name: a registered system (``systems.list_systems()``).
    split: ``"train"``, ``"validation"``, ``"test"`` or ``"ood"``.
    data_dir: where tfds writes and reads the dataset (default ``DEFAULT_DATA_DIR``).
    num_train, num_val, num_test, num_ood: split sizes (all four are built together).
    num_frames: frames per trajectory T (default: the system's ``num_frames``).
    seed: dataset seed; each split simulates from its own stream (``split_seed``).

  Returns:
    float32 [N, T, *S, F], N the split's size.
  """
  if split not in SPLITS:
    raise ValueError(f"unknown split {split!r}; valid splits: {list(SPLITS)}")
  builder = _builder(system_name, data_dir=data_dir, num_train=num_train, num_val=num_val,
                     num_test=num_test, num_ood=num_ood, num_frames=num_frames, seed=seed)
  ndim = systems_lib.get_system(system_name).ndim
  return _read(builder.as_data_source()[split], f"{system_name}/{split}", ndim)


def load_all(system_name: str, *, data_dir: str | os.PathLike | None = None,
             num_train: int = 128, num_val: int = 32, num_test: int = 32, num_ood: int = 32,
             num_frames: int | None = None, seed: int = 0) -> dict[str, np.ndarray]:
  """All four splits of a system's dataset (see ``load``): ``{split: float32 [N, T, *S, F]}``."""
  builder = _builder(system_name, data_dir=data_dir, num_train=num_train, num_val=num_val,
                     num_test=num_test, num_ood=num_ood, num_frames=num_frames, seed=seed)
  ndim = systems_lib.get_system(system_name).ndim
  sources = builder.as_data_source()
  return {split: _read(sources[split], f"{system_name}/{split}", ndim) for split in SPLITS}


def check_trajectories(x, name: str = "trajectories", *, spatial_rank: int | None = None,
                       num_fields: int | None = None) -> np.ndarray:
  """Validate a trajectory array (or per-field arrays) and return it as float32 [N, T, *S, F].

  Args:
    x: a real array [N, T, *S, F], or a mapping ``{field_name: array [N, T, *S]}`` whose arrays
      are stacked along a new last axis in the mapping's order.
    name: how error messages call ``x``.
    spatial_rank: the expected number of spatial axes (1 or 2 here); any >= 1 if None.
    num_fields: the expected F; any >= 1 if None.

  Returns:
    float32 [N, T, *S, F] (no copy when ``x`` already is one).

  Raises:
    ValueError: wrong rank, an empty axis, mismatched field shapes, a wrong number of fields, a
      non-real dtype, or a NaN / inf (naming the first bad trajectory, frame and field).
  """
  if isinstance(x, Mapping):
    if not x:
      raise ValueError(f"{name}: no fields")
    arrays = {k: np.asarray(v) for k, v in x.items()}
    shapes = {k: v.shape for k, v in arrays.items()}
    first = next(iter(shapes))
    for k, s in shapes.items():
      if s != shapes[first]:
        raise ValueError(f"{name}: field {k!r} has shape {s} but field {first!r} has "
                         f"{shapes[first]}; all fields must be [N, T, *S] with the same shape")
    for k, v in arrays.items():
      _check_real(v, f"{name}: field {k!r}")
    field_names = list(arrays)
    x = np.stack(list(arrays.values()), axis=-1)
  else:
    x = np.asarray(x)
    field_names = None
    _check_real(x, name)
  if x.ndim < 4 or (spatial_rank is not None and x.ndim != 3 + spatial_rank):
    want = ("[N, T, *S, F] with at least one spatial axis" if spatial_rank is None else
            f"[N, T, *S, F] with {spatial_rank} spatial axes (rank {3 + spatial_rank})")
    raise ValueError(f"{name}: expected {want}, got shape {x.shape} (rank {x.ndim})")
  if 0 in x.shape:
    raise ValueError(f"{name}: empty axis in shape {x.shape} ([N, T, *S, F])")
  if num_fields is not None and x.shape[-1] != num_fields:
    raise ValueError(f"{name}: expected {num_fields} fields (last axis), got {x.shape[-1]}")
  finite = np.isfinite(x)
  if not finite.all():
    bad = ~finite
    i = int(np.argmax(bad.reshape(x.shape[0], -1).any(-1)))
    t = int(np.argmax(bad[i].reshape(x.shape[1], -1).any(-1)))
    f = int(np.argmax(bad[i, t].reshape(-1, x.shape[-1]).any(0)))
    kind = "NaN" if np.isnan(x[i, t][..., f]).any() else "inf"
    field = f" ({field_names[f]!r})" if field_names else ""
    raise ValueError(f"{name}: trajectory {i} contains {kind} (first at frame {t}, field "
                     f"{f}{field}); {int(bad.reshape(x.shape[0], -1).any(-1).sum())} of "
                     f"{x.shape[0]} trajectories are not finite")
  return x.astype(np.float32, copy=False)


def _check_real(x: np.ndarray, what: str) -> None:
  if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)) or (
      x.dtype == np.bool_):
    raise ValueError(f"{what}: expected a real numeric array, got dtype {x.dtype}")


def check_depth(depth, num_frames: int, name: str = "depth") -> int:
  """Validate a rollout depth against trajectories of ``num_frames`` frames.

  A rollout of depth i from frame 0 needs frames 0..i, so ``1 <= depth <= num_frames - 1``.

  Returns:
    ``depth`` as a Python int.

  Raises:
    ValueError: a non-integer, non-positive or too large depth.
  """
  if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)):
    raise ValueError(f"{name} must be an integer, got {depth!r}")
  if depth < 1:
    raise ValueError(f"{name} must be >= 1, got {depth}")
  if depth > num_frames - 1:
    raise ValueError(f"{name} {depth} is larger than the trajectory: {num_frames} frames allow "
                     f"depths 1..{num_frames - 1}")
  return int(depth)
