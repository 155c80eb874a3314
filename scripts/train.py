"""Train a policy with any recipe on any experiment config.

    python scripts/train.py experiments/grpo_arithmetic.py recipe=dapo steps=200 seed=1
    python scripts/train.py my_config.json run_dir=runs/x
    python scripts/train.py experiments/mc_grpo/full.py:math-G2-median policy=/models/...

CONFIG is a Python file defining a dict ``CONFIG`` (the project's experiment files),
``FILE.py:NAME`` for the run NAME of a file's ``FULL`` dict of named full-size runs
(``experiments/*/full.py``), or a JSON file; ``key=value`` overrides follow, typed by the config's
fields (dicts and tuples as JSON, e.g. ``task_spec='{"train": "a.jsonl", "test": "b.jsonl"}'``);
``key.field=value`` sets one field of a dict-valued key and keeps the others
(``recipe_args.alpha=0.5``, ``allocation_args.chunk=256``, ``model.max_seq_len=8192``).
Unknown keys fail at start with the list of known ones. Re-running with the same run_dir resumes.

Multi-host: start the same command on every host with ``--distributed`` (cluster managers such as
SLURM and TPU pods are detected by JAX) or with ``RLPOST_COORDINATOR=host:port``,
``RLPOST_NUM_PROCESSES`` and ``RLPOST_PROCESS_ID`` set; run_dir must be on shared storage.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402

from rlpost import paths, sharding  # noqa: E402
from rlpost.cli import run_main  # noqa: E402
from rlpost.train import config as config_lib  # noqa: E402
from rlpost.train import loop, rl, rl_config  # noqa: E402


def split_config_name(path: str) -> tuple[str, str | None]:
  """``"dir/full.py:NAME"`` -> ("dir/full.py", "NAME"); other paths -> (path, None)."""
  head, sep, name = path.rpartition(":")
  if sep and head.endswith(".py") and name:
    return head, name
  return path, None


def load_config_file(path: str) -> dict:
  """The CONFIG dict of a project Python config file (``FULL[NAME]`` for ``file.py:NAME``), or
  the object in a JSON file."""
  path, name = split_config_name(path)
  if not os.path.exists(path):
    raise FileNotFoundError(f"config file {path} does not exist")
  if os.path.isdir(path):
    raise IsADirectoryError(f"config file {path} is a directory; expected a Python (.py) or "
                            "JSON (.json) file")
  if path.endswith(".json"):
    try:
      with open(path, encoding="utf-8") as f:
        data = json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"config file {path}, line {e.lineno}: invalid JSON ({e.msg})") from None
    except UnicodeDecodeError as e:
      raise ValueError(f"config file {path}: not valid UTF-8 (byte {e.start})") from None
    if not isinstance(data, dict):
      raise ValueError(f"{path}: the JSON config must be an object")
    return data
  if not path.endswith(".py"):
    raise ValueError(f"config file {path}: expected a Python (.py) or JSON (.json) file")
  spec = importlib.util.spec_from_file_location("rlpost_experiment_config", path)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except Exception as e:  # noqa: BLE001 - any failure of the file's own code is the user's
    raise ValueError(_config_exec_error(path, e)) from e
  if name is not None:
    runs = getattr(module, "FULL", None)
    if not isinstance(runs, dict):
      raise ValueError(f"{path} defines no FULL dict of named runs (asked for {name!r})")
    if name not in runs:
      raise ValueError(f"{path}: no run {name!r} in FULL; known: {sorted(runs)}")
    return dict(runs[name])
  if not isinstance(getattr(module, "CONFIG", None), dict):
    raise ValueError(f"{path} defines no CONFIG dict")
  return dict(module.CONFIG)


def _config_exec_error(path: str, e: Exception) -> str:
  """One line for an exception raised while executing config file ``path``: the file, the line
  of the file that failed (the deepest traceback frame in it; a syntax error's own line) and the
  message. A syntax error in a module the file imports names that module's file and line too."""
  here = os.path.realpath(path)
  line = None
  if isinstance(e, SyntaxError) and e.filename and os.path.realpath(e.filename) == here:
    line = e.lineno
  else:
    tb = e.__traceback__
    while tb is not None:
      if os.path.realpath(tb.tb_frame.f_code.co_filename) == here:
        line = tb.tb_lineno
      tb = tb.tb_next
  if isinstance(e, SyntaxError):
    message = e.msg
    if e.filename and os.path.realpath(e.filename) != here:
      message = f"{e.filename}, line {e.lineno}: {message}"
  elif isinstance(e, ImportError):
    message = str(e)
  else:
    message = f"{type(e).__name__}: {e}"
  where = f"config file {path}" + (f", line {line}" if line is not None else "")
  return f"{where}: {message}"


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
      epilog="config keys (key=value; rlpost/train/rl_config.py):\n"
             + config_lib.describe(rl.RLConfig, rl_config.HELP))
  ap.add_argument("config")
  ap.add_argument("overrides", nargs="*", help="key=value")
  ap.add_argument("--no-progress", action="store_true")
  ap.add_argument("--allow-config-change", action="store_true",
                  help="resume a run_dir whose stored config differs in keys that change the "
                  "trajectory (recorded in metrics.jsonl as a config_change entry)")
  ap.add_argument("--distributed", action="store_true",
                  help="start jax.distributed first (multi-host runs)")
  # Options may come anywhere among the overrides (``CONFIG steps=2 --no-progress lr=1e-4``).
  args = ap.parse_intermixed_args(argv)
  if args.distributed or os.environ.get("RLPOST_COORDINATOR"):
    sharding.initialize_distributed()
  values = load_config_file(args.config)
  values = config_lib.apply_overrides(values, config_lib.parse_overrides(args.overrides,
                                                                     rl.RLConfig))
  cfg = config_lib.from_dict(rl.RLConfig, values)
  file, name = split_config_name(args.config)
  stem = os.path.splitext(os.path.basename(file))[0] + (f"-{name}" if name else "")
  run_dir = cfg.run_dir or os.path.join("runs", f"{stem}-{cfg.recipe}-s{cfg.seed}")
  # Everything that can be checked is checked before the data, the model and the warm start.
  loop.check_run_dir(run_dir, cfg, allow_config_change=args.allow_config_change)
  # One writer per run directory, taken before the data, the model and the warm start (the
  # kernel releases it when the process dies, so a killed run does not block its resume).
  lock = paths.hold_run_dir(run_dir) if jax.process_index() == 0 else contextlib.nullcontext()
  with lock:
    t0 = time.perf_counter()
    trainer = rl.make_train(cfg, progress=not args.no_progress)
    out = loop.run(trainer, run_dir, progress=not args.no_progress,
                   allow_config_change=args.allow_config_change)
  evals = out["evals"]
  if evals:
    first, last = evals[0], evals[-1]
    print(f"test pass@1: {first['pass@1']:.3f} (step {first['step']}) -> {last['pass@1']:.3f} "
          f"(step {last['step']}); greedy {first['greedy_pass@1']:.3f} -> {last['greedy_pass@1']:.3f}")
  print(f"run directory: {run_dir} ({time.perf_counter() - t0:.0f}s)")
  return out


if __name__ == "__main__":
  run_main(main)
