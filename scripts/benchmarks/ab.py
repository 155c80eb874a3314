"""One benchmark, before and after a change, alternating in one run on one machine.

  python -m scripts.benchmarks.ab --base REF [--rounds 3] [--out FILE] -- BENCH ARGS...

runs ``python scripts/bench.py BENCH ARGS... --out ...`` ``--rounds`` times in each of two
trees, alternately (base, this tree, base, this tree, ...): ``REF`` checked out into a
temporary git worktree, and this working tree as it is (uncommitted changes included). Each
run is a fresh process with its own compilations, so the two sides see the same machine load
as nearly as a shared machine allows. From each run's JSON it reads rlpost's own number per
setting (``tokens_per_s`` of ``sampler`` rows, ``median_s`` of the rows of the other
benchmarks), and prints per setting the median over rounds of each side and their ratio
(after / base, and which way is better). ``--out`` writes every run's numbers and the
summary, with the date, CPU model and load averages of the A/B (``machine``); it never
overwrites an existing file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from scripts.benchmarks.common import host_record, load_average

ROOT = Path(__file__).resolve().parents[2]
# Fields that name a setting in a benchmark's "results" rows.
SETTING_KEYS = ("model", "batch", "beta", "setting", "name", "size", "prompts", "group_size")


def _numbers(report: dict) -> dict[str, float]:
  """{setting: rlpost's number} of one bench.py JSON report."""
  out = {}
  for row in report.get("results", []):
    ours = row.get("rlpost")
    if not isinstance(ours, dict):
      continue
    key = ",".join(f"{k}={row[k]}" for k in SETTING_KEYS if k in row)
    for metric in ("tokens_per_s", "median_s"):
      if metric in ours:
        out[f"{key} {metric}"] = float(ours[metric])
        break
  return out


def _run(tree: Path, bench: list[str], out: Path) -> dict[str, float]:
  env = dict(os.environ, PYTHONPATH=str(tree))
  cmd = [sys.executable, str(tree / "scripts" / "bench.py"), *bench, "--out", str(out)]
  subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
  with open(out) as f:
    return _numbers(json.load(f))


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--base", required=True, help="the git ref to compare against")
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--out", default=None)
  ap.add_argument("bench", nargs=argparse.REMAINDER, help="-- BENCH ARGS for scripts/bench.py")
  args = ap.parse_args(argv)
  bench = args.bench[1:] if args.bench[:1] == ["--"] else args.bench
  if not bench:
    ap.error("give the benchmark after --, e.g. -- sampler --no-transformers")
  if args.out and os.path.exists(args.out):
    sys.exit(f"ab: --out {args.out} exists; choose a new file")
  if args.rounds < 1:
    ap.error("--rounds must be >= 1")
  rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", args.base + "^{commit}"],
                       capture_output=True, text=True)
  if rev.returncode:
    print(f"ab: --base {args.base!r} is not a commit of {ROOT}", file=sys.stderr)
    sys.exit(2)
  base_sha = rev.stdout.strip()
  machine = host_record()
  runs = {"base": [], "this": []}
  with tempfile.TemporaryDirectory(prefix="rlpost-ab-") as tmp:
    base_tree = Path(tmp) / "base"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base_tree),
                    base_sha], check=True)
    try:
      for i in range(args.rounds):
        for side, tree in (("base", base_tree), ("this", ROOT)):
          nums = _run(tree, bench, Path(tmp) / f"{side}{i}.json")
          runs[side].append(nums)
          print(f"round {i + 1} {side}: " + ", ".join(f"{k} {v:.4g}" for k, v in nums.items()),
                flush=True)
    finally:
      subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_tree)],
                     check=False)
  machine["loadavg_end"] = load_average()
  summary = {}
  for key in runs["base"][0]:
    base = statistics.median(r[key] for r in runs["base"])
    this = statistics.median(r[key] for r in runs["this"])
    higher_better = key.endswith("tokens_per_s")
    summary[key] = {"base": base, "this": this, "ratio": this / base,
                    "better": "higher" if higher_better else "lower"}
  print(f"\n{' '.join(bench)}: medians of {args.rounds} alternating runs; base {base_sha[:7]}")
  print(f"{'setting':<44} {'base':>10} {'this':>10} {'this/base':>10}")
  for key, s in summary.items():
    print(f"{key:<44} {s['base']:>10.4g} {s['this']:>10.4g} {s['ratio']:>10.3f} "
          f"({s['better']} is better)")
  report = {"base": base_sha, "bench": bench, "rounds": args.rounds, "machine": machine,
            "runs": runs, "summary": summary}
  if args.out:
    with open(args.out, "x") as f:
      json.dump(report, f, indent=1)
  return report


if __name__ == "__main__":
  main()
