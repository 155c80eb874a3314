"""Damaged inputs to the scripts: one ``error:`` line naming the file or step, exit status 2.

A results.json of another table (or a truncated one) given to ``reproduce.py --rejudge``; a run
whose latest checkpoint is damaged (data files truncated or overwritten, its state item deleted,
its meta item corrupt) given to ``train.py`` (resume), ``export.py`` and ``average.py``: each
prints exactly one line, with no traceback and none of the "Event loop is closed" tracebacks that
orbax's abandoned reads used to print, and changes nothing in the run directory. An incomplete
latest checkpoint is refused by export and average as a resumed run refuses it, while a step the
user selects around it is still read.

One tiny run is trained once per module (a subprocess of scripts/train.py, about half a minute);
the script runs on its damaged copies are started together in one fixture.
"""

import asyncio
import concurrent.futures
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rl_testutil import tree_digest
from rlpost import cli
from rlpost.checkpoint_format import CheckpointError
from scripts import reproduce

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LATEST = 2


def _exit_of(main, argv, capsys):
  with pytest.raises(SystemExit) as e:
    cli.run_main(main, argv)
  return e.value.code, capsys.readouterr().err


# ------------------------------------------------------------------------ reproduce --rejudge
def test_rejudge_of_another_tables_results_names_the_file_and_its_table(tmp_path, capsys,
                                                                        monkeypatch):
  """dars --rejudge on mc_grpo's results.json was a TypeError traceback from dars' summarize."""
  monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
  shutil.copy(os.path.join(ROOT, "results", "mc_grpo", "results.json"), tmp_path)
  before = tree_digest(tmp_path)
  code, err = _exit_of(reproduce.main, ["dars", "--rejudge", "--out", str(tmp_path)], capsys)
  path = os.path.join(str(tmp_path), "results.json")
  assert code == 2 and err.count("\n") == 1, err
  assert err.startswith(f"error: {path} holds the results of table 'mc_grpo'"), err
  assert "not of table 'dars'" in err and "Traceback" not in err
  assert tree_digest(tmp_path) == before  # nothing rewritten, no table.md or plots


def test_rejudge_of_results_without_a_table_name_is_refused(tmp_path, capsys, monkeypatch):
  monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
  with open(os.path.join(ROOT, "results", "dars", "results.json")) as f:
    report = json.load(f)
  del report["experiment"]
  (tmp_path / "results.json").write_text(json.dumps(report))
  code, err = _exit_of(reproduce.main, ["dars", "--rejudge", "--out", str(tmp_path)], capsys)
  assert code == 2 and "names no table" in err and str(tmp_path / "results.json") in err, err


@pytest.mark.parametrize("content", [b"", b'{"experiment": "dars", "config": {"seeds"',
                                     b"\xff\xfe not text"])
def test_rejudge_of_a_truncated_or_binary_results_json_names_the_file(tmp_path, capsys,
                                                                      monkeypatch, content):
  monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
  (tmp_path / "results.json").write_bytes(content)
  code, err = _exit_of(reproduce.main, ["dars", "--rejudge", "--out", str(tmp_path)], capsys)
  assert code == 2 and err.count("\n") == 1, err
  assert err.startswith(f"error: {tmp_path / 'results.json'} is not valid JSON"), err
  assert os.listdir(tmp_path) == ["results.json"]


# ------------------------------------------------------------------ checkpoint error messages
def _orbax_like_error():
  """The chain orbax raises for an unreadable array: TensorStore's one-line reason with its spec
  appended, wrapped in an exception whose text dumps the whole spec over many lines."""
  spec = "{\n" + "".join(f"  'driver{i}': 'zarr',\n" for i in range(80)) + "}"
  reason = ('OUT_OF_RANGE: Error reading "00003/0.0" in OCDBT database at local file '
            '"/runs/x/checkpoints/30/state/": Requested byte range [230865, 246045) is not '
            'valid for value of size 10 [tensorstore_spec=\'{"driver":"zarr"}\']')
  try:
    try:
      raise ValueError(reason)
    except ValueError as inner:
      raise Exception(f"Encountered error while reading array index: (slice(0, 64, 1),). "
                      f"See full TensorStore details: TensorStore({spec}).") from inner
  except Exception as e:  # noqa: BLE001
    return e


def test_checkpoint_error_summarises_a_wrapped_orbax_exception():
  e = _orbax_like_error()
  try:
    raise CheckpointError(30, "/runs/x/checkpoints", f"cannot read the state ({e!r})") from e
  except CheckpointError as err:
    error = err
  msg = str(error)
  assert len(error.full_message) > 2000  # what the message used to be
  assert len(msg) < 300 and "\n" not in msg and "driver" not in msg, msg
  assert msg.startswith("checkpoint at step 30 in /runs/x/checkpoints: cannot read the state "
                        "(ValueError: OUT_OF_RANGE: Error reading \"00003/0.0\""), msg
  assert msg.endswith("is not valid for value of size 10)"), msg
  # A short cause, and a CheckpointError wrapping another, keep their text as written.
  short = CheckpointError(3, "/d", "unreadable (KeyError('state'))")
  assert str(short) == short.full_message
  try:
    raise CheckpointError(30, "/d", f"{str(error).split(': ', 1)[1]}; pass fallback=True") \
        from error
  except CheckpointError as outer:
    assert str(outer).startswith("checkpoint at step 30 in /d: cannot read the state (ValueError")


def test_orbax_run_sync_settles_tasks_left_pending_by_a_failure(capfd):
  """A failing gather leaves its siblings pending; orbax closes its loop at once, and a sibling's
  thread future completing later used to raise "Event loop is closed" in that thread."""
  from orbax.checkpoint._src import asyncio_utils

  import rlpost.checkpoint_format  # noqa: F401 - installs the settling event loops

  pool = concurrent.futures.ThreadPoolExecutor(1)
  finished = threading.Event()

  def slow_read():
    time.sleep(0.3)
    finished.set()
    return 1

  async def fail_fast():
    raise ValueError("damaged")

  async def read():
    return await asyncio.wrap_future(pool.submit(slow_read))

  async def restore():
    await asyncio.gather(fail_fast(), read())

  with pytest.raises(ValueError, match="damaged"):
    asyncio_utils.run_sync(restore())
  assert finished.is_set()  # the loop waited for the read in flight before it closed
  time.sleep(0.2)
  pool.shutdown()
  err = capfd.readouterr().err
  assert "Event loop is closed" not in err and "never retrieved" not in err, err


# --------------------------------------------------------------------- damaged run directories
TRAIN = ["scripts/train.py", "experiments/smoke.py", "sft_steps=0", f"steps={LATEST}",
         "checkpoint_every=1", "eval_every=100", "eval_problems=2", "eval_samples=1",
         "num_train=50", "num_test=10"]


def _run(args, timeout=300):
  env = {k: v for k, v in os.environ.items() if k != cli.DEBUG_ENV}
  env.update(JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=timeout)


def _data_files(state_dir):
  return sorted(os.path.join(d, f) for d, _, files in os.walk(state_dir) for f in files
                if os.path.basename(d) == "d")


def _damage(run_dir, kind):
  step_dir = os.path.join(run_dir, "checkpoints", str(LATEST))
  state = os.path.join(step_dir, "state")
  if kind == "truncated_data":
    for path in _data_files(state):
      os.truncate(path, 10)
  elif kind == "overwritten_data":
    for i, path in enumerate(_data_files(state)):
      with open(path, "wb") as f:
        f.write(hashlib.sha256(str(i).encode()).digest() * 7)
  elif kind == "no_state":
    shutil.rmtree(state)
  elif kind == "corrupt_meta":
    with open(os.path.join(step_dir, "meta", "metadata"), "w") as f:
      f.write("{garbage")
  else:
    raise AssertionError(kind)


KINDS = ("truncated_data", "overwritten_data", "no_state", "corrupt_meta")
TOOLS = ("train", "export", "average")


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
  """{(kind, tool): (run dir, digest before, the process)} plus the runs selecting around an
  incomplete latest step: ("no_state", "export_step1"), ("no_state", "average_end1")."""
  tmp = tmp_path_factory.mktemp("damaged")
  data = [f"data_dir={tmp / 'data'}", f"cache_dir={tmp / 'cache'}"]
  proc = _run([*TRAIN, f"run_dir={tmp / 'run'}", *data, "--no-progress"])
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert sorted(os.listdir(tmp / "run" / "checkpoints")) == ["1", "2"]
  jobs = {}
  for kind in KINDS:
    for tool in TOOLS + (("export_step1", "average_end1") if kind == "no_state" else ()):
      run = tmp / f"{kind}-{tool}"
      shutil.copytree(tmp / "run", run)
      _damage(str(run), kind)
      ckpts = run / "checkpoints"
      out = tmp / f"{kind}-{tool}.out"
      jobs[kind, tool] = (run, {
          "train": [*TRAIN, f"run_dir={run}", *data, f"steps={LATEST + 1}", "--no-progress"],
          "export": ["scripts/export.py", run, "--out", out, "--no-progress"],
          "average": ["scripts/average.py", "--ckpt-dir", ckpts, "--method", "lawa", "--k", "2",
                      "--out", out, "--no-progress"],
          "export_step1": ["scripts/export.py", run, "--out", out, "--step", "1",
                           "--no-progress"],
          "average_end1": ["scripts/average.py", "--ckpt-dir", ckpts, "--method", "lawa", "--k",
                           "1", "--end", "1", "--out", out, "--no-progress"],
      }[tool], out)

  def go(item):
    key, (run, args, out) = item
    before = tree_digest(run)
    return key, (run, before, out, _run(args))

  with ThreadPoolExecutor(max_workers=4) as pool:
    return dict(pool.map(go, jobs.items()))


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize("kind", KINDS)
def test_damaged_latest_checkpoint_is_one_line_and_changes_nothing(damaged, kind, tool):
  run, before, out, proc = damaged[kind, tool]
  lines = proc.stderr.splitlines()
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
  assert "Event loop is closed" not in proc.stderr and "Traceback" not in proc.stderr
  line = lines[0]
  assert len(line) <= len("error: ") + 300, line
  assert f"checkpoint at step {LATEST} in {run / 'checkpoints'}" in line, line
  assert tree_digest(run) == before
  assert not out.exists()


@pytest.mark.parametrize("tool", ["export", "average"])
def test_incomplete_latest_checkpoint_is_refused_not_skipped(damaged, tool):
  """With the state item of the latest step deleted, export used to export step 1 (exit 0) and
  average to average the steps before it, while a resumed run refused the run naming the step."""
  run, _, _, proc = damaged["no_state", tool]
  step_dir = run / "checkpoints" / str(LATEST)
  assert f"{step_dir} has no state/ item" in proc.stderr, proc.stderr
  assert "exported" not in proc.stdout and "averaged" not in proc.stdout
  resumed = damaged["no_state", "train"][3]
  assert f"checkpoint at step {LATEST} in {run.parent / 'no_state-train' / 'checkpoints'}" \
      in resumed.stderr


@pytest.mark.parametrize("tool", ["export_step1", "average_end1"])
def test_steps_selected_around_an_incomplete_one_are_still_read(damaged, tool):
  run, before, out, proc = damaged["no_state", tool]
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "Event loop is closed" not in proc.stderr
  assert tree_digest(run) == before and out.is_dir()
  info = json.loads((out / ("export.json" if tool == "export_step1" else "averaging.json"))
                    .read_text())
  assert (info["plan"] if tool == "export_step1" else info)["items"] == [1], info
