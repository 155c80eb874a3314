"""Average the parameters of a run's orbax checkpoints.

    python scripts/average.py --ckpt-dir runs/x/checkpoints --method lawa --k 5 --every 200 \\
        --out runs/x/lawa
    python scripts/average.py --ckpt-dir DIR --method swa --start 1000 --every 100 --out OUT
    python scripts/average.py --ckpt-dir DIR --method ema --decay 0.9 --start 0 --out OUT
    python scripts/average.py --ckpt-dir DIR --method mwa --penalty 2 --metric train/loss \\
        --metrics-file runs/x/metrics.jsonl --out OUT          # or --weight-by step
    python scripts/average.py --ckpt-dir DIR --method uniform --select log --base 2 --out OUT
    python scripts/average.py --ckpt-dir DIR --method posthoc_ema --sigma-rel 0.07 \\
        --profile 0.05=58-115 --profile 0.10=116-173 --out OUT
    python scripts/average.py --ckpt-dir DIR --method lawa --k 5 --dry-run   # print the plan only

Only parameter leaves are read (an orbax partial restore; optimizer state is never opened).
``--keys`` says which flat leaves of the saved train state are parameters: ``auto`` (the leading
floating-point leaves, i.e. the parameters of (params, adam state, ...) layouts), ``all``, or
ranges such as ``0-57``. Without ``--out`` the average is computed and summarised but not written
(evaluate-only). The output directory holds ``params/`` (flat leaves, readable with
``rlpost.train.checkpoint.load_params``) and ``averaging.json`` (the plan), written to a temporary
directory and renamed into place, so an interrupted run leaves nothing behind.

LoRA runs (``lora_rank`` > 0) are refused: their checkpoints hold the factors A and B, and
averaging them separately does not average the weights W + alpha / r * A B (the product is
bilinear). ``scripts/export.py RUN_DIR --out DIR --average SPEC`` averages their merged weights.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import numpy as np  # noqa: E402

from rlpost import averaging as A  # noqa: E402
from rlpost import paths  # noqa: E402
from rlpost.cli import run_main  # noqa: E402

METHODS = ("lawa", "swa", "ema", "mwa", "uniform", "posthoc_ema")


def build_parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--ckpt-dir", required=True, help="the Checkpointer directory (<step>/state)")
  ap.add_argument("--method", required=True, choices=METHODS)
  ap.add_argument("--out", help="output directory; omit to evaluate only")
  ap.add_argument("--overwrite", action="store_true")
  ap.add_argument("--keys", default="auto", help="parameter leaves: auto, all or ranges (0-57,60)")
  ap.add_argument("--dry-run", action="store_true", help="print the plan and stop")
  ap.add_argument("--no-verify", action="store_true",
                  help="read checkpoints without an integrity manifest (not written by rlpost's "
                  "run loop) unchecked")
  ap.add_argument("--no-progress", action="store_true")
  sel = ap.add_argument_group("selection")
  sel.add_argument("--select", choices=("latest", "from", "log", "all"),
                   help="override the method's selection (lawa: latest; swa, ema, mwa: from)")
  sel.add_argument("--k", type=int, default=5, help="number of latest checkpoints (lawa)")
  sel.add_argument("--every", type=int, help="spacing nu in steps between chosen checkpoints")
  sel.add_argument("--start", type=int, default=0, help="first step (swa, ema, mwa)")
  sel.add_argument("--end", type=int, help="last step (default: the latest checkpoint)")
  sel.add_argument("--base", type=float, default=2.0, help="log-spaced selection base")
  w = ap.add_argument_group("weights")
  w.add_argument("--decay", type=float, default=0.9, help="ema decay per checkpoint (or per step)")
  w.add_argument("--per-step", action="store_true", help="ema decay counts steps, not checkpoints")
  w.add_argument("--penalty", type=float, default=1.0, help="mwa penalty p (0 = uniform)")
  w.add_argument("--weight-by", default="loss", choices=sorted(A.weights.MWA_WEIGHT_FNS),
                 help="mwa weight function")
  w.add_argument("--metric", default="train/loss", help="mwa metric name")
  w.add_argument("--metrics-file", help="metrics.jsonl with the metric per step (default: the "
                 "run's own metrics.jsonl beside --ckpt-dir, else the checkpoints' recorded "
                 "metrics)")
  w.add_argument("--sigma-rel", type=float, help="posthoc_ema target relative width")
  w.add_argument("--profile", action="append", default=[],
                 help="posthoc_ema tracked profile SIGMA_REL=KEY_RANGES (repeat per profile)")
  return ap


def _selection(args, steps):
  mode = args.select or {"lawa": "latest", "uniform": "all"}.get(args.method, "from")
  if mode == "latest":
    return A.select_latest(steps, args.k, every=args.every, end=args.end)
  if mode == "from":
    return A.select_from(steps, args.start, every=args.every, end=args.end)
  if mode == "log":
    return A.select_log_spaced(steps, base=args.base, end=args.end)
  return A.select_all([s for s in steps if args.end is None or s <= args.end])


def make_plan(args, src: A.CheckpointSource) -> A.Plan:
  steps = src.steps
  if not steps:
    raise ValueError(f"no checkpoints in {src.directory}")
  m = args.method
  if m == "lawa" and args.select in (None, "latest"):
    return A.plan_lawa(steps, args.k, every=args.every, end=args.end)
  if m == "swa" and args.select in (None, "from"):
    return A.plan_swa(steps, start=args.start, every=args.every, end=args.end)
  chosen = _selection(args, steps)
  if m == "ema":
    return A.plan_ema(chosen, args.decay, start=chosen[0],
                      per="step" if args.per_step else "checkpoint")
  if m == "mwa":
    metric = None
    if args.weight_by != "step":
      run_metrics = os.path.join(os.path.dirname(os.path.abspath(src.directory)),
                                 "metrics.jsonl")
      if args.metrics_file:
        table = A.metrics_from_jsonl(args.metrics_file, args.metric)
      elif os.path.isfile(run_metrics):  # the run's own log, beside its checkpoints
        table = A.metrics_from_jsonl(run_metrics, args.metric)
      else:
        table = {s: src.metrics(s).get(args.metric) for s in chosen}
        table = {s: v for s, v in table.items() if v is not None}
      metric = table
    return A.plan_mwa(chosen, args.penalty, metric=metric, weight_fn=args.weight_by)
  return A.plan_uniform(chosen, method=m)


def _posthoc_sources(args, directory):
  if args.sigma_rel is None or not args.profile:
    raise ValueError("posthoc_ema needs --sigma-rel and at least one --profile SIGMA=KEYS")
  sources, gammas = {}, {}
  for spec in args.profile:
    sigma, eq, keys = spec.partition("=")
    if not eq:
      raise ValueError(f"--profile expects SIGMA_REL=KEY_RANGES, got {spec!r}")
    name = f"sigma{float(sigma):g}"
    gammas[name] = A.sigma_rel_to_gamma(float(sigma))
    sources[name] = A.CheckpointSource(directory, keys=keys, verify=not args.no_verify)
  return sources, gammas


def _refuse_lora(src: A.CheckpointSource) -> None:
  rank = src.run_config().get("lora_rank") or 0
  if rank:
    raise ValueError(
        f"{src.directory} holds a LoRA run (lora_rank={rank}): averaging its A and B factors "
        "separately would not average the weights W + alpha/r * A B (the product is bilinear); "
        "average the merged weights with scripts/export.py RUN_DIR --out DIR --average SPEC")


def check_out(args) -> None:
  """Before any checkpoint is read: ``--out`` must not be, contain or lie inside the checkpoint
  directory or its run, nor lie inside any checkpoint directory or replace a run; and it must
  be writable with room (``rlpost.paths``)."""
  if not args.out:
    return
  reads = [args.ckpt_dir]
  run = os.path.dirname(os.path.abspath(args.ckpt_dir))
  if paths.is_run_dir(run):
    reads.append(run)
  paths.check_output(args.out, "--out", reads=reads, overwrite=args.overwrite)
  if os.path.exists(args.out) and not args.overwrite:
    raise FileExistsError(f"--out {os.path.abspath(args.out)} exists; pass --overwrite to "
                          "replace it")
  paths.check_writable(args.out, "--out")


def main(argv=None) -> dict:
  args = build_parser().parse_args(argv)
  t0 = time.perf_counter()
  check_out(args)
  progress = not args.no_progress
  if args.method == "posthoc_ema":
    sources, gammas = _posthoc_sources(args, args.ckpt_dir)
    any_src = next(iter(sources.values()))
    steps = [s for s in any_src.steps if (args.end is None or s <= args.end) and s >= args.start]
    items = [(s, name) for s in steps for name in sources]
    plan = A.plan_posthoc_ema(items, gammas, args.sigma_rel,
                              target_step=args.end or (steps[-1] if steps else None))
    for s in sources.values():
      _refuse_lora(s)
    ref = [len(s.keys) for s in sources.values()]
    if len(set(ref)) != 1:
      raise ValueError(f"--profile key ranges have different sizes {ref}")

    def load(item):
      step, name = item
      values = sources[name].load(step)
      return [values[k] for k in sources[name].keys]  # profiles share positions, not key names

    describe = ", ".join(f"{n}: leaves {s.describe_keys()}" for n, s in sources.items())
    src_for_close = list(sources.values())
  else:
    src = A.CheckpointSource(args.ckpt_dir, keys=args.keys, verify=not args.no_verify)
    _refuse_lora(src)
    plan = make_plan(args, src)
    load = src.load
    describe = f"leaves {src.describe_keys()} ({len(src.keys)} parameter leaves)"
    src_for_close = [src]
  # ``CheckpointSource.steps`` lists incomplete checkpoint directories too, so the selection is
  # what it would be were they intact; one it selects is refused (naming it) before anything is
  # read, and ``--end`` or ``--start`` selects around it.
  chosen = {i[0] if isinstance(i, tuple) else i for i, w in zip(plan.items, plan.weights) if w}
  src_for_close[0].refuse_incomplete(sorted(chosen))
  print(f"{plan.describe()}\n  from {os.path.abspath(args.ckpt_dir)}; {describe}")
  if args.dry_run:
    return {"plan": plan}
  if plan.method != "posthoc_ema":
    src_for_close[0].validate([i for i, w in zip(plan.items, plan.weights) if w != 0])
  params = A.average(load, plan, progress=progress)
  leaves = jax.tree.leaves(params)
  n_values = sum(int(np.prod(x.shape)) for x in leaves)
  norm = float(np.sqrt(sum(float(np.sum(np.square(np.asarray(x, np.float64)))) for x in leaves)))
  print(f"averaged {len(plan.items)} checkpoints: {len(leaves)} leaves, {n_values:,} values, "
        f"L2 norm {norm:.6g}, {time.perf_counter() - t0:.1f}s")
  out = None
  if args.out:
    info = dict(plan.to_json(), source=os.path.abspath(args.ckpt_dir),
                keys=[k for s in src_for_close for k in s.keys])
    out = A.write_params(args.out, params, info, overwrite=args.overwrite)
    print(f"wrote {out}")
  else:
    print("evaluate-only: nothing written (pass --out DIR to write a checkpoint)")
  for s in src_for_close:
    s.close()
  return {"plan": plan, "params": params, "out": out}


if __name__ == "__main__":
  run_main(main)
