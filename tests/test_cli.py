"""Bad input to the scripts gets one ``error:`` line on stderr and exit status 2, no traceback.

The script runs are started together in one module fixture (each pays a Python + JAX start-up of
a few seconds, and none of them trains anything); the tests then check their results. The
helper itself (``rlpost.cli.run_main``) is also checked in-process.
"""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from rlpost import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _runs(tmp: str, ckpt: str) -> dict[str, tuple[list[str], dict]]:
  """name -> (script and arguments, extra environment)."""
  missing = os.path.join(tmp, "missing")
  a_file = os.path.join(tmp, "a_file")
  return {
      "train_missing_config": (["scripts/train.py", os.path.join(missing, "cfg.py")], {}),
      "train_unknown_key": (["scripts/train.py", "experiments/grpo_arithmetic.py",
                             "no_such_key=1"], {}),
      "train_bad_allocation_args": (["scripts/train.py", "experiments/grpo_arithmetic.py",
                                     "allocation=dynamic_sampling", "allocation_args={'factor': 0}",
                                     f"run_dir={os.path.join(tmp, 'alloc_run')}"], {}),
      "train_bad_rollout_chunk": (["scripts/train.py", "experiments/grpo_arithmetic.py",
                                   "allocation=dynamic_sampling", "rollout_chunk=7",
                                   f"run_dir={os.path.join(tmp, 'chunk_run')}"], {}),
      "average_missing_dir": (["scripts/average.py", "--ckpt-dir", missing, "--method", "lawa"],
                              {}),
      "average_no_manifest": (["scripts/average.py", "--ckpt-dir", ckpt, "--method", "uniform",
                               "--no-progress"], {}),
      "reproduce_out_is_file": (["scripts/reproduce.py", "averaging", "--quick", "--out",
                                 a_file], {}),
      "bench_out_dir_missing": (["scripts/bench.py", "sampler", "--quick", "--out",
                                 os.path.join(missing, "bench.json")], {}),
      "average_debug_env": (["scripts/average.py", "--ckpt-dir", missing, "--method", "lawa"],
                            {"RLPOST_DEBUG": "1"}),
      "reproduce_debug_flag": (["scripts/reproduce.py", "averaging", "--debug", "--out", a_file],
                               {}),
  }


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  import jax.numpy as jnp

  from rlpost.train import checkpoint

  tmp = tmp_path_factory.mktemp("cli")
  (tmp / "a_file").write_text("")
  ckpt = tmp / "ck"
  ck = checkpoint.Checkpointer(str(ckpt), async_save=False)
  ck.save(3, {"w": jnp.ones((4, 4))}, {"param_leaves": 1})
  ck.close()
  meta_file = ckpt / "3" / "meta" / "metadata"
  meta = json.loads(meta_file.read_text())
  del meta[checkpoint.INTEGRITY_KEY]
  meta_file.write_text(json.dumps(meta))

  def run(item):
    name, (args, extra) = item
    env = {k: v for k, v in os.environ.items() if k != cli.DEBUG_ENV}
    env.update(JAX_PLATFORMS="cpu", **extra)
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    return name, proc

  with ThreadPoolExecutor(max_workers=4) as pool:
    return dict(pool.map(run, _runs(str(tmp), str(ckpt)).items()))


def _one_error_line(proc) -> str:
  lines = proc.stderr.splitlines()
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert len(lines) == 1 and lines[0].startswith("error: ") and lines[0] != "error: ", lines
  assert "Traceback" not in proc.stderr
  return lines[0]


@pytest.mark.parametrize("name, expected", [
    ("train_missing_config", "cfg.py does not exist"),
    ("train_unknown_key", "unknown config key(s) ['no_such_key']"),
    ("train_bad_allocation_args", "config key 'allocation_args': allocation 'dynamic_sampling': "
                                  "factor must be >= 1"),
    ("train_bad_rollout_chunk", "config key 'rollout_chunk': must divide every sampling call's "
                                "rows [384]"),
    ("average_missing_dir", "checkpoint directory"),
    ("average_no_manifest", "checkpoint at step 3 in"),
    ("reproduce_out_is_file", "--out"),
    ("bench_out_dir_missing", "does not exist"),
])
def test_user_error_is_one_line(results, name, expected):
  line = _one_error_line(results[name])
  assert expected in line, line


def test_missing_manifest_is_refused_by_the_cli(results):
  line = _one_error_line(results["average_no_manifest"])
  assert "no integrity manifest" in line and "averaged" not in results["average_no_manifest"].stdout


@pytest.mark.parametrize("name", ["average_debug_env", "reproduce_debug_flag"])
def test_debug_shows_the_traceback(results, name):
  proc = results[name]
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "Traceback (most recent call last)" in proc.stderr
  assert proc.stderr.rstrip().splitlines()[-1].startswith("error: ")


# ------------------------------------------------------------------------------ run_main itself
def _exit_of(main, argv, capsys):
  with pytest.raises(SystemExit) as e:
    cli.run_main(main, argv)
  return e.value.code, capsys.readouterr().err


def test_run_main_user_errors(capsys, monkeypatch):
  monkeypatch.delenv(cli.DEBUG_ENV, raising=False)

  def bad(argv):
    raise ValueError("line one\n  line two")

  code, err = _exit_of(bad, ["x"], capsys)
  assert (code, err) == (2, "error: line one line two\n")
  code, err = _exit_of(lambda argv: open("/nonexistent/rlpost-cli-test"), [], capsys)
  assert code == 2 and err.startswith("error: ") and "/nonexistent/rlpost-cli-test" in err

  def interrupted(argv):
    raise KeyboardInterrupt

  assert _exit_of(interrupted, [], capsys) == (130, "error: interrupted\n")


def test_run_main_passes_argv_and_keeps_bugs_loud(capsys, monkeypatch):
  monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
  seen = []
  assert _exit_of(seen.append, ["a", "--debug", "b", "--", "--debug"], capsys) == (0, "")
  assert seen == [["a", "b", "--", "--debug"]]  # after "--" it is an argument, not the flag

  def bug(argv):
    raise KeyError("a real bug")

  with pytest.raises(KeyError):
    cli.run_main(bug, [])

  def usage(argv):
    raise SystemExit(2)  # argparse's own errors pass through

  assert _exit_of(usage, [], capsys)[0] == 2


def test_run_main_debug(capsys, monkeypatch):
  def bad(argv):
    raise FileNotFoundError("config file x does not exist")

  code, err = _exit_of(bad, ["--debug"], capsys)
  assert code == 2 and "Traceback" in err and err.endswith("error: config file x does not exist\n")
  monkeypatch.setenv(cli.DEBUG_ENV, "0")
  assert "Traceback" not in _exit_of(bad, [], capsys)[1]
  monkeypatch.setenv(cli.DEBUG_ENV, "1")
  assert "Traceback" in _exit_of(bad, [], capsys)[1]


def test_project_errors_are_user_errors():
  from rlpost.train import checkpoint, guards

  assert cli.is_user_error(checkpoint.CheckpointError(1, "/d", "bad"))
  assert cli.is_user_error(guards.TrainingStalled("stalled"))
  assert not cli.is_user_error(RuntimeError("bug"))
  assert not cli.is_user_error(KeyError("bug"))


def test_run_main_cuts_a_long_message_and_debug_shows_it_whole(capsys, monkeypatch):
  """A 2,170-character message (an orbax repr) was printed whole on one line."""
  monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
  text = "checkpoint at step 30 in /runs/x: cannot read the state (" + "spec, " * 360 + ")"
  assert len(text) > 2000

  def bad(argv):
    raise ValueError(text)

  code, err = _exit_of(bad, [], capsys)
  assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
  line = err.rstrip("\n")
  assert len(line) <= len("error: ") + cli.MAX_MESSAGE, len(line)
  assert line.startswith("error: checkpoint at step 30 in /runs/x: cannot read the state")
  assert line.endswith(" ... (--debug for the full message)")
  code, err = _exit_of(bad, ["--debug"], capsys)
  assert code == 2 and "Traceback" in err and err.endswith(f"error: {text}\n")
  assert cli.shorten("x" * cli.MAX_MESSAGE) == "x" * cli.MAX_MESSAGE  # at the limit: whole


def test_run_main_debug_prints_a_checkpoint_errors_full_message(capsys, monkeypatch):
  """``CheckpointError`` summarises the error it wraps; ``--debug`` prints the detail whole."""
  from rlpost.checkpoint_format import CheckpointError

  monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
  inner = ValueError("DATA_LOSS: bad manifest\n" + "  'driver': 'zarr',\n" * 100)

  def bad(argv):
    raise CheckpointError(3, "/d", f"cannot read the state ({inner!r})") from inner

  code, err = _exit_of(bad, [], capsys)
  assert (code, err) == (2, "error: checkpoint at step 3 in /d: cannot read the state "
                            "(ValueError: DATA_LOSS: bad manifest)\n")
  code, err = _exit_of(bad, ["--debug"], capsys)
  assert code == 2 and err.rstrip("\n").splitlines()[-1].count("'driver': 'zarr'") == 100
