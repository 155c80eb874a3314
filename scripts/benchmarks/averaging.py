"""``bench.py averaging``: peak memory and time of checkpoint averaging vs the number K of checkpoints.

Setup. A Qwen2-style policy (``rlpost.models.transformer``; 10.7M parameters by default, the
sampler benchmark's ``10m`` model; a 20.8k-parameter toy with ``--quick``) is written K_max times
with the library's own writer, ``rlpost.train.checkpoint.Checkpointer``, as a train state
``(params, (adam_count, adam_mu, adam_nu))`` at steps 100, 200, ..., 100 K_max; checkpoint k holds
``theta_0 + 0.01 k delta`` (two random trees), so averages are non-trivial. The meta item declares
the number of parameter leaves, so ``CheckpointSource(dir, keys="auto")`` reads only the
parameters (an orbax partial restore: the Adam moments are never opened), as
``scripts/average.py`` does.

For each K, two ways of computing the uniform mean of the K latest checkpoints (the LAWA plan,
``averaging.plan_lawa(steps, k=K)``) are measured, each in its own fresh Python process:

  streaming  ``averaging.average(src.load, plan)``: one float32 accumulator, checkpoints read and
             folded in one at a time (the library path, and ``scripts/average.py``'s).
  naive      ``trees = [src.load(s) for s in plan.items]`` then
             ``jax.tree.map(lambda *xs: sum(xs) / len(xs), *trees)``: every tree in memory at once,
             the baseline a user without the library would write.

Both read through the same ``CheckpointSource.load`` (which also checks each leaf's CRC-32), so
they differ only in how the mean is accumulated.

Memory. Each measuring process imports the same modules (jax, numpy, orbax, ``rlpost.averaging``,
``rlpost.train.checkpoint``), starts the JAX backend, records ``ru_maxrss`` (``rss_baseline_mb``),
runs one untimed warm-up average and ``--repeats`` timed ones (each result dropped before the
next), records ``ru_maxrss`` again (``rss_peak_mb``), and only then saves the last result for the
parent's equality check (max abs difference of the two methods). ``rss_increment_mb`` = peak -
baseline is what the averaging needed at its high-water mark; an idle process that only imports
and starts the backend gives the reference baseline (``idle_rss_mb``). The measuring process is
started through a bare intermediate interpreter because on Linux ``exec`` carries the exec-ing
process's peak RSS into the new process's ``ru_maxrss``: started directly from this benchmark's
process (which holds the policy) it would report at least that. ``vm_hwm_*`` (the kernel's VmHWM
of the process's own address space) is recorded as a cross-check. ``tree_mb`` is the float32
size of one parameter tree, so ``increment / tree_mb`` reads as "parameter trees resident at the
peak"; about 90 MiB of it is a fixed cost of the first restore and compile (orbax and tensorstore
thread pools and caches, XLA), visible on its own at toy size. ``fit`` gives least-squares lines
in K: the slope is about one tree per checkpoint for naive and about zero for streaming.

Time: wall seconds per average, median of the timed repeats (``first_s``: the warm-up, which
also compiles the accumulate step). On an accelerator ``device_peak_mb`` is the device's own peak
(``memory_stats()["peak_bytes_in_use"]``); on the CPU arrays live in host memory and
``ru_maxrss`` counts them.

  python scripts/bench.py averaging --out avg.json              # K = 2, 4, 8, 16, 32, 10.7M params
  python scripts/bench.py averaging --quick                     # toy model, K = 2, 4 (seconds)
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

# The sampler benchmark's 10m and toy policies (hidden 384 x 6 layers; hidden 32 x 2 layers).
_QWEN2 = {"qkv_bias": True, "tie_embeddings": True, "max_seq_len": 512}
MODELS = {
    "10m": dict(vocab_size=1024, hidden_size=384, num_layers=6, num_heads=6, num_kv_heads=2,
                intermediate_size=1152, **_QWEN2),
    "1m": dict(vocab_size=512, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2,
               intermediate_size=384, **_QWEN2),
    "toy": dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                intermediate_size=64, **_QWEN2),
}
METHODS = ("streaming", "naive")


def add_args(p) -> None:
  p.add_argument("--quick", action="store_true", help="toy model, K = 2, 4, 2 repeats (seconds)")
  p.add_argument("--model", default="10m", choices=sorted(MODELS))
  p.add_argument("--ks", default="2,4,8,16,32", help="numbers of checkpoints to average")
  p.add_argument("--repeats", type=int, default=3, help="timed averages per process (after one untimed warm-up)")
  p.add_argument("--no-opt-state", action="store_true",
                 help="write parameters only (default: also Adam moments, as a train checkpoint)")
  p.add_argument("--workdir", default=None, help="where to write the checkpoints (default: a "
                 "temporary directory, removed afterwards)")
  p.add_argument("--seed", type=int, default=0)


# ------------------------------------------------------------------------------------------
# The measuring process
# ------------------------------------------------------------------------------------------


def _rss_mb() -> float:
  """``ru_maxrss`` of this process in MiB (Linux reports KiB, macOS bytes)."""
  scale = 2 ** 20 if sys.platform == "darwin" else 2 ** 10
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale


def _vm_hwm_mb() -> float | None:
  """The kernel's peak RSS of this process's own address space (VmHWM), in MiB; None off Linux."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) / 1024.0
  except OSError:  # no /proc (not Linux)
    return None
  return None


def child_main(spec: dict) -> dict:
  """Run one measurement in this (fresh) process; see the module docstring.

  Args:
    spec: {"mode": "idle" | "streaming" | "naive", and for the two methods "ckpt_dir", "k",
      "repeats", "out" (an .npz path for the last result)}.

  Returns:
    {"rss_baseline_mb", "vm_hwm_baseline_mb", and for the methods "rss_peak_mb",
    "vm_hwm_peak_mb", "rss_increment_mb", "device_peak_mb", "first_s" (the warm-up),
    "seconds" (the timed repeats), "items" (the averaged steps), "process_s"}.
  """
  t_start = time.perf_counter()
  import jax
  import jax.numpy as jnp  # noqa: F401
  import orbax.checkpoint  # noqa: F401

  from rlpost import averaging as A

  jax.devices()  # backend start-up belongs to the baseline
  out = {"rss_baseline_mb": _rss_mb(), "vm_hwm_baseline_mb": _vm_hwm_mb()}
  if spec["mode"] == "idle":
    return out
  src = A.CheckpointSource(spec["ckpt_dir"], keys="auto")
  plan = A.plan_lawa(src.steps, k=spec["k"])
  result, times = None, []
  for _ in range(spec["repeats"] + 1):
    result = None  # the previous repeat's result does not count towards this one's peak
    t0 = time.perf_counter()
    if spec["mode"] == "streaming":
      result = A.average(src.load, plan)
    elif spec["mode"] == "naive":
      trees = [src.load(s) for s in plan.items]
      result = jax.tree.map(lambda *xs: sum(xs) / len(xs), *trees)
      del trees
    else:
      raise ValueError(f"unknown mode {spec['mode']!r}")
    jax.block_until_ready(result)
    times.append(time.perf_counter() - t0)
  out["rss_peak_mb"] = _rss_mb()
  out["vm_hwm_peak_mb"] = _vm_hwm_mb()
  out["rss_increment_mb"] = out["rss_peak_mb"] - out["rss_baseline_mb"]
  stats = jax.devices()[0].memory_stats()
  out["device_peak_mb"] = (stats["peak_bytes_in_use"] / 2 ** 20
                           if stats and "peak_bytes_in_use" in stats else None)
  out["first_s"], out["seconds"] = times[0], times[1:]
  out["items"] = [int(s) for s in plan.items]
  np.savez(spec["out"], *[np.asarray(x) for x in jax.tree.leaves(result)])
  src.close()
  out["process_s"] = time.perf_counter() - t_start
  return out


_CHILD = ("import json, sys; sys.path.insert(0, {root!r}); "
          "from scripts.benchmarks import averaging; "
          "print('RESULT ' + json.dumps(averaging.child_main(json.loads(sys.argv[1]))))")
# The measuring interpreter is started by a bare one: on Linux, exec copies the peak RSS of the
# exec-ing address space into the new process's ru_maxrss, so a child exec'd straight from this
# (large) process would report at least this process's peak.
_LAUNCHER = "import subprocess, sys; sys.exit(subprocess.run(sys.argv[1:]).returncode)"


def _spawn(spec: dict) -> dict:
  """``child_main(spec)`` in a fresh interpreter; its JSON result."""
  t0 = time.perf_counter()
  child = [sys.executable, "-c", _CHILD.format(root=str(ROOT)), json.dumps(spec)]
  proc = subprocess.run([sys.executable, "-c", _LAUNCHER, *child], cwd=ROOT,
                        capture_output=True, text=True, check=False)
  if proc.returncode != 0:
    raise RuntimeError(f"averaging measurement {spec['mode']} failed ({proc.returncode}):\n"
                       f"{proc.stderr[-4000:]}")
  lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
  out = json.loads(lines[-1][len("RESULT "):])
  out["wall_with_startup_s"] = time.perf_counter() - t0
  return out


# ------------------------------------------------------------------------------------------
# Checkpoints
# ------------------------------------------------------------------------------------------


def write_checkpoints(directory: str, model: dict, count: int, *, opt_state: bool,
                      seed: int) -> dict:
  """Write ``count`` train-state checkpoints of a policy with ``Checkpointer`` (module docstring).

  Returns:
    {"params", "leaves", "tree_mb", "checkpoint_mb" (on disk, per checkpoint), "write_s"}.
  """
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from rlpost.models import transformer as tfm
  from rlpost.train.checkpoint import Checkpointer

  cfg = tfm.TransformerConfig(**model)
  params = nnx.state(tfm.init_model(cfg, seed=seed))
  leaves = jax.tree.leaves(params)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  delta = jax.tree.unflatten(jax.tree.structure(params),
                             [jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)])

  @jax.jit
  def state_at(c):
    p = jax.tree.map(lambda t, d: t + c * d, params, delta)
    if not opt_state:
      return (p,)
    mu = jax.tree.map(lambda d: 0.1 * c * d, delta)
    nu = jax.tree.map(lambda d: 1e-3 * d * d, delta)
    return (p, (jnp.asarray(100 * c, jnp.int32), mu, nu))

  t0 = time.perf_counter()
  ckpt = Checkpointer(directory, keep_last=count, async_save=False)
  for k in range(1, count + 1):
    ckpt.save(100 * k, state_at(jnp.float32(0.01 * k)), {"param_leaves": len(leaves)})
  ckpt.close()
  write_s = time.perf_counter() - t0
  disk = sum(f.stat().st_size for f in Path(directory).rglob("*") if f.is_file())
  return {"params": int(sum(x.size for x in leaves)), "config_params": cfg.num_params(),
          "leaves": len(leaves), "tree_mb": sum(x.nbytes for x in leaves) / 2 ** 20,
          "checkpoint_mb": disk / count / 2 ** 20, "write_s": write_s}


def _max_diff(a_path: str, b_path: str) -> tuple[float, float]:
  """(max |a - b|, max |a - b| / max |b|) over all leaves of two saved results."""
  with np.load(a_path) as a, np.load(b_path) as b:
    if sorted(a.files) != sorted(b.files):
      raise RuntimeError("the two averages have different numbers of leaves")
    diff = max(float(np.max(np.abs(a[f] - b[f]), initial=0.0)) for f in a.files)
    scale = max(float(np.max(np.abs(b[f]), initial=0.0)) for f in b.files)
  return diff, diff / max(scale, 1e-30)


# ------------------------------------------------------------------------------------------
# Benchmark
# ------------------------------------------------------------------------------------------


def _summary(out: dict, tree_mb: float) -> dict:
  times = out["seconds"]
  return dict(out, median_s=statistics.median(times), min_s=min(times), max_s=max(times),
              trees_at_peak=out["rss_increment_mb"] / tree_mb)


def run(args) -> dict:
  if args.quick:
    model_name, ks, repeats = "toy", [2, 4], 2
  else:
    model_name, repeats = args.model, args.repeats
    ks = sorted({int(k) for k in args.ks.split(",")})
  if min(ks) < 1 or repeats < 1:
    raise ValueError("--ks must be positive and --repeats at least 1")
  opt_state = not args.no_opt_state
  workdir = args.workdir or tempfile.mkdtemp(prefix="rlpost_bench_avg_")
  ckpt_dir = os.path.join(workdir, "checkpoints")
  try:
    info = write_checkpoints(ckpt_dir, MODELS[model_name], max(ks), opt_state=opt_state,
                             seed=args.seed)
    print(f"wrote {max(ks)} checkpoints of a {info['params']:,}-parameter policy "
          f"({info['tree_mb']:.1f} MiB of float32 parameters, {info['checkpoint_mb']:.1f} MiB "
          f"per checkpoint on disk) in {info['write_s']:.1f} s", flush=True)
    idle = _spawn({"mode": "idle"})
    print(f"idle process after imports: {idle['rss_baseline_mb']:.0f} MiB", flush=True)
    rows = []
    for k in ks:
      row = {"k": k}
      for method in METHODS:
        out = os.path.join(workdir, f"{method}-{k}.npz")
        res = _spawn({"mode": method, "ckpt_dir": ckpt_dir, "k": k, "repeats": repeats,
                      "out": out})
        row[method] = _summary(res, info["tree_mb"])
      if row["streaming"]["items"] != row["naive"]["items"]:
        raise RuntimeError("the two methods averaged different checkpoints")
      row["items"] = row["streaming"]["items"]
      row["max_abs_diff"], row["max_rel_diff"] = _max_diff(
          os.path.join(workdir, f"streaming-{k}.npz"), os.path.join(workdir, f"naive-{k}.npz"))
      row["time_ratio"] = row["naive"]["median_s"] / row["streaming"]["median_s"]
      row["memory_ratio"] = (row["naive"]["rss_increment_mb"] /
                             max(row["streaming"]["rss_increment_mb"], 1e-9))
      rows.append(row)
      print(f"K={k}: streaming {row['streaming']['median_s'] * 1e3:.1f} ms, "
            f"+{row['streaming']['rss_increment_mb']:.1f} MiB; naive "
            f"{row['naive']['median_s'] * 1e3:.1f} ms, +{row['naive']['rss_increment_mb']:.1f} "
            f"MiB; max |diff| {row['max_abs_diff']:.2e}", flush=True)
  finally:
    if not args.workdir:
      shutil.rmtree(workdir, ignore_errors=True)
  fit = fit_in_k(rows, info["tree_mb"])
  print()
  print(format_table(rows, info, idle, fit))
  return {"benchmark": "averaging",
          "settings": {"quick": bool(args.quick), "model": model_name,
                       "model_config": MODELS[model_name], **info, "ks": ks,
                       "repeats": repeats, "opt_state": opt_state,
                       "plan": "lawa: uniform mean of the K latest checkpoints",
                       "loader": "CheckpointSource(keys='auto').load (parameters only)",
                       "methods": {"streaming": "rlpost.averaging.average(src.load, plan)",
                                   "naive": "jax.tree.map(lambda *xs: sum(xs) / len(xs), "
                                            "*[src.load(s) for s in plan.items])"},
                       "memory": "ru_maxrss of a fresh process per (method, K): peak after "
                                 "the repeats minus the value right after imports",
                       "timer": "time.perf_counter per average, median of the repeats",
                       "jax_backend": _backend()},
          "idle_rss_mb": idle["rss_baseline_mb"],
          "fit": fit,
          "results": rows}


def fit_in_k(rows: list[dict], tree_mb: float) -> dict:
  """Per method, least-squares lines of the memory increment and the time against K.

  Returns {method: {"mib_per_checkpoint", "trees_per_checkpoint", "intercept_mib",
  "s_per_checkpoint", "intercept_s"}} (slopes are None with fewer than two values of K).
  """
  ks = np.asarray([r["k"] for r in rows], np.float64)
  out = {}
  for method in METHODS:
    mem = np.asarray([r[method]["rss_increment_mb"] for r in rows])
    sec = np.asarray([r[method]["median_s"] for r in rows])
    if len(ks) < 2:
      out[method] = {"mib_per_checkpoint": None, "trees_per_checkpoint": None,
                     "intercept_mib": float(mem[0]), "s_per_checkpoint": None,
                     "intercept_s": float(sec[0])}
      continue
    (m_slope, m_icpt), (s_slope, s_icpt) = np.polyfit(ks, mem, 1), np.polyfit(ks, sec, 1)
    out[method] = {"mib_per_checkpoint": float(m_slope),
                   "trees_per_checkpoint": float(m_slope / tree_mb),
                   "intercept_mib": float(m_icpt), "s_per_checkpoint": float(s_slope),
                   "intercept_s": float(s_icpt)}
  return out


def _backend() -> str:
  import jax

  return jax.default_backend()


def format_table(rows: list[dict], info: dict, idle: dict, fit: dict) -> str:
  lines = [(f"policy: {info['params']:,} parameters in {info['leaves']} leaves "
            f"({info['tree_mb']:.1f} MiB float32 per tree); idle process after imports "
            f"{idle['rss_baseline_mb']:.0f} MiB RSS"),
           "",
           ("| K | streaming ms | naive ms | naive / streaming | streaming peak MiB (+incr) | "
            "naive peak MiB (+incr) | trees at peak (stream / naive) | max abs diff |"),
           "|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    s, n = r["streaming"], r["naive"]
    lines.append(
        f"| {r['k']} | {s['median_s'] * 1e3:,.1f} | {n['median_s'] * 1e3:,.1f} | "
        f"{r['time_ratio']:.2f}x | {s['rss_peak_mb']:,.0f} (+{s['rss_increment_mb']:,.1f}) | "
        f"{n['rss_peak_mb']:,.0f} (+{n['rss_increment_mb']:,.1f}) | "
        f"{s['trees_at_peak']:.1f} / {n['trees_at_peak']:.1f} | {r['max_abs_diff']:.1e} |")
  lines.append("(ms: median wall time of one average; +incr: ru_maxrss peak minus the same "
               "process's RSS after imports; trees at peak = incr / one float32 tree)")
  if fit["streaming"]["mib_per_checkpoint"] is not None:
    lines.append("linear fit in K: " + "; ".join(
        f"{m} {f['mib_per_checkpoint']:+.1f} MiB ({f['trees_per_checkpoint']:+.2f} trees) and "
        f"{f['s_per_checkpoint'] * 1e3:.0f} ms per checkpoint" for m, f in fit.items()))
  return "\n".join(lines)
