"""rlpost benchmarks. One subcommand per benchmark; each prints a table and writes JSON.

  python scripts/bench.py sampler --out results.json    # decode throughput vs transformers
  python scripts/bench.py sampler --quick --out q.json  # toy size, seconds (used by the tests)
  python scripts/bench.py ablate --out ablate.json      # each sampler optimisation switched off
  python scripts/bench.py train --out train.json        # one GRPO step vs TRL GRPOTrainer
  python scripts/bench.py scaling --out scaling.json    # step time vs batch, length, model size
  python scripts/bench.py averaging --out avg.json      # checkpoint averaging: memory, time vs K
  python scripts/bench.py roundtrip --out rt.json       # diffusion round trip vs forward rollout
  python scripts/bench.py lora --out lora.json          # LoRA vs full fine-tuning: memory, time
  python scripts/bench.py seeds --out seeds.json        # K seeds vmapped in one program vs one
  python scripts/bench.py packing --out packing.json    # padded vs packed update vs padding
  python scripts/bench.py layers --out layers.json      # layers stored stacked vs one by one

Every subcommand takes ``--quick`` (toy size, seconds; the test suite runs each). The
subcommands other than ``sampler`` and ``ablate`` live in ``scripts/benchmarks/`` (their module
docstrings say what they measure).

``sampler``: greedy decode tokens/s of the jitted KV-cache sampler (``rlpost.sampling``) for a
~1M- and a ~10M-parameter Qwen2-style model at several batch sizes (prompt 32, exactly 128 new
tokens, no stop token), against Hugging Face ``transformers`` ``generate`` on the SAME weights
(exported with ``rlpost.models.hf.save_pretrained``, loaded with ``AutoModelForCausalLM``) when
torch and transformers are installed. The two run alternately, ``--repeats`` times each, in one
process; the table gives medians and the min-max spread. It also reports the achieved FLOP/s
of generation (prefill + decode, the work one ``generate`` call does) as a fraction of this
machine's f32 matmul peak, measured in the same run. Per row::

  FLOPs = 2 * P_layers * (Tp + N - 1) + 2 * E * V * N
        + 4 * L * H * D * (sum_{t=1..Tp} t + sum_{j=1..N-1} (Tp + j))

with Tp the prompt length, N new tokens, P_layers the per-layer matmul weights (q/k/v/o and
the three MLP kernels; biases, norms and the embedding lookup excluded) over L layers, E x V the
LM head (tied or not), H query heads and D head dim. The model runs on Tp prompt tokens and
then N - 1 fed-back tokens; the LM head runs once per new token; a token attends over every key
up to itself (q.k and p.v, 2 FLOPs per multiply-add each).

The same command runs on a GPU or TPU host (JAX picks the accelerator; the transformers
baseline stays on the CPU unless ``--torch-device`` says otherwise).

Adding a benchmark: write ``add_<name>_args(parser)`` and ``run_<name>(args) -> dict`` and
register them in ``COMMANDS``; ``main`` handles ``--out`` and the machine description.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
  sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from rlpost import sampling  # noqa: E402
from rlpost.cli import run_main  # noqa: E402
from rlpost.models import transformer as tfm  # noqa: E402
from scripts.benchmarks import averaging as bench_averaging  # noqa: E402
from scripts.benchmarks import layers as bench_layers  # noqa: E402
from scripts.benchmarks import lora as bench_lora  # noqa: E402
from scripts.benchmarks import packing as bench_packing  # noqa: E402
from scripts.benchmarks.common import (  # noqa: E402
    MODELS, generation_flops, host_record, layer_matmul_params, load_average,
    measure_matmul_peak)
from scripts.benchmarks import roundtrip as bench_roundtrip  # noqa: E402
from scripts.benchmarks import scaling as bench_scaling  # noqa: E402
from scripts.benchmarks import seeds as bench_seeds  # noqa: E402
from scripts.benchmarks import train as bench_train  # noqa: E402

FLOP_FORMULA = ("FLOPs per row = 2*P_layers*(Tp+N-1) + 2*E*V*N + 4*L*H*D*(sum_{t=1..Tp} t + "
                "sum_{j=1..N-1} (Tp+j)); P_layers = q/k/v/o + MLP kernels of all layers "
                "(no biases, norms, embedding lookup); E*V = LM head (tied or not)")

# ------------------------------------------------------------------------------------------
# Machine
# ------------------------------------------------------------------------------------------


def machine_info() -> dict:
  info = {
      **host_record(),
      "platform": platform.platform(),
      "python": platform.python_version(),
      "jax": jax.__version__,
      "jax_backend": jax.default_backend(),
      "jax_devices": [str(d) for d in jax.devices()],
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
  }
  for mod in ("flax", "torch", "transformers"):
    try:
      info[mod] = __import__(mod).__version__
    except ImportError:
      info[mod] = None
  return info


# ------------------------------------------------------------------------------------------
# sampler
# ------------------------------------------------------------------------------------------


def add_sampler_args(p: argparse.ArgumentParser) -> None:
  p.add_argument("--quick", action="store_true",
                 help="toy model, batches 1,4, prompt 8, 8 new tokens, 2 repeats (seconds)")
  p.add_argument("--models", default="1m,10m", help=f"comma list of {sorted(MODELS)}")
  p.add_argument("--batches", default="1,16,64,256")
  p.add_argument("--prompt-len", type=int, default=32)
  p.add_argument("--new-tokens", type=int, default=128)
  p.add_argument("--repeats", type=int, default=5, help="timed runs per side and setting")
  p.add_argument("--max-seconds", type=float, default=60.0,
                 help="stop repeating a setting after this many seconds (at least 2 repeats)")
  p.add_argument("--no-transformers", action="store_true", help="skip the baseline (any --peer)")
  p.add_argument("--peer", choices=("transformers", "tunix"), default="transformers",
                 help="the baseline on the same weights: transformers generate (the oracle "
                      "extra) or Tunix's sampler (the peers extra, its own environment)")
  p.add_argument("--torch-threads", default="cores,1",
                 help="comma list of torch.set_num_threads candidates ('cores' = os.cpu_count()); "
                      "per model, the fastest on a short calibration run is the baseline")
  p.add_argument("--torch-device", default="cpu")
  p.add_argument("--seed", type=int, default=0)


class _Transformers:
  """transformers generate on an exported copy of an rlpost model (greedy, exactly N tokens)."""

  def __init__(self, model: tfm.Transformer, workdir: str, device: str):
    import torch
    import transformers

    from rlpost.models import hf

    transformers.utils.logging.disable_progress_bar()
    self.torch = torch
    path = hf.save_pretrained(model, Path(workdir) / "hf", architecture="qwen2", overwrite=True)
    self.model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32).to(device).eval()
    self.device = device
    self.attn_implementation = getattr(self.model.config, "_attn_implementation", None)

  def generate(self, tokens: np.ndarray, new_tokens: int) -> np.ndarray:
    torch = self.torch
    ids = torch.as_tensor(tokens, dtype=torch.long, device=self.device)
    with torch.inference_mode():
      out = self.model.generate(
          input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
          max_new_tokens=new_tokens, min_new_tokens=new_tokens, eos_token_id=None,
          pad_token_id=0, use_cache=True)
    if self.device != "cpu":
      torch.cuda.synchronize()
    out = out[:, tokens.shape[1]:].cpu().numpy()
    if out.shape[1] != new_tokens:
      raise RuntimeError(f"transformers generated {out.shape[1]} tokens, expected {new_tokens}")
    return out


def _calibrate_threads(hf_model: _Transformers, candidates: list[int], cfg, prompt_len: int,
                       batches: list[int], new_tokens: int, seed: int):
  """The fastest torch thread count for this model: 3 alternating short generate runs each.

  On a machine shared with other jobs, torch with as many threads as cores can run many times
  slower than with one (OpenMP threads spin-wait on descheduled peers); the baseline should be
  transformers at its best, so the count is measured rather than assumed.
  """
  batch = min(max(batches), 16)
  n = min(new_tokens, 32)
  tokens = np.random.default_rng(seed).integers(1, cfg.vocab_size, (batch, prompt_len))
  times = {t: [] for t in candidates}
  for _ in range(3):
    for t in candidates:
      hf_model.torch.set_num_threads(t)
      t0 = time.perf_counter()
      hf_model.generate(tokens.astype(np.int32), n)
      times[t].append(time.perf_counter() - t0)
  tps = {t: batch * n / statistics.median(ts) for t, ts in times.items()}
  return max(tps, key=tps.get), {str(t): round(v, 1) for t, v in tps.items()}


def _summary(times: list[float], tokens: int) -> dict:
  tps = [tokens / t for t in times]
  med = statistics.median(tps)
  return {"tokens_per_s": med, "tokens_per_s_min": min(tps), "tokens_per_s_max": max(tps),
          "spread": (max(tps) - min(tps)) / med, "seconds": times}


def run_sampler(args) -> dict:
  if args.quick:
    models, batches = ["toy"], [1, 4]
    prompt_len, new_tokens, repeats = 8, 8, 2
  else:
    models = args.models.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    prompt_len, new_tokens, repeats = args.prompt_len, args.new_tokens, args.repeats
  for m in models:
    if m not in MODELS:
      raise ValueError(f"unknown model {m!r}; choose from {sorted(MODELS)}")

  baseline = None
  if args.no_transformers:
    baseline = None  # rlpost alone
  elif args.peer == "tunix":
    from scripts.benchmarks import tunix_peer
    if tunix_peer.available():
      baseline = {"peer": "tunix"}
    else:
      print("Tunix baseline skipped: google-tunix is not installed (the peers extra)", flush=True)
  else:
    try:
      import torch  # noqa: F401
      import transformers  # noqa: F401
      threads = []
      for t in args.torch_threads.split(","):
        t = os.cpu_count() if t == "cores" else int(t)
        if t not in threads:
          threads.append(t)
      baseline = {"peer": "transformers", "torch_threads": threads, "device": args.torch_device}
    except ImportError as e:
      baseline = None
      print(f"transformers baseline skipped: {e}", flush=True)
  peer = baseline["peer"] if baseline else args.peer

  peak_before = measure_matmul_peak(512 if args.quick else 2048, 3 if args.quick else 8)
  print(f"f32 matmul peak: {peak_before['gflops_best']:.1f} GFLOP/s "
        f"(best of {peak_before['repeats']}, n={peak_before['n']})", flush=True)

  rows = []
  workdir = tempfile.mkdtemp(prefix="rlpost_bench_")
  for name in models:
    cfg = MODELS[name]
    model = tfm.init_model(cfg, seed=args.seed)
    params = nnx.state(model)
    hf_model = tunix_model = None
    if baseline and peer == "tunix":
      tunix_model = tunix_peer.TunixSampler(model, workdir, prompt_len, new_tokens)
      baseline.update(version=tunix_model.version)
      baseline.setdefault("model_configs", {})[name] = tunix_peer.describe(cfg)["model"]
    elif baseline:
      hf_model = _Transformers(model, workdir, args.torch_device)
      baseline["attn_implementation"] = hf_model.attn_implementation
      threads, calib = _calibrate_threads(hf_model, baseline["torch_threads"], cfg, prompt_len,
                                          batches, new_tokens, args.seed)
      baseline.setdefault("calibration", {})[name] = calib
      print(f"{name}: transformers with torch.set_num_threads({threads}) "
            f"(calibration tokens/s by threads: {calib})", flush=True)
      hf_model.torch.set_num_threads(threads)
    other = hf_model or tunix_model
    scfg = sampling.SamplingConfig(max_new_tokens=new_tokens, temperature=0.0)
    sampler = sampling.Sampler(model, scfg)
    for batch in batches:
      rng = np.random.default_rng(args.seed + batch)
      tokens = rng.integers(1, cfg.vocab_size, size=(batch, prompt_len)).astype(np.int32)
      mask = np.ones_like(tokens, dtype=bool)
      key = jax.random.key(args.seed)
      t0 = time.perf_counter()
      out = jax.block_until_ready(sampler(params, tokens, mask, key))
      compile_s = time.perf_counter() - t0
      ours = np.asarray(out.tokens)
      if int(np.asarray(out.lengths).min()) != new_tokens:
        raise RuntimeError("rlpost sampler stopped early")
      theirs = other.generate(tokens, new_tokens) if other else None  # warm-up
      t_ours, t_theirs, faults, system_s = [], [], 0, 0.0
      start = time.perf_counter()
      for r in range(repeats):
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        jax.block_until_ready(sampler(params, tokens, mask, key, validate=False))
        t_ours.append(time.perf_counter() - t0)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        faults += r1.ru_minflt - r0.ru_minflt
        system_s += r1.ru_stime - r0.ru_stime
        if other:
          t0 = time.perf_counter()
          other.generate(tokens, new_tokens)
          t_theirs.append(time.perf_counter() - t0)
        if r >= 1 and time.perf_counter() - start > args.max_seconds:
          break
      n_tok = batch * new_tokens
      row = {"model": name, "params": cfg.num_params(),
             "layer_matmul_params": layer_matmul_params(cfg),
             "batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens,
             "repeats": len(t_ours), "compile_s": compile_s,
             "baseline": peer, "rlpost": _summary(t_ours, n_tok)}
      flops = generation_flops(cfg, batch, prompt_len, new_tokens)
      row["gflop"] = flops / 1e9
      row["rlpost"]["gflops"] = flops / statistics.median(t_ours) / 1e9
      # Kernel work per call (the process's, all threads): minor page faults and system seconds.
      row["rlpost"]["minor_faults_per_call"] = faults / len(t_ours)
      row["rlpost"]["system_s_per_call"] = system_s / len(t_ours)
      if other:
        row[peer] = _summary(t_theirs, n_tok)
        if hf_model:
          row[peer]["torch_threads"] = hf_model.torch.get_num_threads()
        row[peer]["gflops"] = flops / statistics.median(t_theirs) / 1e9
        row["ratio"] = row["rlpost"]["tokens_per_s"] / row[peer]["tokens_per_s"]
        # Same greedy decisions up to float rounding: near-ties may flip and then diverge.
        row["token_agreement"] = float(np.mean(ours == theirs))
        row["first_token_agreement"] = float(np.mean(ours[:, 0] == theirs[:, 0]))
      else:
        row[peer] = None
        row["ratio"] = None
      rows.append(row)
      _print_row(row, peak_before["gflops_best"], header=len(rows) == 1)

  peak_after = measure_matmul_peak(512 if args.quick else 2048, 3 if args.quick else 8)
  peak = max(peak_before["gflops_best"], peak_after["gflops_best"])
  for row in rows:
    row["roofline_fraction"] = row["rlpost"]["gflops"] / peak
  print(f"f32 matmul peak after: {peak_after['gflops_best']:.1f} GFLOP/s; "
        f"roofline fractions use the best of both ({peak:.1f})")
  print()
  print(format_table(rows, peak))
  print(f"\nf32 matmul peak (best jitted {peak_before['n']}x{peak_before['n']} matmul, before and "
        f"after): {peak:.1f} GFLOP/s")
  return {
      "benchmark": "sampler",
      "settings": {"quick": bool(args.quick), "models": models, "batches": batches,
                   "prompt_len": prompt_len, "new_tokens": new_tokens, "decoding": "greedy",
                   "stop_tokens": None, "repeats": repeats,
                   "order": f"alternating rlpost, {peer}",
                   "sampler_config": dataclasses.asdict(scfg)},
      "model_configs": {m: dataclasses.asdict(MODELS[m]) for m in models},
      "peer": peer,
      f"{peer}_baseline": baseline,
      "matmul_peak": {"before": peak_before, "after": peak_after, "gflops": peak},
      "flop_formula": FLOP_FORMULA,
      "results": rows,
  }


def _print_row(row: dict, peak: float, header: bool) -> None:
  peer = row["baseline"]
  if header:
    print(f"{'model':>5} {'batch':>5} | {'rlpost tok/s':>12} {'spread':>6} | "
          f"{peer:>12} {'spread':>6} {'thr':>3} | {'ratio':>6} | {'GFLOP/s':>7} "
          f"{'roofline':>8}")
  ours = row["rlpost"]
  theirs = row[peer]
  t_str = (f"{theirs['tokens_per_s']:12,.0f} {theirs['spread']:6.0%} "
           f"{theirs.get('torch_threads', '-'):>3}" if theirs else f"{'-':>12} {'':>6} {'':>3}")
  ratio = f"{row['ratio']:6.2f}" if row["ratio"] is not None else f"{'-':>6}"
  print(f"{row['model']:>5} {row['batch']:>5} | {ours['tokens_per_s']:12,.0f} "
        f"{ours['spread']:6.0%} | {t_str} | {ratio} | {ours['gflops']:7.1f} "
        f"{ours['gflops'] / peak:8.1%}", flush=True)


def format_table(rows: list[dict], peak: float) -> str:
  """Markdown table of sampler results (medians; spread = (max - min) / median)."""
  peer = rows[0]["baseline"] if rows else "transformers"
  extra = ", torch threads" if peer == "transformers" else ""
  lines = [
      (f"| model | params | batch | rlpost tok/s (spread) | {peer} tok/s (spread{extra}) "
       "| ratio | rlpost GFLOP/s | roofline |"),
      "|---|---:|---:|---:|---:|---:|---:|---:|",
  ]
  for r in rows:
    ours, theirs = r["rlpost"], r[peer]
    threads = f", {theirs['torch_threads']}" if theirs and "torch_threads" in theirs else ""
    t = (f"{theirs['tokens_per_s']:,.0f} ({theirs['spread']:.0%}{threads})"
         if theirs else "-")
    ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-"
    lines.append(
        f"| {r['model']} | {r['params'] / 1e6:.2f}M | {r['batch']} | "
        f"{ours['tokens_per_s']:,.0f} ({ours['spread']:.0%}) | {t} | {ratio} | "
        f"{ours['gflops']:.1f} | {ours['gflops'] / peak:.1%} |")
  return "\n".join(lines)

# ------------------------------------------------------------------------------------------
# ablate: what each sampler optimisation buys, measured by switching it off
# ------------------------------------------------------------------------------------------


def add_ablate_args(p: argparse.ArgumentParser) -> None:
  p.add_argument("--quick", action="store_true", help="toy model, batch 4, 8 new tokens")
  p.add_argument("--settings", default="1m:1,1m:16,1m:64,1m:256,10m:64",
                 help="comma list of model:batch for the greedy variants")
  p.add_argument("--top-p-settings", default="1m:64,1m:256",
                 help="model:batch list for sort vs bisection top-p (empty to skip)")
  p.add_argument("--prompt-len", type=int, default=32)
  p.add_argument("--new-tokens", type=int, default=128)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--seed", type=int, default=0)


def _sort_filter_logits(logits, *, temperature, top_k, top_p):
  """``sampling.filter_logits`` as it was before the sort-free top-p (the reference)."""
  if temperature > 0:
    logits = logits / temperature
  if top_k > 0 and top_k < logits.shape[-1]:
    kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  if top_p < 1.0:
    sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    threshold = jnp.min(jnp.where(mass_before < top_p, sorted_logits, jnp.inf), axis=-1,
                        keepdims=True)
    logits = jnp.where(logits < threshold, -jnp.inf, logits)
  return logits


def _hidden_inline_rope(orig):
  def hidden(self, tokens, q_tok, cache=None, cache_index=0, rope_cs=None, **kwargs):
    return orig(self, tokens, q_tok, cache, cache_index, None, **kwargs)
  return hidden


# Each optimisation as the attribute patches that undo it (applied while the sampler traces).
_UNDO = {
    "decode segments": [],  # SamplingConfig(decode_segments=1)
    "argmax as max+min": [(sampling, "_argmax",
                           lambda x: jnp.argmax(x, axis=-1).astype(jnp.int32))],
    "RoPE table per call": [(tfm.Transformer, "hidden",
                             _hidden_inline_rope(tfm.Transformer.hidden))],
}


class _Patched:
  def __init__(self, patches):
    self.patches = patches

  def __enter__(self):
    self.saved = [(obj, name, getattr(obj, name)) for obj, name, _ in self.patches]
    for obj, name, value in self.patches:
      setattr(obj, name, value)

  def __exit__(self, *exc):
    for obj, name, value in self.saved:
      setattr(obj, name, value)


def run_ablate(args) -> dict:
  def parse(text):
    return [(m, int(b)) for m, b in (item.split(":") for item in text.split(",") if item)]

  if args.quick:
    settings, top_p_settings = [("toy", 4)], [("toy", 4)]
    prompt_len, new_tokens, repeats = 8, 8, 2
  else:
    settings, top_p_settings = parse(args.settings), parse(args.top_p_settings)
    prompt_len, new_tokens, repeats = args.prompt_len, args.new_tokens, args.repeats
  greedy = dict(max_new_tokens=new_tokens, temperature=0.0)
  variants = [("all on", greedy, [])]
  variants += [(f"without {k}", dict(greedy, decode_segments=1) if k == "decode segments"
                else greedy, patches) for k, patches in _UNDO.items()]
  variants.append(("all off", dict(greedy, decode_segments=1),
                   [p for ps in _UNDO.values() for p in ps]))
  sampled = dict(max_new_tokens=new_tokens, temperature=1.0)
  top_p = [("top-p 0.95, sort", dict(sampled, top_p=0.95),
            [(sampling, "filter_logits", _sort_filter_logits)]),
           ("top-p 0.95, bisection", dict(sampled, top_p=0.95), []),
           ("temperature 1, no top-p", sampled, [])]
  jobs = [(m, b, variants) for m, b in settings] + [(m, b, top_p) for m, b in top_p_settings]
  rows = []
  models = {}
  print("CPU seconds (all threads) per decode step, median of interleaved runs; "
        "x = relative to the first line of each group")
  for name, batch, vs in jobs:
    if name not in models:
      model = tfm.init_model(MODELS[name], seed=args.seed)
      models[name] = (model, nnx.state(model))
    model, params = models[name]
    tokens = np.random.default_rng(args.seed + batch).integers(
        1, MODELS[name].vocab_size, (batch, prompt_len)).astype(np.int32)
    mask = np.ones_like(tokens, dtype=bool)
    runs = []
    for label, scfg, patches in vs:
      sampler = sampling.Sampler(model, sampling.SamplingConfig(**scfg))
      with _Patched(patches):  # tracing happens on the first call
        out = jax.block_until_ready(sampler(params, tokens, mask, jax.random.key(0)))
      runs.append((label, sampler, np.asarray(out.tokens), [], []))
    for r in range(repeats):
      for label, sampler, _, cpu, wall in runs:
        t0, c0 = time.perf_counter(), time.process_time()
        jax.block_until_ready(sampler(params, tokens, mask, jax.random.key(r), validate=False))
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    base = statistics.median(runs[0][3])
    for label, _, toks, cpu, wall in runs:
      row = {"model": name, "batch": batch, "variant": label,
             "cpu_ms_per_step": statistics.median(cpu) / new_tokens * 1e3,
             "tokens_per_s": batch * new_tokens / statistics.median(wall),
             "cpu_vs_first": statistics.median(cpu) / base,
             "same_tokens_as_first": bool(np.array_equal(toks, runs[0][2])),
             "cpu_seconds": cpu, "wall_seconds": wall}
      rows.append(row)
      print(f"{name:>5} {batch:>4} {label:<34} {row['cpu_ms_per_step']:8.3f} ms/step "
            f"x{row['cpu_vs_first']:5.2f}  {row['tokens_per_s']:10,.0f} tok/s (wall)"
            f"{'' if row['same_tokens_as_first'] else '  [different tokens]'}", flush=True)
  return {"benchmark": "ablate",
          "settings": {"quick": bool(args.quick), "greedy": settings, "top_p": top_p_settings,
                       "prompt_len": prompt_len, "new_tokens": new_tokens, "repeats": repeats,
                       "timer": "time.process_time (CPU seconds of all threads), median"},
          "results": rows}


# ------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------

COMMANDS = {
    "train": (bench_train.add_args, bench_train.run,
              "one GRPO step vs TRL GRPOTrainer, and the step's time split"),
    "scaling": (bench_scaling.add_args, bench_scaling.run,
                "step time vs batch, sequence length and model size; compilations per shape"),
    "averaging": (bench_averaging.add_args, bench_averaging.run,
                  "peak memory and time of checkpoint averaging vs the number of checkpoints"),
    "roundtrip": (bench_roundtrip.add_args, bench_roundtrip.run,
                  "cost of the diffusion round trip at depth i vs a forward rollout of depth i"),
    "lora": (bench_lora.add_args, bench_lora.run,
             "LoRA vs full fine-tuning on one model: parameters, optimizer state, update time"),
    "seeds": (bench_seeds.add_args, bench_seeds.run,
              "K seeds of the GRPO step vmapped in one program vs one seed: time, memory"),
    "layers": (bench_layers.add_args, bench_layers.run,
               "layers stored stacked vs one by one: the GRPO step and the sampler"),
    "packing": (bench_packing.add_args, bench_packing.run,
                "the policy-gradient pass padded vs packed, against the share of padding"),
    "sampler": (add_sampler_args, run_sampler,
                "decode tokens/s vs transformers generate, and fraction of matmul peak"),
    "ablate": (add_ablate_args, run_ablate,
               "CPU time per decode step with each sampler optimisation switched off"),
}


def check_out_file(path: str) -> None:
  """Fail before a benchmark runs, not after, when its ``--out`` JSON file cannot be written
  there: a directory, or a file in a directory that does not exist."""
  if os.path.isdir(path):
    raise IsADirectoryError(f"--out {path} is a directory; it must name a JSON file")
  parent = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(parent):
    raise FileNotFoundError(f"--out {path}: directory {parent} does not exist")


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = ap.add_subparsers(dest="command", required=True)
  for name, (add_args, _, help_) in COMMANDS.items():
    p = sub.add_parser(name, help=help_)
    add_args(p)
    p.add_argument("--out", default=None, help="write the results as JSON to this file")
  args = ap.parse_args(argv)
  if args.out:
    check_out_file(args.out)
  machine = machine_info()
  print(f"machine: {machine['cpu_model']}, {machine['cpu_cores']} cores; jax {machine['jax']} "
        f"({machine['jax_backend']}), torch {machine['torch']}, "
        f"transformers {machine['transformers']}; started {machine['date']}", flush=True)
  t0 = time.perf_counter()
  result = COMMANDS[args.command][1](args)
  machine["loadavg_end"] = load_average()
  result = {"command": " ".join(["python", "scripts/bench.py", *(argv or sys.argv[1:])]),
            "machine": machine, "wall_seconds": time.perf_counter() - t0, **result}
  if args.out:
    Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")
  return result


if __name__ == "__main__":
  run_main(main)
