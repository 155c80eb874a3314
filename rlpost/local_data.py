"""Quiet tensorflow-datasets builders for data generated on this machine.

tfds speaks to a user downloading a public dataset: a warning that the builder config is
"custom" (with its full repr), "Downloading and preparing dataset Unknown size ..." and "Dataset
... downloaded and prepared ...". For data rlpost generates itself none of that is news, so
``LocalBuilder`` (a mixin placed before ``tfds.core.GeneratorBasedBuilder``) says nothing, and
``prepare(builder, what, data_dir, log)`` logs one line when, and only when, the data is built.
Warnings tfds raises for anything else are untouched.
"""

from __future__ import annotations

import os
from typing import Callable

import tensorflow_datasets as tfds


class LocalBuilder:
  """tfds builder behaviour for datasets generated locally from their builder config."""

  def _create_builder_config(self, builder_config, version):
    # Every config of a local builder is made at the call site (none is predefined), which tfds
    # would announce as a "custom data configuration" warning.
    if isinstance(builder_config, tfds.core.BuilderConfig) and not self.BUILDER_CONFIGS:
      return builder_config
    return super()._create_builder_config(builder_config, version)

  def _log_download_bytes(self) -> None:
    pass  # "Downloading and preparing dataset Unknown size ...": nothing is downloaded

  def _log_download_done(self) -> None:
    pass


def short_path(path: str | os.PathLike) -> str:
  """``path`` with the home directory written as ``~``."""
  path, home = os.fspath(path), os.path.expanduser("~")
  return "~" + path[len(home):] if path == home or path.startswith(home + os.sep) else path


def prepare(builder: tfds.core.DatasetBuilder, what: str, data_dir: str | os.PathLike,
            log: Callable[[str], None]) -> None:
  """Build ``builder``'s data unless it already is, logging one line when it builds:
  "building {what} in {data_dir} ..."."""
  if not os.path.exists(builder.data_dir):  # download_and_prepare's own test
    log(f"building {what} in {short_path(data_dir)} ...")
  tfds.disable_progress_bar()
  builder.download_and_prepare()
