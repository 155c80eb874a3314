"""Where the GRPO update's time goes: a ``jax.profiler`` trace of ``bench.py train``'s update.

Traces the update part of the step (``rlpost.train.profile``'s split: reference log-probs,
advantages, loss, gradient and AdamW) of ``bench.py train``'s setting, 16 prompts x G=8, 64 new
tokens, the 0.81M-parameter policy, padded, and sums the XLA ops' wall time by kind (YNNPACK
dot fusions, elementwise fusions, plain dots, ...), over both CPU threads. Then times one MLP
kernel dot of the update, [R*T, E] x [E, F], alone in its own jitted program, with its input
and weight gradients, to compare the same kernel in and out of the step.

    python -m scripts.benchmarks.profile_update [--out results/bench/profile_update.txt]
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import re
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp

from rlpost.rollouts import allocate
from rlpost.train import rl
from scripts.benchmarks import train as bench_train
from scripts.benchmarks.common import measure_matmul_peak

SKIP = ("ThunkExecutor", "$", "Pjit", "block_until", "end:", "CommonPjRt", "ParseArguments")


class _Args:
  quick, prompts, group_size, new_tokens, data_dir, pack_buckets = False, 16, 8, 64, None, ""


def _median_ms(fn, *args, repeats=20):
  for _ in range(3):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return statistics.median(times) * 1e3


def profile_update(trainer, calls: int = 3, top: int = 0) -> tuple[dict, dict, float]:
  """(ms of op time per update by op kind, op count per update by kind, update ms); with
  ``top``, the kinds dict also gets a "longest ops" entry: the ``top`` longest single ops as
  (name, ms per update, output shape from the compiled HLO)."""
  state = trainer.init_state()
  p, g = trainer.cfg.num_prompts, trainer.cfg.group_size
  idx = jnp.repeat(jnp.arange(p, dtype=jnp.int32), g)
  key = jax.random.key(0)
  ro = jax.jit(lambda params, k: trainer.sample(params, idx, k))(state.params, key)
  alloc = allocate.Allocation(ro, idx // g, jnp.ones((p * g,), bool), p, {})
  update = jax.jit(lambda st, a: trainer.fns.update(st, a, trainer.ref_params, key, key))
  wall = _median_ms(update, state, alloc, repeats=5)
  out = tempfile.mkdtemp(prefix="rlpost_profile_")
  with jax.profiler.trace(out, create_perfetto_trace=True):
    for _ in range(calls):
      jax.block_until_ready(update(state, alloc))
  (path,) = glob.glob(out + "/**/*.trace.json.gz", recursive=True)
  events = json.load(gzip.open(path))["traceEvents"]
  ms, count, single = collections.Counter(), collections.Counter(), collections.Counter()
  for e in events:
    if e.get("ph") == "X" and not e["name"].startswith(SKIP):
      kind = re.sub(r"[.\d]+$", "", e["name"])
      ms[kind] += e.get("dur", 0) / 1e3 / calls
      count[kind] += 1
      single[e["name"]] += e.get("dur", 0) / 1e3 / calls
  counts = {k: v // calls for k, v in count.items()}
  if not top:
    return dict(ms), counts, wall
  hlo = update.lower(state, alloc).compile().as_text()
  longest = []
  for name, t in single.most_common(top):
    m = re.search(rf"%{re.escape(name)} = (\S+)", hlo)
    longest.append((name, t, m.group(1) if m else "?"))
  return {**ms, "longest ops": longest}, counts, wall


def mlp_dot_alone(rows: int, e: int, f: int) -> dict:
  """ms of x [rows, e] @ w [e, f] alone, and of its input and weight gradients."""
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(k1, (rows, e))
  w = jax.random.normal(k2, (e, f))
  dy = jax.random.normal(k3, (rows, f))
  flop = 2 * rows * e * f
  out = {}
  for name, fn, args in (("forward x @ w", lambda x, w: x @ w, (x, w)),
                         ("input gradient dy @ w.T", lambda dy, w: dy @ w.T, (dy, w)),
                         ("weight gradient x.T @ dy", lambda x, dy: x.T @ dy, (x, dy))):
    ms = _median_ms(jax.jit(fn), *args)
    out[name] = {"ms": ms, "gflops": flop / ms / 1e6}
  return out


def main(argv=None) -> str:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--out", default=None, help="also write the printed report to this file")
  args = ap.parse_args(argv)
  peak = measure_matmul_peak(2048, 8)["gflops_best"]
  trainer = rl.make_train(bench_train._config(_Args, 0.0), log=lambda s: None)
  ms, count, wall = profile_update(trainer, top=8)
  longest = ms.pop("longest ops")
  total = sum(ms.values())
  lines = [f"f32 matmul peak {peak:.1f} GFLOP/s; update {wall:.1f} ms wall (median of 5); "
           f"op time {total:.1f} ms per update, summed over threads",
           "| op kind | ms per update | ops per update | share of op time |",
           "|---|---:|---:|---:|"]
  for kind, v in sorted(ms.items(), key=lambda kv: -kv[1])[:15]:
    lines.append(f"| {kind} | {v:.1f} | {count[kind]} | {v / total:.0%} |")
  lines += ["", "longest single ops (ms per update, output shape):"]
  lines += [f"  {name}: {t:.2f} ms, {shape}" for name, t, shape in longest]
  cfg = trainer.model_cfg
  slots = int(trainer.train_data.prompt_tokens.shape[1]) + trainer.max_new_tokens
  rows = trainer.cfg.num_prompts * trainer.cfg.group_size * slots  # every padded slot
  lines += ["", f"one MLP kernel dot alone, [{rows} x {cfg.hidden_size}] x "
            f"[{cfg.hidden_size} x {cfg.intermediate_size}] (median of 20 jitted calls):"]
  for name, r in mlp_dot_alone(rows, cfg.hidden_size, cfg.intermediate_size).items():
    lines.append(f"  {name}: {r['ms']:.2f} ms, {r['gflops']:.0f} GFLOP/s "
                 f"({r['gflops'] / peak:.0%} of peak)")
  report = "\n".join(lines)
  print(report)
  if args.out:
    with open(args.out, "w") as f:
      f.write(f"python -m scripts.benchmarks.profile_update\n\n{report}\n")
  return report


if __name__ == "__main__":
  main()
