"""Locally generated data builds with one rlpost line and no absl or tfds chatter."""

import logging

from rlpost.dynamics import data as dynamics_data
from rlpost.tasks import catalog


def _chatter(records) -> list[str]:
  return [f"{r.name}: {r.getMessage()}" for r in records if r.levelno >= logging.WARNING]


def test_task_data_builds_with_one_line_and_reuses_silently(tmp_path, capfd, caplog):
  caplog.set_level(logging.DEBUG)
  lines = []
  kw = dict(spec={"max_digits": 2}, num_train=2000, num_test=50, data_dir=str(tmp_path))
  first = catalog.build("arithmetic", log=lines.append, **kw)
  assert lines == [f"building arithmetic data (2,000 train / 50 test) in {tmp_path} ..."]
  again = catalog.build("arithmetic", log=lines.append, **kw)  # read back: nothing to say
  assert len(lines) == 1 and again == first
  out, err = capfd.readouterr()
  assert out == "" and err == "", (out, err)  # no "Downloading and preparing dataset ..."
  assert not _chatter(caplog.records)  # no "Using custom data configuration: ..."


def test_home_directory_is_written_as_tilde(monkeypatch, tmp_path, capfd, caplog):
  monkeypatch.setenv("HOME", str(tmp_path))
  catalog.build("countdown", num_train=20, num_test=5, data_dir=str(tmp_path / "tfds"))
  out, err = capfd.readouterr()
  assert out == "building countdown data (20 train / 5 test) in ~/tfds ...\n" and err == ""
  assert not _chatter(caplog.records)


def test_dynamics_data_builds_with_one_line(tmp_path, capfd, caplog):
  sizes = dict(num_train=2, num_val=2, num_test=2, num_ood=2, num_frames=3)
  dynamics_data.load("kdv1d", "test", data_dir=tmp_path, **sizes)
  dynamics_data.load("kdv1d", "train", data_dir=tmp_path, **sizes)
  out, err = capfd.readouterr()
  assert out == (f"building kdv1d trajectories (2 train / 2 validation / 2 test / 2 ood) in "
                 f"{tmp_path} ...\n") and err == ""
  assert not _chatter(caplog.records)
