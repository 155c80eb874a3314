"""Reproduce a paper table or figure: runs an experiment and writes markdown, JSON and plots.

    python scripts/reproduce.py averaging            # full run (experiments/averaging/README.md)
    python scripts/reproduce.py averaging --quick    # toy size, seconds
    python scripts/reproduce.py averaging --seeds 5 --out /tmp/avg
    python scripts/reproduce.py ace --jobs 2             # two arms at a time, one core each
    python scripts/reproduce.py mc_grpo --sync-docs  # README results section from results/
    python scripts/reproduce.py dars --rejudge       # re-judge results/dars/results.json (seconds)
    python scripts/reproduce.py ace --replicate --seeds 4   # fresh seeds from the pinned start,
                                                     # compared claim by claim with results/ace
    python scripts/reproduce.py mc_grpo --recheck G2-median  # retrain committed arms at their
                                                     # seeds here: bitwise, or how far it moved
    python scripts/reproduce.py mc_grpo --full --runs runs/ --prefix math-  # full-size runs

Each entry of ``EXPERIMENTS`` names a module whose ``EXPERIMENT`` is an
``experiments.harness.Experiment`` (plain-data config, cached units, claims judged by
``rlpost.eval.stats``); adding a table is one line here. ``--rejudge`` re-judges the committed
per-seed results in ``--out`` with the current statistics, without training. A full run (or a
re-judge) into the default ``results/<name>`` also rewrites the generated section of the table's
README (``experiments/docsync.py``).
``--replicate`` reruns the table's main arms from its pinned testbeds with seeds it did not use
(``--seeds K``, from ``--seed-offset S``) and writes, per claim, the committed and the new
interval and whether they agree (``--out/replication.md``; a replication at other seeds than the
committed one goes to ``--out/replication-<S>x<K>/`` instead, never over it). ``--full --runs DIR`` judges
full-size runs instead (the ``experiments/*/full.py`` arms, one
``scripts/train.py`` run directory per arm x seed) with the same summary, intervals and verdicts,
written to ``results/<name>_full`` unless ``--out`` says otherwise. ``--jobs N`` runs the missing
units in N worker processes, each pinned to its own share of the cores
(``experiments/harness.run_units``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rlpost.cli import run_main  # noqa: E402

EXPERIMENTS = {
    "averaging": "experiments.averaging",
    "averaging_rl": "experiments.averaging.t5_rl",
    "roundtrip": "experiments.roundtrip",
    "roundtrip_inverse": "experiments.roundtrip.inverse",
    "mc_grpo": "experiments.mc_grpo",
    "ace": "experiments.ace",
    "dars": "experiments.dars",
    "ema_risk": "experiments.averaging.ema_risk",
}

def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("experiment", choices=sorted(EXPERIMENTS))
  ap.add_argument("--quick", action="store_true", help="toy-size run (seconds)")
  ap.add_argument("--seeds", type=int, help="seeds per setting (default: the experiment's)")
  ap.add_argument("--out", help="output directory (default: results/<experiment>)")
  ap.add_argument("--no-progress", action="store_true")
  ap.add_argument("--sync-docs", action="store_true",
                  help="only rewrite the README's results section from results/<name>")
  ap.add_argument("--full", action="store_true",
                  help="judge full-size runs (--runs) with this table's code, no training")
  ap.add_argument("--runs", help="with --full: directory of scripts/train.py run directories "
                                 "(one per arm x seed, any depth)")
  ap.add_argument("--prefix", default="",
                  help="with --full: only the full.py arms whose names start with this")
  ap.add_argument("--allow-underpowered", action="store_true",
                  help="with --full: judge arms with fewer seeds than the power plan asks for "
                       "(printed, and marked in the table's header)")
  ap.add_argument("--replicate", action="store_true",
                  help="rerun the table's main arms from its pinned start with fresh seeds and "
                       "compare, claim by claim, with the committed results in --out "
                       "(writes --out/replication.md and --out/replication/, or "
                       "--out/replication-<offset>x<seeds>/ beside a committed replication "
                       "at other seeds)")
  ap.add_argument("--recheck", nargs="+", metavar="ARM",
                  help="retrain these RL arms of the committed table at its own seeds on this "
                       "machine and code, and compare every evaluation with it (bitwise or how "
                       "far it moved), appending a record to --out/recheck.jsonl")
  ap.add_argument("--seed-offset", type=int,
                  help="with --replicate: the first fresh seed (default 1000); --replicate "
                       "--rejudge re-judges an existing replication without training")
  ap.add_argument("--jobs", type=int, default=1,
                  help="run the missing units (arms) in this many worker processes, each "
                       "pinned to its own share of the CPU cores (default 1: one process on "
                       "all cores). On 2 cores, 2 jobs ran the ACE table 1.46x faster; a "
                       "unit's numbers then agree with a 1-job run within the cross-program "
                       "tolerance, not bitwise (experiments/harness.run_units)")
  ap.add_argument("--rejudge", action="store_true",
                  help="re-judge the claims of the results already in --out (no training), "
                       "then rewrite table.md, the plots and the docs")
  args = ap.parse_args(argv)
  # Tables name their pinned testbeds relative to the repository (experiments/testbeds), so they
  # run from its root; paths given on the command line keep meaning what they meant.
  args.out = os.path.abspath(args.out) if args.out else None
  args.runs = os.path.abspath(args.runs) if args.runs else None
  cwd = os.getcwd()
  os.chdir(ROOT)
  try:
    return _main(ap, args)
  finally:
    os.chdir(cwd)


def _main(ap, args):
  from experiments import docsync, harness

  if args.recheck:
    others = [f for f, on in (("--quick", args.quick), ("--replicate", args.replicate),
                              ("--rejudge", args.rejudge), ("--seeds", args.seeds is not None),
                              ("--seed-offset", args.seed_offset is not None),
                              ("--sync-docs", args.sync_docs), ("--full", args.full)) if on]
    if others:
      ap.error(f"--recheck reruns arms of the committed table at its own seeds: not with "
               f"{others[0]}")
  if args.seed_offset is not None and not args.replicate:
    ap.error("--seed-offset applies to --replicate only")
  try:
    harness.check_jobs(args.jobs)
  except ValueError as e:
    ap.error(str(e))
  module = importlib.import_module(EXPERIMENTS[args.experiment])
  exp = module.EXPERIMENT
  if args.jobs > 1:
    no_workers = [f for f, on in (("--rejudge", args.rejudge), ("--sync-docs", args.sync_docs),
                                  ("--full", args.full)) if on]
    if no_workers:
      ap.error(f"--jobs runs units in worker processes: {no_workers[0]} trains none")
    if args.recheck:
      ap.error("--jobs: --recheck retrains the committed arms in this process, on all its cores")
    if args.replicate and exp.replicate_own:
      ap.error(f"--jobs: {args.experiment}'s own replication runs in one process")
  if args.sync_docs:
    for path, changed in docsync.sync_all(exp).items():
      print(f"{os.path.relpath(path, ROOT)}: {'updated' if changed else 'up to date'}")
    return None
  if args.allow_underpowered and not args.full:
    ap.error("--allow-underpowered applies to --full only (a CPU table runs its planned seeds)")
  if args.full:
    if not args.runs:
      ap.error("--full needs --runs DIR (the full-size run directories)")
    if not os.path.isdir(args.runs):
      ap.error(f"--runs {args.runs}: not a directory")
    out = args.out or os.path.join("results", args.experiment + "_full")
    try:
      return harness.run_full(exp, args.runs, out, prefix=args.prefix,
                              allow_underpowered=args.allow_underpowered)
    except harness.RunsError as e:
      ap.error(str(e))
  default_out = args.out is None
  if args.seeds is not None and args.seeds < 1:
    ap.error("--seeds must be >= 1")
  if args.out is None:
    args.out = os.path.join("results", args.experiment + ("_quick" if args.quick else ""))
  if os.path.exists(args.out) and not os.path.isdir(args.out):
    raise NotADirectoryError(f"--out {args.out} is a file; it must be a directory (or not exist)")
  sync = default_out and not args.quick
  if args.recheck:
    if not os.path.exists(os.path.join(args.out, "results.json")):
      raise FileNotFoundError(f"--recheck: no committed results.json in {args.out}")
    return harness.recheck(exp, args.out, args.recheck)
  if args.replicate:
    if args.quick:
      ap.error("--replicate compares with the committed full run: not with --quick")
    if not os.path.exists(os.path.join(args.out, "results.json")):
      raise FileNotFoundError(f"--replicate: no committed results.json in {args.out}")
    if args.rejudge:  # re-judge an existing replication, no training
      if not os.path.exists(os.path.join(args.out, "replication", "results.json")):
        raise FileNotFoundError(f"--replicate --rejudge: no replication/results.json in "
                                f"{args.out}")
      if exp.replicate_own:
        return exp.replicate_own(args.out, None, 0, args.no_progress, True)
      return harness.rejudge_replication(exp, args.out)
    offset = 1000 if args.seed_offset is None else args.seed_offset
    if exp.replicate_own:
      return exp.replicate_own(args.out, args.seeds, offset, args.no_progress, False)
    return harness.replicate(exp, args.out, seeds=args.seeds, seed_offset=offset,
                             no_progress=args.no_progress, jobs=args.jobs)
  if args.rejudge:
    if not os.path.exists(os.path.join(args.out, "results.json")):
      raise FileNotFoundError(f"--rejudge: no results.json in {args.out}")
    return harness.rejudge(exp, args.out, sync_docs=sync)
  return harness.run(exp, args, sync_docs=sync)


if __name__ == "__main__":
  run_main(main)
