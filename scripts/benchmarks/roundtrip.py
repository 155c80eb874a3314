"""``bench.py roundtrip``: cost of the round trip at depth i relative to a forward rollout of depth i.

The stepper is the round-trip experiment's model for one system (``experiments/roundtrip/
config.py``, ``full_config()``; ``--quick``: ``quick_config()``'s toy model), randomly initialised
(timing does not depend on training), with the experiment's deterministic sampler (Euler from zero
noise, ``sampler_steps`` flow sub-steps per physical step) and identity normalisation. Start states
are standard-normal fields on the system's grid, ``--batch`` of them. Defaults: ``kdv1d``, the
109k-parameter 1D field model on 64 points, 4 Euler sub-steps, batch 64 (the experiment rolls out
256 test starts at once; pass ``--batch 256`` for that, about 4x slower), depths 1, 2, 4, 8, 16.

Per depth i, in one process, compiled once per (function, depth) before timing:

  forward   ``rollout(stepper, x0, +1, i)``: i physical steps, the states decoded.
  round     ``round_trip(stepper, x0, (i,))``: forward i steps, backward i steps from the end, and
            C_i (latent, field and per-field relative L2 of the return to x0).
  all       ``round_trip(stepper, x0, i)``: C_j at every depth j = 1..i in one pass (the library
            rolls forward once to i, then backward j steps from each forward state j).

Each repeat times the three back to back (the order reversed on every other repeat) with
``time.perf_counter`` around the call and ``jax.block_until_ready``; the table gives medians.
``ratio`` = round / forward (the physical-step count alone predicts 2: the backward leg is as long
as the forward one, and C_i is a few reductions). ``separate`` is what C at every depth 1..i
would cost as i separate round trips, sum_{j=1..i} round(j); depths j that were not measured
take the value linearly interpolated between the measured neighbours (``separate_estimated``
says when). ``all / separate`` below 1 means the one-pass form is cheaper; its step-count
prediction is (i + i (i + 1) / 2) / (i (i + 1)), i.e. 1 at i = 1 and towards 1/2 for large i.
The line under the table compares, the same way, ``round_trip(x0, depths)`` for the whole measured
depth set (what the experiment runs) with the sum of the single-depth round trips.

Compilations: a listener on JAX's backend-compile event (``jax.monitoring``) counts XLA
compilations during the warm-up and during the timed repeats (expected: 0), and
``rollout.TRACE_COUNTS`` counts traces of the jitted rollout entry points (one per function and
depth).

  python scripts/bench.py roundtrip --out rt.json
  python scripts/bench.py roundtrip --system ns2d --batch 16 --depths 1,2,4,8
  python scripts/bench.py roundtrip --quick
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import ClassVar

import numpy as np

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
VARIANTS = ("forward", "round", "all")


def add_args(p) -> None:
  p.add_argument("--quick", action="store_true",
                 help="the experiment's toy model, batch 4, depths 1, 2, 3 repeats (seconds)")
  p.add_argument("--system", default="kdv1d", help="a system of the round-trip experiment: "
                 "kdv1d, ks1d (1D, 64 points) or ns2d (2D, 32 x 32)")
  p.add_argument("--batch", type=int, default=64, help="start states rolled out at once")
  p.add_argument("--depths", default="1,2,4,8,16")
  p.add_argument("--repeats", type=int, default=5, help="timed calls per variant and depth")
  p.add_argument("--seed", type=int, default=0)


class CompileCounter:
  """Counts XLA backend compilations (and their seconds) while ``active``.

  One listener is registered per process, the first time a counter is made; it feeds every
  counter that is active.
  """

  _active: ClassVar[list] = []
  _registered: ClassVar[bool] = False

  def __init__(self):
    import jax

    self.count, self.seconds = 0, 0.0
    if not CompileCounter._registered:
      jax.monitoring.register_event_duration_secs_listener(CompileCounter._listen)
      CompileCounter._registered = True

  @staticmethod
  def _listen(event: str, duration: float, **_) -> None:
    if event == BACKEND_COMPILE_EVENT:
      for c in CompileCounter._active:
        c.count += 1
        c.seconds += duration

  def __enter__(self):
    CompileCounter._active.append(self)
    return self

  def __exit__(self, *exc):
    CompileCounter._active.remove(self)


def _plan(system: str, quick: bool):
  from experiments.roundtrip import config as cfg_lib

  config = cfg_lib.quick_config() if quick else cfg_lib.full_config()
  try:
    return config.plan(system)
  except KeyError:
    raise ValueError(f"unknown system {system!r}; the round-trip experiment has "
                     f"{[p.name for p in config.plans]}") from None


def _separate(i: int, measured: dict[int, float]) -> tuple[float, bool]:
  """sum_{j=1..i} round(j) from the measured depths; (sum, whether any term was estimated).

  Unmeasured j between two measured depths are interpolated linearly; j below the smallest
  measured depth are extrapolated from the two smallest (or scaled by j / depth from one).
  """
  ds = sorted(measured)
  ys = [measured[d] for d in ds]
  js = np.arange(1, i + 1, dtype=np.float64)
  values = np.interp(js, ds, ys)
  below = js < ds[0]
  if below.any():
    if len(ds) >= 2:
      slope = (ys[1] - ys[0]) / (ds[1] - ds[0])
      values[below] = np.maximum(ys[0] + slope * (js[below] - ds[0]), 0.0)
    else:
      values[below] = ys[0] * js[below] / ds[0]
  return float(values.sum()), any(int(j) not in measured for j in js)


def run(args) -> dict:
  import jax
  from flax import nnx

  from rlpost.dynamics import model as mdl
  from rlpost.dynamics import rollout as rollout_lib
  from rlpost.dynamics import systems

  if args.quick:
    batch, depths, repeats = 4, [1, 2], 3
  else:
    batch, repeats = args.batch, args.repeats
    depths = sorted({int(d) for d in args.depths.split(",")})
  if batch < 1 or repeats < 1 or min(depths) < 1:
    raise ValueError("--batch, --repeats and --depths must be positive")
  plan = _plan(args.system, args.quick)
  model_cfg, sampler = plan.train.model, plan.deterministic_sampler()
  grid = tuple(systems.get_system(plan.name).spatial_shape)
  graphdef, params = nnx.split(mdl.init_model(model_cfg, jax.random.key(args.seed)))
  stepper = rollout_lib.make_stepper(graphdef, params, mdl.identity_stats(model_cfg), sampler)
  x0 = jax.random.normal(jax.random.key(args.seed + 1), (batch, *grid, model_cfg.num_fields))
  key = jax.random.key(args.seed + 2)
  n_params = mdl.num_params(params)

  calls = {
      "forward": lambda d: rollout_lib.rollout(stepper, x0, +1, d, key, validate=False),
      "round": lambda d: rollout_lib.round_trip(stepper, x0, (d,), key, validate=False),
      "all": lambda d: rollout_lib.round_trip(stepper, x0, d, key, validate=False),
  }

  def set_call():
    return rollout_lib.round_trip(stepper, x0, tuple(depths), key, validate=False)

  traces_before = dict(rollout_lib.TRACE_COUNTS)

  # Warm-up: compile every (variant, depth) once; record compile + first-run seconds.
  compile_s = {v: {} for v in VARIANTS}
  with CompileCounter() as warm:
    for d in depths:
      for v in VARIANTS:
        t0 = time.perf_counter()
        out = jax.block_until_ready(calls[v](d))
        compile_s[v][d] = time.perf_counter() - t0
        if not all(bool(np.all(np.isfinite(np.asarray(x)))) for x in jax.tree.leaves(out)):
          raise RuntimeError(f"{v} rollout of depth {d} produced non-finite values")
    t0 = time.perf_counter()
    jax.block_until_ready(set_call())
    set_compile_s = time.perf_counter() - t0
  traces = {k: v - traces_before.get(k, 0) for k, v in rollout_lib.TRACE_COUNTS.items()
            if v - traces_before.get(k, 0)}

  times = {v: {d: [] for d in depths} for v in VARIANTS}
  set_times = []
  with CompileCounter() as timed:
    for r in range(repeats):
      order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
      for d in depths:
        for v in order:
          t0 = time.perf_counter()
          jax.block_until_ready(calls[v](d))
          times[v][d].append(time.perf_counter() - t0)
      t0 = time.perf_counter()
      jax.block_until_ready(set_call())
      set_times.append(time.perf_counter() - t0)

  med = {v: {d: statistics.median(times[v][d]) for d in depths} for v in VARIANTS}
  rows = []
  for d in depths:
    sep, estimated = _separate(d, med["round"])
    row = {"depth": d, "steps": {"forward": d, "round": 2 * d, "all": d + d * (d + 1) // 2,
                                 "separate": d * (d + 1)}}
    for v in VARIANTS:
      ts = times[v][d]
      row[v] = {"median_s": med[v][d], "min_s": min(ts), "max_s": max(ts), "seconds": ts,
                "compile_s": compile_s[v][d]}
    row["ratio"] = med["round"][d] / med["forward"][d]
    row["separate_s"], row["separate_estimated"] = sep, estimated
    row["all_vs_separate"] = med["all"][d] / sep
    row["all_vs_separate_steps"] = row["steps"]["all"] / row["steps"]["separate"]
    rows.append(row)
  set_sep = sum(med["round"][d] for d in depths)
  depth_set = {"depths": depths, "median_s": statistics.median(set_times), "seconds": set_times,
               "compile_s": set_compile_s, "separate_s": set_sep,
               "steps": max(depths) + sum(depths), "separate_steps": 2 * sum(depths)}
  depth_set["one_pass_vs_separate"] = depth_set["median_s"] / set_sep
  compilations = {"warmup": warm.count, "warmup_compile_s": warm.seconds,
                  "timed": timed.count, "traces": traces,
                  "jit_cache_sizes": {n: f._cache_size() for n, f in
                                      (("rollout", rollout_lib._rollout_jit),
                                       ("round_trip", rollout_lib._round_trip_jit))
                                      if hasattr(f, "_cache_size")}}
  settings = {
      "quick": bool(args.quick), "system": plan.name, "grid": list(grid),
      "num_fields": model_cfg.num_fields, "batch": batch, "depths": depths,
      "repeats": repeats, "params": n_params, "model": dataclasses.asdict(model_cfg),
      "sampler": dataclasses.asdict(sampler),
      "network_calls_per_step": sampler.num_steps * (2 if sampler.method == "heun" else 1),
      "init": f"random (seed {args.seed}), identity normalisation",
      "x0": "standard normal fields [batch, *grid, num_fields], float32",
      "timer": "time.perf_counter + block_until_ready, median of the repeats, variants "
               "alternating (order reversed every other repeat) after one warm-up call each",
      "jax_backend": jax.default_backend()}
  print(format_table(rows, settings, depth_set, compilations))
  return {"benchmark": "roundtrip", "settings": settings, "results": rows,
          "depth_set": depth_set, "compilations": compilations}


def format_table(rows: list[dict], settings: dict, depth_set: dict, comp: dict) -> str:
  lines = [(f"{settings['system']}: {settings['params']:,}-parameter model, grid "
            f"{'x'.join(map(str, settings['grid']))}, batch {settings['batch']}, "
            f"{settings['sampler']['num_steps']} {settings['sampler']['method']} sub-steps per "
            f"physical step; median of {settings['repeats']} ({settings['jax_backend']})"),
           "",
           ("| depth i | forward ms | round trip ms | round / forward | all 1..i ms | "
            "separate 1..i ms | all / separate (steps) |"),
           "|---:|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    sep = f"{r['separate_s'] * 1e3:,.1f}{'*' if r['separate_estimated'] else ''}"
    lines.append(
        f"| {r['depth']} | {r['forward']['median_s'] * 1e3:,.1f} | "
        f"{r['round']['median_s'] * 1e3:,.1f} | {r['ratio']:.2f}x | "
        f"{r['all']['median_s'] * 1e3:,.1f} | {sep} | {r['all_vs_separate']:.2f} "
        f"({r['all_vs_separate_steps']:.2f}) |")
  lines.append("(* interpolated between measured depths; (steps): the physical-step count's "
               "prediction)")
  lines.append(
      f"depth set {tuple(depth_set['depths'])} in one round_trip call: "
      f"{depth_set['median_s'] * 1e3:,.1f} ms vs {depth_set['separate_s'] * 1e3:,.1f} ms as "
      f"separate round trips ({depth_set['one_pass_vs_separate']:.2f}; steps "
      f"{depth_set['steps']} vs {depth_set['separate_steps']})")
  lines.append(f"compilations: {comp['warmup']} during warm-up ({comp['warmup_compile_s']:.1f} s "
               f"of XLA), {comp['timed']} during the timed repeats; traces {comp['traces']}")
  return "\n".join(lines)
