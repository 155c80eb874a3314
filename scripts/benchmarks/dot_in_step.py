"""The MLP dots inside the GRPO update against the same dots alone, per XLA:CPU option.

    python -m scripts.benchmarks.dot_in_step [--variants default,...] [--out FILE.json]

``bench.py train``'s update (16 prompts x G=8, 64 new tokens, the 0.81M-parameter policy,
padded: R*T = 9,600 slots, E = 128, F = 384) holds per layer two independent dots of the same
shape, ``x @ w_gate`` and ``x @ w_up`` ([R*T, E] x [E, F]). Per variant of ``XLA_FLAGS``, in a
fresh process each (the flags are read when the backend starts), this measures:

- ``update_ms``: the update's wall time (median of 5 jitted calls);
- ``in_step``: from a ``jax.profiler`` trace of the update, the median duration of the dots
  with an ``[R*T, F]`` output (per layer the gate and up dots, and the down projection's input
  gradient), and the share of their time during which another op ran on another thread
  (``overlap``: 1.0 means another op always runs beside them);
- ``alone``: median ms of jitted programs at the same shape: one dot; the two independent
  dots in one program (what the update holds); the two as one dot on the concatenated weights
  ``x @ [w_gate | w_up]``; and the MLP block forward and backward, both ways;
- ``per_update``: minor page faults, system and user CPU seconds and wall seconds per update
  (``getrusage`` over 5 calls), and the update's temporary bytes (XLA's memory analysis).

Variants (``VARIANTS``), all without glibc's ``glibc.malloc.hugetlb`` tunable unless named: the
default; ``huge pages`` (with it, ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``); intra-op threads
forced to 1 (``taskset`` one core and Eigen single-threaded); the thunk runtime's memory- and
concurrency-optimized schedulers; the dot back ends: XNNPACK instead of YNNPACK, and neither
(Eigen). A variant whose flags this jaxlib rejects is recorded with its error.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from scripts.benchmarks.common import host_record, load_average
from scripts.benchmarks.profile_update import _Args, _median_ms

# glibc >= 2.35: malloc madvises transparent huge pages on what it maps.
HUGE_PAGES = "glibc.malloc.hugetlb=1"
VARIANTS = {
    "default": ("", False),
    "huge pages": ("", False),
    "one thread": ("--xla_cpu_multi_thread_eigen=false", True),
    "memory-optimized scheduler":
        ("--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED", False),
    "concurrency-optimized scheduler":
        ("--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_CONCURRENCY_OPTIMIZED", False),
    "XNNPACK dots": ("--xla_cpu_experimental_ynn_fusion_type= "
                     "--xla_cpu_experimental_xnn_fusion_type=LIBRARY_FUSION_TYPE_DOT", False),
    "Eigen dots": ("--xla_cpu_experimental_ynn_fusion_type= "
                   "--xla_cpu_experimental_xnn_fusion_type=", False),
}


def mlp(x, wg, wu, wd):
  """The gated MLP with its gate and up projections as two dots, as the model computes it."""
  import jax
  return (jax.nn.silu(x @ wg) * (x @ wu)) @ wd


def mlp_concat(x, wg, wu, wd):
  """The same MLP with one dot on the concatenated weights [w_gate | w_up]."""
  import jax
  import jax.numpy as jnp
  g, u = jnp.split(x @ jnp.concatenate([wg, wu], 1), 2, axis=1)
  return (jax.nn.silu(g) * u) @ wd


def _alone(rows: int, e: int, f: int) -> dict:
  """ms of the MLP's gate and up dots at the update's shape, in programs of their own."""
  import jax
  import jax.numpy as jnp
  ks = jax.random.split(jax.random.key(0), 5)
  x = jax.random.normal(ks[0], (rows, e))
  wg = jax.random.normal(ks[1], (e, f)) * e ** -0.5
  wu = jax.random.normal(ks[2], (e, f)) * e ** -0.5
  wd = jax.random.normal(ks[3], (f, e)) * f ** -0.5

  def fwd_bwd(fn):
    return jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a) ** 2), argnums=(0, 1, 2, 3)))

  cases = {
      "one dot": (jax.jit(lambda x, w: x @ w), (x, wg)),
      "two dots, one program": (jax.jit(lambda x, a, b: (x @ a, x @ b)), (x, wg, wu)),
      "concatenated dot": (jax.jit(lambda x, a, b: x @ jnp.concatenate([a, b], 1)), (x, wg, wu)),
      "MLP forward+backward, two dots": (fwd_bwd(mlp), (x, wg, wu, wd)),
      "MLP forward+backward, concatenated": (fwd_bwd(mlp_concat), (x, wg, wu, wd)),
  }
  return {name: _median_ms(fn, *args) for name, (fn, args) in cases.items()}


def _dots(hlo: str, rows: int, f: int) -> set[str]:
  """Names of the compiled HLO's dots with an f32[rows, f] output: plain dots, and fusions
  (YNNPACK, XNNPACK or XLA's own) whose fused computation's root is a dot."""
  roots, computation = {}, None
  for line in hlo.splitlines():
    head = re.match(r"%([\w.-]+) .*\{$", line)
    if head:
      computation = head.group(1)
    root = re.match(r"\s*ROOT %[\w.-]+ = \S+ (\w+)\(", line)
    if root and computation:
      roots[computation] = root.group(1)
  names = set()
  for name, op, rest in re.findall(rf"%([\w.-]+) = f32\[{rows},{f}\]\{{[\d,]*\}} (\w+)\(([^\n]*)",
                                   hlo):
    called = re.search(r"calls=%([\w.-]+)", rest)
    if op == "dot" or (op == "fusion" and called and roots.get(called.group(1)) == "dot"):
      names.add(name)
  return names


def _in_step(fn, args, rows: int, f: int, calls: int = 3) -> dict:
  """Median ms of the jitted ``fn(*args)``'s dots with an f32[rows, f] output in a trace, and
  the share of their time overlapped by an op on another thread."""
  import jax
  hlo = fn.lower(*args).compile().as_text()
  names = _dots(hlo, rows, f)
  out = tempfile.mkdtemp(prefix="rlpost_dot_in_step_")
  with jax.profiler.trace(out):
    for _ in range(calls):
      jax.block_until_ready(fn(*args))
  (path,) = glob.glob(out + "/**/*.trace.json.gz", recursive=True)
  events = [e for e in json.load(gzip.open(path))["traceEvents"] if e.get("ph") == "X"]
  ops = [e for e in events if not e["name"].startswith(("ThunkExecutor", "$", "end:", "Thread"))
         and e.get("dur", 0) > 0]
  by_tid = collections.defaultdict(list)
  for e in ops:
    by_tid[e["tid"]].append(e)
  durs, overlap, total = [], 0.0, 0.0
  for e in ops:
    if e["name"] not in names:
      continue
    t0, t1 = e["ts"], e["ts"] + e["dur"]
    durs.append(e["dur"] / 1e3)
    covered = 0.0
    for tid, others in by_tid.items():
      if tid != e["tid"]:
        covered = max(covered, sum(max(0.0, min(t1, o["ts"] + o["dur"]) - max(t0, o["ts"]))
                                   for o in others))
    overlap += min(covered, e["dur"])
    total += e["dur"]
  return {"dots": len(durs) // calls, "median_ms": statistics.median(durs) if durs else None,
          "overlap": overlap / total if total else None}


def measure() -> dict:
  """One variant, in this process: the update's wall time, its dots in the trace, the dots alone."""
  import jax
  import jax.numpy as jnp

  from rlpost.rollouts import allocate
  from rlpost.train import rl
  from scripts.benchmarks import train as bench_train

  trainer = rl.make_train(bench_train._config(_Args, 0.0), log=lambda s: None)
  state = trainer.init_state()
  p, g = trainer.cfg.num_prompts, trainer.cfg.group_size
  idx = jnp.repeat(jnp.arange(p, dtype=jnp.int32), g)
  key = jax.random.key(0)
  ro = jax.jit(lambda params, k: trainer.sample(params, idx, k))(state.params, key)
  alloc = allocate.Allocation(ro, idx // g, jnp.ones((p * g,), bool), p, {})
  update = jax.jit(lambda st, a: trainer.fns.update(st, a, trainer.ref_params, key, key))
  cfg = trainer.model_cfg
  slots = int(trainer.train_data.prompt_tokens.shape[1]) + trainer.max_new_tokens
  rows, e, f = p * g * slots, cfg.hidden_size, cfg.intermediate_size
  update_ms = _median_ms(update, state, alloc, repeats=5)
  before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
  for _ in range(5):
    jax.block_until_ready(update(state, alloc))
  after, wall = resource.getrusage(resource.RUSAGE_SELF), (time.perf_counter() - t0) / 5
  faults = {"minor_faults": (after.ru_minflt - before.ru_minflt) / 5,
            "system_s": (after.ru_stime - before.ru_stime) / 5,
            "user_s": (after.ru_utime - before.ru_utime) / 5, "wall_s": wall,
            "temp_bytes": update.lower(state, alloc).compile().memory_analysis().temp_size_in_bytes}
  return {"shape": [rows, e, f], "update_ms": update_ms, "per_update": faults,
          "in_step": _in_step(update, (state, alloc), rows, f), "alone": _alone(rows, e, f)}


def _run_variant(name: str) -> dict:
  flags, one_core = VARIANTS[name]
  env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + flags).strip())
  # Every variant but "huge pages" runs without glibc's hugetlb tunable.
  tunables = [t for t in env.get("GLIBC_TUNABLES", "").split(":")
              if t and not t.startswith("glibc.malloc.hugetlb")]
  env["GLIBC_TUNABLES"] = ":".join(tunables + [HUGE_PAGES] * (name == "huge pages"))
  cmd = [sys.executable, "-m", "scripts.benchmarks.dot_in_step", "--_measure"]
  if one_core:
    cmd = ["taskset", "-c", "0", *cmd]
  proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
  if proc.returncode:
    return {"flags": flags, "error": (proc.stderr.strip().splitlines() or ["?"])[-1][:300]}
  return {"flags": flags, "one_core": one_core, **json.loads(proc.stdout.strip().splitlines()[-1])}


def _fmt(v):
  return "-" if v is None else f"{v:.2f}"


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--variants", default=",".join(VARIANTS),
                  help=f"comma list of {list(VARIANTS)}")
  ap.add_argument("--out", default=None, help="write the results as JSON (never overwritten)")
  ap.add_argument("--_measure", action="store_true", help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args._measure:
    print(json.dumps(measure()))
    return {}
  names = [v.strip() for v in args.variants.split(",") if v.strip()]
  unknown = [v for v in names if v not in VARIANTS]
  if unknown:
    ap.error(f"--variants: unknown {unknown}; choose from {list(VARIANTS)}")
  if args.out and os.path.exists(args.out):
    ap.error(f"--out {args.out} exists; choose a new file")
  machine, results = host_record(), {}
  for name in names:
    results[name] = r = _run_variant(name)
    if "error" in r:
      print(f"{name}: failed: {r['error']}", flush=True)
      continue
    a, s = r["alone"], r["in_step"]
    u = r["per_update"]
    print(f"{name}: update {r['update_ms']:.0f} ms ({u['minor_faults']:.0f} page faults, "
          f"{u['system_s']:.3f} s system, {u['user_s']:.3f} s user time per update, "
          f"{u['temp_bytes'] / 2**20:.0f} MiB of temporaries); {s['dots']} [R*T, F] dots, "
          f"median {_fmt(s['median_ms'])} ms, overlapped {_fmt(s['overlap'])}; alone: "
          + ", ".join(f"{k} {v:.2f} ms" for k, v in a.items()), flush=True)
  machine["loadavg_end"] = load_average()
  report = {"command": "python -m scripts.benchmarks.dot_in_step " + " ".join(argv or sys.argv[1:]),
            "machine": machine, "variants": results}
  if args.out:
    with open(args.out, "x") as fh:
      json.dump(report, fh, indent=1)
  return report


if __name__ == "__main__":
  main()
