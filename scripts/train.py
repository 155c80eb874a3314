"""Train a policy with any recipe on any experiment config.

    python scripts/train.py experiments/grpo_arithmetic.py recipe=dapo steps=200 seed=1
    python scripts/train.py my_config.json run_dir=runs/x
    python scripts/train.py experiments/mc_grpo/full.py:math-G2-median policy=/models/...

CONFIG is a Python file defining a dict ``CONFIG`` (the project's experiment files),
``FILE.py:NAME`` for the run NAME of a file's ``FULL`` dict of named full-size runs
(``experiments/*/full.py``), or a JSON file; ``key=value`` overrides follow, typed by the config's
fields (dicts and tuples as JSON, e.g. ``task_spec='{"train": "a.jsonl", "test": "b.jsonl"}'``).
Unknown keys fail at start with the list of known ones. Re-running with the same run_dir resumes.

Multi-host: start the same command on every host with ``--distributed`` (cluster managers such as
SLURM and TPU pods are detected by JAX) or with ``RLPOST_COORDINATOR=host:port``,
``RLPOST_NUM_PROCESSES`` and ``RLPOST_PROCESS_ID`` set; run_dir must be on shared storage.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rlpost import sharding  # noqa: E402
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
  if path.endswith(".json"):
    with open(path) as f:
      data = json.load(f)
    if not isinstance(data, dict):
      raise ValueError(f"{path}: the JSON config must be an object")
    return data
  spec = importlib.util.spec_from_file_location("rlpost_experiment_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
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


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
      epilog="config keys (key=value; rlpost/train/rl_config.py):\n"
             + config_lib.describe(rl.RLConfig, rl_config.HELP))
  ap.add_argument("config")
  ap.add_argument("overrides", nargs="*", help="key=value")
  ap.add_argument("--no-progress", action="store_true")
  ap.add_argument("--distributed", action="store_true",
                  help="start jax.distributed first (multi-host runs)")
  args = ap.parse_args(argv)
  if args.distributed or os.environ.get("RLPOST_COORDINATOR"):
    sharding.initialize_distributed()
  values = load_config_file(args.config)
  values.update(config_lib.parse_overrides(args.overrides, rl.RLConfig))
  cfg = config_lib.from_dict(rl.RLConfig, values)
  file, name = split_config_name(args.config)
  stem = os.path.splitext(os.path.basename(file))[0] + (f"-{name}" if name else "")
  run_dir = cfg.run_dir or os.path.join("runs", f"{stem}-{cfg.recipe}-s{cfg.seed}")
  # Everything that can be checked is checked before the data, the model and the warm start.
  loop.check_run_dir(run_dir, cfg)
  t0 = time.perf_counter()
  trainer = rl.make_train(cfg, progress=not args.no_progress)
  out = loop.run(trainer, run_dir, progress=not args.no_progress)
  evals = out["evals"]
  if evals:
    first, last = evals[0], evals[-1]
    print(f"test pass@1: {first['pass@1']:.3f} (step {first['step']}) -> {last['pass@1']:.3f} "
          f"(step {last['step']}); greedy {first['greedy_pass@1']:.3f} -> {last['greedy_pass@1']:.3f}")
  print(f"run directory: {run_dir} ({time.perf_counter() - t0:.0f}s)")
  return out


if __name__ == "__main__":
  run_main(main)
