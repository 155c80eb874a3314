"""Launch the full-size runs of a table: one ``scripts/train.py`` command per arm x seed.

    python scripts/launch.py mc_grpo --seeds 12 --runs runs/mc_grpo --dry-run \\
        policy=/models/Qwen2.5-Math-1.5B mesh_fsdp=8        # print the commands still to run
    python scripts/launch.py dars --seeds 6 --runs runs/dars   # run them here, one by one
    python scripts/launch.py ace --seeds 9 --runs runs/ace \\
        --slurm scripts/slurm_array.sbatch                   # write a SLURM array job instead

NAME is an experiment with full-size runs (``experiments/NAME/full.py``, its ``FULL`` dict:
datasets are part of the arm names, e.g. ``math-G2-median``); ``--prefix`` keeps the arms whose
names start with it, ``--arms A,B`` the arms named. Seeds are 0 .. K-1 (``--first-seed`` moves
them). Every run gets ``run_dir=RUNS/ARM/sSEED`` and ``seed=SEED``; the ``key=value`` overrides after NAME go to every
run (the run-local keys: ``policy``, ``task_spec``, ``mesh_fsdp`` ...); ``key.field=value``
sets one field of a dict-valued key (``allocation_args.chunk=256``), as in ``scripts/train.py``.

A run whose directory holds a finished run (its last evaluation at its last step) is skipped;
an unfinished one is listed again, and ``scripts/train.py`` resumes it from its checkpoint. So
launching a half-finished sweep again runs only what is missing. When every run is finished,
``python scripts/reproduce.py NAME --full --runs RUNS`` makes the table (``--prefix`` for one
dataset of MC-GRPO).

``--slurm TEMPLATE`` writes ``RUNS/launch-<n>/commands.txt`` (one command per line) and
``RUNS/launch-<n>/array.sbatch``: the template with ``{job_name}``, ``{array}`` (``0-<n-1>``),
``{count}``, ``{commands}`` (the absolute path of commands.txt), ``{cwd}`` (the directory the
launcher ran in, which the commands' relative paths are relative to) and ``{root}`` (this
checkout) filled in; each array task runs line ``$SLURM_ARRAY_TASK_ID + 1`` of commands.txt
from ``{cwd}``. A new
``launch-<n>`` is made each time; nothing is overwritten. Bad input is one line and exit
status 2, before anything is written or run.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import subprocess
import sys
from typing import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rlpost.cli import run_main  # noqa: E402

PLACEHOLDERS = ("{job_name}", "{array}", "{count}", "{commands}", "{cwd}", "{root}")
SET_BY_LAUNCH = ("seed", "run_dir")


class LaunchError(ValueError):
  """Bad input to the launcher (one line, exit status 2)."""


def full_arms(name: str) -> dict:
  """``experiments/<name>/full.py``'s ``FULL``; LaunchError naming the experiments that have
  one otherwise."""
  have = sorted(d for d in os.listdir(os.path.join(ROOT, "experiments"))
                if os.path.exists(os.path.join(ROOT, "experiments", d, "full.py")))
  if name not in have:
    raise LaunchError(f"no full-size runs for {name!r} (experiments/{name}/full.py); "
                      f"experiments with them: {', '.join(have)}")
  return importlib.import_module(f"experiments.{name}.full").FULL


def run_state(run_dir: str) -> str:
  """"finished", "unfinished" (config.json written, the last evaluation not at the last step)
  or "new"."""
  from experiments import runs

  if not os.path.exists(os.path.join(run_dir, "config.json")):
    return "new"
  try:
    run = runs.read_run(run_dir)
  except runs.RunsError:
    return "unfinished"
  steps = run["config"].get("steps")
  return "finished" if run["evals"] and run["evals"][-1]["step"] == steps else "unfinished"


def plan(name: str, seeds: range, runs: str, overrides: list[str], prefix: str = "",
         only: Sequence[str] = ()) -> list[dict]:
  """[{"arm", "seed", "run_dir", "state", "command"}] for every arm (of ``prefix``; of ``only``
  when given) x seed."""
  from rlpost.train import config as config_lib
  from rlpost.train import rl

  every = full_arms(name)
  unknown = [a for a in only if a not in every]
  if unknown:
    raise LaunchError(f"--arms: {unknown[0]!r} is not an arm of experiments/{name}/full.py; "
                      f"arms: {', '.join(every)}")
  arms = {a: c for a, c in every.items() if a.startswith(prefix) and (not only or a in only)}
  if not arms:
    raise LaunchError(f"--prefix {prefix!r}: no arm of experiments/{name}/full.py starts with "
                      f"it" + (" among --arms" if only else "") + f"; arms: {', '.join(every)}")
  bad = [o for o in overrides if o.partition("=")[0] in SET_BY_LAUNCH]
  if bad:
    raise LaunchError(f"override {bad[0]!r}: the launcher sets {' and '.join(SET_BY_LAUNCH)} "
                      "per run (--seeds, --first-seed, --runs)")
  # Every override must apply to every arm: unknown keys and wrong types are refused here; what
  # depends on the training machine (its devices, files) is checked by each run at its start.
  for arm, cfg in arms.items():
    try:
      parsed = config_lib.parse_overrides(overrides, rl.RLConfig)
      config_lib.from_dict(rl.RLConfig, config_lib.apply_overrides(cfg, parsed), validate=False)
    except (TypeError, ValueError) as e:
      raise LaunchError(f"arm {arm}: {e}") from None
  out = []
  script = os.path.relpath(os.path.join(ROOT, "scripts", "train.py"))
  full_py = os.path.relpath(os.path.join(ROOT, "experiments", name, "full.py"))
  for arm in arms:
    for s in seeds:
      run_dir = os.path.join(runs, arm, f"s{s}")
      argv = ["python", script, f"{full_py}:{arm}", f"seed={s}", f"run_dir={run_dir}",
              *overrides, "--no-progress"]
      out.append(dict(arm=arm, seed=s, run_dir=run_dir, state=run_state(run_dir),
                      command=shlex.join(argv)))
  return out


def write_slurm(template: str, todo: list[dict], runs: str, name: str) -> str:
  """Writes ``runs/launch-<n>/{commands.txt, array.sbatch}`` (the first free n); returns the
  directory."""
  with open(template) as f:
    text = f.read()
  n = 0
  while os.path.exists(os.path.join(runs, f"launch-{n}")):
    n += 1
  out = os.path.join(runs, f"launch-{n}")
  os.makedirs(out)
  commands = os.path.abspath(os.path.join(out, "commands.txt"))
  with open(commands, "w") as f:
    f.write("".join(t["command"] + "\n" for t in todo))
  values = {"{job_name}": f"rlpost-{name}", "{array}": f"0-{len(todo) - 1}",
            "{count}": str(len(todo)), "{commands}": commands, "{cwd}": os.getcwd(),
            "{root}": ROOT}
  for k, v in values.items():
    text = text.replace(k, v)
  with open(os.path.join(out, "array.sbatch"), "w") as f:
    f.write(text)
  return out


def main(argv=None) -> list[dict]:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("name", help="experiment with full-size runs: mc_grpo, ace, dars")
  ap.add_argument("overrides", nargs="*", help="key=value, passed to every run")
  ap.add_argument("--seeds", type=int, required=True, help="seeds per arm (K)")
  ap.add_argument("--first-seed", type=int, default=0, help="seeds are first .. first + K - 1")
  ap.add_argument("--runs", default=None, help="where the run directories go (runs/NAME)")
  ap.add_argument("--prefix", default="", help="only the arms whose names start with this")
  ap.add_argument("--arms", default="", metavar="A,B,...",
                  help="only these arms (comma-separated names)")
  ap.add_argument("--dry-run", action="store_true", help="print the commands; run nothing")
  ap.add_argument("--slurm", metavar="TEMPLATE",
                  help="write a SLURM array job from TEMPLATE instead of running")
  args = ap.parse_intermixed_args(argv)
  if args.seeds < 1 or args.first_seed < 0:
    raise LaunchError(f"--seeds must be >= 1 and --first-seed >= 0 (got {args.seeds}, "
                      f"{args.first_seed})")
  if args.slurm:
    if not os.path.isfile(args.slurm):
      raise LaunchError(f"--slurm {args.slurm}: no such template file")
    with open(args.slurm) as f:
      if "{commands}" not in f.read():
        raise LaunchError(f"--slurm {args.slurm}: the template never reads {{commands}} (the "
                          f"command list); placeholders: {', '.join(PLACEHOLDERS)}")
  runs = args.runs or os.path.join("runs", args.name)
  if os.path.exists(runs) and not os.path.isdir(runs):
    raise LaunchError(f"--runs {runs} is a file, not a directory")
  items = plan(args.name, range(args.first_seed, args.first_seed + args.seeds), runs,
               args.overrides, args.prefix, [a for a in args.arms.split(",") if a])
  todo = [t for t in items if t["state"] != "finished"]
  done = len(items) - len(todo)
  head = (f"# {args.name}: {len(items)} runs ({len(items) // args.seeds} arms x {args.seeds} "
          f"seeds), {done} finished, {len(todo)} to run")
  tail = (f"# then: python scripts/reproduce.py {args.name} --full --runs {runs}"
          + (f" --prefix {args.prefix}" if args.prefix else ""))
  if args.dry_run:
    print(head)
    for t in todo:
      print(t["command"] + ("  # unfinished: resumes" if t["state"] == "unfinished" else ""))
    print(tail)
    return todo
  if args.slurm:
    if not todo:
      print(head + "; nothing to write")
      return todo
    out = write_slurm(args.slurm, todo, runs, args.name)
    print(f"{head}\nwrote {out}/commands.txt and {out}/array.sbatch: sbatch "
          f"{out}/array.sbatch\n{tail}")
    return todo
  print(head)
  for i, t in enumerate(todo):
    print(f"[{i + 1}/{len(todo)}] {t['command']}", flush=True)
    rc = subprocess.call([sys.executable] + shlex.split(t["command"])[1:])
    if rc:
      raise LaunchError(f"run {t['run_dir']} exited with status {rc}; launching again resumes "
                        "it and runs the rest")
  print(tail)
  return todo


if __name__ == "__main__":
  run_main(main)
