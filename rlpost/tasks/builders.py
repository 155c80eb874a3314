"""Synthetic tasks: the ``SyntheticTask`` base class and the tensorflow-datasets builder that
writes each one's records as array_record (no TensorFlow).

A synthetic task is a registered ``SyntheticTask`` subclass that names its own generator
(``generate``) and spec dataclass (``spec_class``); the task registry (``rlpost.tasks.base``) is
the only list of them, and ``build_task`` makes each task's tfds builder from its class
(``rlpost.tasks.catalog.build`` by name). Each task is generated locally and deterministically
from its config (sizes, difficulty range, seed); the config is encoded in the builder config's
name, so a dataset is built once per config and reused from ``data_dir`` afterwards. Records
are read back with ``as_data_source`` (random access over array_record; no ``tfds.load``,
which would need TensorFlow). Building logs one line (``rlpost.local_data``), none of tfds's
download messages.

Every record: ``prompt`` (text), ``answer`` (text), ``demo`` (a worked solution, text),
``difficulty`` (int32).
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import os
import types
from typing import Any, Callable

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from rlpost import local_data, registry
from rlpost.tasks import base

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

  def _generate_examples(self, records):
    for i, r in enumerate(records):
      yield i, r


class SyntheticTask(base.Task):
  """A task generated locally by its tfds builder (``build``) from ``task_spec``,
  ``num_train``, ``num_test`` and ``data_seed``.

  Attributes:
    spec_class: the dataclass of the task's ``task_spec`` fields (checked by ``validate``:
      known fields, their types and values); None leaves ``task_spec`` to ``generate``.
    generate: ``generate(spec, n, seed) -> list[dict]``, n records generated deterministically
      from ``seed``; ``spec`` is ``spec_class(**task_spec)`` (the dict itself without a
      ``spec_class``).
  """

  spec_class: type | None = None
  generate: Callable[[Any, int, int], list[dict]]

  @classmethod
  def validate(cls, cfg: Any) -> None:
    if cls.spec_class is not None:
      base.check_spec(cls.name, cls.spec_class, cfg.task_spec)
    if cfg.eval_problems > cfg.num_test:
      raise ValueError(f"config key 'eval_problems': exceeds the {cfg.num_test} problems of the "
                       "test split (num_test); use eval_problems=0 for all of them (got "
                       f"{cfg.eval_problems!r})")

  def load(self, log: Callable[[str], None]) -> dict[str, list[dict]]:
    c = self.cfg
    return build_task(type(self), spec=c.task_spec, num_train=c.num_train,
                      num_test=c.num_test, seed=c.data_seed, data_dir=c.data_dir, log=log)


@functools.cache
def _builder_class(task: type[SyntheticTask]) -> type[_SyntheticBuilder]:
  """The tfds builder of ``task``, named as the task (its folder under ``data_dir``)."""

  def _make(self, n: int, seed: int) -> list[dict]:
    spec = self.builder_config.spec
    return task.generate(spec if task.spec_class is None else task.spec_class(**spec), n, seed)

  def body(ns: dict) -> None:
    ns.update(name=task.name, __doc__=task.__doc__, __module__=__name__, _make=_make)

  return types.new_class(f"{task.__name__}Builder", (_SyntheticBuilder,),
                         {"skip_registration": True}, body)


__getattr__ = registry.moved(__name__, {
    "build": "rlpost.tasks.catalog.build (by name) or builders.build_task (a class)",
    "synthetic_tasks": "rlpost.tasks.catalog.synthetic_tasks"})


def config_name(spec: dict, num_train: int, num_test: int, seed: int) -> str:
  parts = [f"{k}{int(v) if isinstance(v, bool) else v}" for k, v in sorted(spec.items())]
  return "_".join(parts + [f"n{num_train}-{num_test}", f"s{seed}"]).replace(".", "p")


def build_task(task: type[SyntheticTask], *, spec: dict | None = None, num_train: int = 10000,
               num_test: int = 1000, seed: int = 0, data_dir: str | None = None,
               log: Callable[[str], None] = print) -> dict[str, list[dict]]:
  """Build (once) and read synthetic task class ``task``: {"train": [...], "test": [...]} of
  record dicts; building logs one line through ``log``. By name: ``catalog.build``."""
  name, spec = task.name, dict(spec or {})
  if task.spec_class is not None:
    fields = {f.name for f in dataclasses.fields(task.spec_class)}
    unknown = set(spec) - fields
    if unknown:
      raise ValueError(f"unknown {name} spec key(s) {sorted(unknown)}; known: {sorted(fields)}")
    task.spec_class(**spec)  # validates values with clear errors
  cfg = SyntheticConfig(name=config_name(spec, num_train, num_test, seed), spec=spec,
                        num_train=num_train, num_test=num_test, seed=seed)
  data_dir = data_dir or DEFAULT_DATA_DIR
  builder = _builder_class(task)(config=cfg, data_dir=data_dir, file_format="array_record")
  local_data.prepare(builder, f"{name} data ({num_train:,} train / {num_test:,} test)", data_dir,
                     log)
  sources = builder.as_data_source()
  return {split: [_decode(sources[split][i]) for i in range(len(sources[split]))]
          for split in ("train", "test")}


def _decode(rec: dict) -> dict:
  return {k: (v.decode("utf-8") if isinstance(v, bytes) else int(v) if k == "difficulty" else v)
          for k, v in rec.items()}
