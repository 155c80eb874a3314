"""What a run prints and leaves behind: plain lines in a log file, a message before the first
compile and before each evaluation, a learning curve after every evaluation, trackers."""

import glob
import os

import pytest

from rlpost.train import config as config_lib
from rlpost.train import loop, rl, tracking
from rl_testutil import learning_config


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("out")
  return dict(data_dir=str(root / "data"), cache_dir=str(root / "cache"))


def _trainer(dirs, log=print, **kw):
  # A short warm start: these tests look at the output, not at learning.
  return rl.make_train(learning_config(dirs, sft_steps=20, **kw), log=log)


def test_output_to_a_file_is_plain_lines_with_messages_before_compile_and_eval(dirs, capfd):
  tr = _trainer(dirs)  # builds the data and runs the warm start: both print
  loop.run(tr, os.path.join(dirs["cache_dir"], "..", "run"), progress=True)
  out, err = capfd.readouterr()  # stdout and stderr went to files, not a terminal
  text = out + err
  assert "\r" not in text and "\x1b" not in text
  assert "building arithmetic data (200 train / 40 test)" in out
  assert "absl" not in text and "Downloading and preparing" not in text
  assert "sft: 100%" in err and "rl: 100%" in err and "eval: 100%" in err  # bars, as lines
  assert "sft step 20/20: loss" in out
  assert out.count("compiling the RL step") == 1
  for step in (0, 2, 4):
    assert f"evaluating 8 test problems x 4 samples at step {step}..." in out
  # Each message comes before the work it announces.
  assert out.index("at step 0...") < out.index("compiling the RL step")


def test_run_stopped_after_an_evaluation_leaves_its_learning_curve(dirs, tmp_path):
  tr = _trainer(dirs, log=lambda s: None, steps=6)
  step = tr.step
  calls = []

  def killed_at_step_3(state):
    calls.append(1)
    if len(calls) == 3:
      raise KeyboardInterrupt
    return step(state)

  tr.step = killed_at_step_3
  with pytest.raises(KeyboardInterrupt):
    loop.run(tr, str(tmp_path / "r"), progress=False)
  png = tmp_path / "r" / "learning_curve.png"
  assert png.exists() and png.stat().st_size > 0  # drawn at the evaluations of steps 0 and 2
  entries = loop.read_metrics(str(tmp_path / "r" / "metrics.jsonl"))
  assert [r["step"] for r in entries if "eval/pass@1" in r] == [0, 2]


def test_unknown_tracker_is_named(tmp_path):
  with pytest.raises(ValueError, match=r"config key 'logger': unknown kind\(s\) \['mlflow'\]"):
    tracking.make_logger("tensorboard,mlflow", str(tmp_path), {})
  assert not os.path.exists(tmp_path / "tb")  # nothing made for a bad value
  assert isinstance(tracking.make_logger("none", str(tmp_path), {}), tracking.NullLogger)
  with pytest.raises(ValueError, match=r"config key 'logger': unknown kind\(s\) \['mlflow'\]"):
    config_lib.from_dict(rl.RLConfig, {"logger": "mlflow"})  # at start, before any work


def test_wandb_offline_records_the_run(dirs, tmp_path, monkeypatch):
  pytest.importorskip("wandb", reason="the wandb extra is not installed "
                                              "(pip install -e '.[wandb]')")
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
  monkeypatch.setenv("WANDB_SILENT", "true")
  os.makedirs(tmp_path / "wb")
  said = []
  tr = _trainer(dirs, log=said.append, steps=2, logger="tensorboard,wandb")
  loop.run(tr, str(tmp_path / "r"), progress=False)
  assert not [s for s in said if "tracker" in s], said  # neither tracker was disabled
  # run.finish() returns before W&B's service has flushed the run file; the service writes the
  # rest when it shuts down (at process exit for a user, here on demand).
  import wandb
  wandb.teardown()
  assert os.listdir(tmp_path / "r" / "tb")  # TensorBoard beside W&B
  runs = glob.glob(str(tmp_path / "wb" / "wandb" / "offline-run-*"))
  assert len(runs) == 1
  run_id = (tmp_path / "r" / "wandb_id").read_text().strip()
  log_file = os.path.join(runs[0], f"run-{run_id}.wandb")
  history, kinds = _wandb_history(log_file)
  assert kinds[-1] == "exit", f"{log_file} ends before its exit record: {kinds}"
  steps = {row["_step"] for row in history}
  assert {0, 1, 2} <= steps
  train = [row for row in history if "train/reward" in row]
  assert [row["_step"] for row in train] == [1, 2]
  assert any("eval/pass@1" in row for row in history)


def _wandb_history(path: str) -> tuple[list[dict], list[str]]:
  """The history rows of an offline W&B run file, and the kinds of all its records in order: a
  LevelDB-style log (7-byte file header, 32 KiB blocks of records framed as crc32, length, type)
  of ``Record`` protos."""
  import json
  import struct

  from wandb.proto import wandb_internal_pb2

  data = open(path, "rb").read()
  assert data[:4] == b":W&B", f"{path} is not a W&B run file"
  block, pos, payload, rows, kinds = 32768, 7, b"", [], []
  while pos + 7 <= len(data):
    if block - pos % block < 7:  # a block's tail too short for a header is padding
      pos += block - pos % block
      continue
    _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
    if kind == 0 and n == 0:
      break
    payload += data[pos + 7:pos + 7 + n]
    pos += 7 + n
    if kind in (1, 4):  # a full record, or the last fragment of one
      rec = wandb_internal_pb2.Record.FromString(payload)
      payload = b""
      kinds.append(rec.WhichOneof("record_type"))
      if kinds[-1] == "history":
        rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                     for i in rec.history.item})
  return rows, kinds
