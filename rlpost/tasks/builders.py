"""tensorflow-datasets builders for the synthetic tasks, writing array_record (no TensorFlow).

Each task is generated locally and deterministically from its config (sizes, difficulty range,
seed); the config is encoded in the builder config's name, so a dataset is built once per config
and reused from ``data_dir`` afterwards. Records are read back with ``as_data_source`` (random
access over array_record; no ``tfds.load``, which would need TensorFlow). Building logs one line
(``rlpost.local_data``), none of tfds's download messages.

Every record: ``prompt`` (text), ``answer`` (text), ``demo`` (a worked solution, text),
``difficulty`` (int32).
"""

from __future__ import annotations

import abc
import dataclasses
import os
from typing import Callable

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from rlpost import local_data
from rlpost.tasks import arithmetic, countdown

DEFAULT_DATA_DIR = os.path.join(os.path.expanduser("~"), ".cache", "rlpost", "tfds")


@dataclasses.dataclass(eq=False)
class SyntheticConfig(tfds.core.BuilderConfig):
  """Sizes and seed of a synthetic task; ``spec`` holds the task's own distribution fields."""

  spec: dict = dataclasses.field(default_factory=dict)
  num_train: int = 10000
  num_test: int = 1000
  seed: int = 0


def _features():
  return tfds.features.FeaturesDict({
      "prompt": tfds.features.Text(),
      "answer": tfds.features.Text(),
      "demo": tfds.features.Text(),
      "difficulty": np.int32,
  })


class _SyntheticBuilder(local_data.LocalBuilder, tfds.core.GeneratorBasedBuilder,
                        skip_registration=True):
  VERSION = tfds.core.Version("1.1.0")
  RELEASE_NOTES = {"1.1.0": "Train no longer drops prompts that also occur in test."}
  # tfds otherwise locates its metadata and checksum files through the top-level package's
  # resources, which fails for editable installs; these builders ship no such files.
  pkg_dir_path = epath.Path(os.path.dirname(os.path.abspath(__file__)))

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    return epath.Path(os.path.abspath(__file__))

  @abc.abstractmethod
  def _make(self, n: int, seed: int) -> list[dict]:
    """n problems generated deterministically from ``seed`` (each task's builder)."""

  def _info(self):
    return self.dataset_info_from_configs(features=_features())

  def _split_generators(self, dl_manager):
    del dl_manager
    cfg = self.builder_config
    # Train and test draw from different seed streams. They are not de-duplicated: the easiest
    # levels have tiny problem spaces (100 one-digit additions) that a test set covers entirely,
    # so removing test prompts from train would remove those levels from training. Per-level
    # test metrics show where memorisation is possible.
    test = self._make(cfg.num_test, seed=2 * cfg.seed + 1)
    train = self._make(cfg.num_train, seed=2 * cfg.seed)
    return {"train": self._generate_examples(train), "test": self._generate_examples(test)}

  def _generate_examples(self, rows):
    for i, r in enumerate(rows):
      yield i, r


class Arithmetic(_SyntheticBuilder):
  """Multi-step arithmetic (see ``rlpost.tasks.arithmetic``)."""

  def _make(self, n, seed):
    return arithmetic.generate(arithmetic.ArithmeticSpec(**self.builder_config.spec), n, seed)


class Countdown(_SyntheticBuilder):
  """Countdown numbers game (see ``rlpost.tasks.countdown``)."""

  def _make(self, n, seed):
    return countdown.generate(countdown.CountdownSpec(**self.builder_config.spec), n, seed)


BUILDERS = {"arithmetic": Arithmetic, "countdown": Countdown}
SPECS = {"arithmetic": arithmetic.ArithmeticSpec, "countdown": countdown.CountdownSpec}


def config_name(spec: dict, num_train: int, num_test: int, seed: int) -> str:
  parts = [f"{k}{int(v) if isinstance(v, bool) else v}" for k, v in sorted(spec.items())]
  return "_".join(parts + [f"n{num_train}-{num_test}", f"s{seed}"]).replace(".", "p")


def build(task: str, *, spec: dict | None = None, num_train: int = 10000, num_test: int = 1000,
          seed: int = 0, data_dir: str | None = None, log: Callable[[str], None] = print
          ) -> dict[str, list[dict]]:
  """Build (once) and read a synthetic task: {"train": [...], "test": [...]} of record dicts;
  building logs one line through ``log``."""
  if task not in BUILDERS:
    raise ValueError(f"unknown task {task!r}; known: {sorted(BUILDERS)}")
  spec = dict(spec or {})
  fields = {f.name for f in dataclasses.fields(SPECS[task])}
  unknown = set(spec) - fields
  if unknown:
    raise ValueError(f"unknown {task} spec key(s) {sorted(unknown)}; known: {sorted(fields)}")
  SPECS[task](**spec)  # validates values with clear errors
  cfg = SyntheticConfig(name=config_name(spec, num_train, num_test, seed), spec=spec,
                        num_train=num_train, num_test=num_test, seed=seed)
  data_dir = data_dir or DEFAULT_DATA_DIR
  builder = BUILDERS[task](config=cfg, data_dir=data_dir, file_format="array_record")
  local_data.prepare(builder, f"{task} data ({num_train:,} train / {num_test:,} test)", data_dir,
                     log)
  sources = builder.as_data_source()
  return {split: [_decode(sources[split][i]) for i in range(len(sources[split]))]
          for split in ("train", "test")}


def _decode(rec: dict) -> dict:
  return {k: (v.decode("utf-8") if isinstance(v, bytes) else int(v) if k == "difficulty" else v)
          for k, v in rec.items()}
