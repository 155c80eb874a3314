"""The benchmark models, FLOP counts, the matmul peak and the host record shared by the
benchmarks."""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from rlpost.models import transformer as tfm


# The models of ``bench.py sampler`` and ``bench.py layers``.
_QWEN2 = dict(qkv_bias=True, tie_embeddings=True, max_seq_len=512)
MODELS = {
    # ~0.85M parameters: the README / quickstart policy.
    "1m": tfm.TransformerConfig(vocab_size=512, hidden_size=128, num_layers=4, num_heads=4,
                                num_kv_heads=2, intermediate_size=384, **_QWEN2),
    # ~10.7M parameters: hidden 384, 6 layers.
    "10m": tfm.TransformerConfig(vocab_size=1024, hidden_size=384, num_layers=6, num_heads=6,
                                 num_kv_heads=2, intermediate_size=1152, **_QWEN2),
    # Toy size for --quick (the test suite).
    "toy": tfm.TransformerConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                                 num_kv_heads=2, intermediate_size=64, **_QWEN2),
}


def timed(fn, sink: list, *, block: bool = False):
  """``fn`` that appends each call's wall seconds to ``sink``; with ``block``, the clock stops
  only once the arrays ``fn`` returned are computed (JAX dispatches asynchronously)."""
  def wrapper(*args, **kwargs):
    t0 = time.perf_counter()
    result = fn(*args, **kwargs)
    if block:
      jax.block_until_ready(result)
    sink.append(time.perf_counter() - t0)
    return result
  return wrapper


def layer_matmul_params(cfg: tfm.TransformerConfig) -> int:
  """P_layers: matmul weights of all layers (q/k/v/o + MLP kernels; no biases or norms)."""
  e, d, f = cfg.hidden_size, cfg.resolved_head_dim, cfg.intermediate_size
  attn = e * d * (cfg.num_heads + 2 * cfg.num_kv_heads) + cfg.num_heads * d * e
  return cfg.num_layers * (attn + 3 * e * f)


def generation_flops(cfg: tfm.TransformerConfig, batch: int, prompt_len: int,
                     new_tokens: int) -> float:
  """FLOPs of prefill + decoding ``new_tokens`` tokens for ``batch`` rows (module docstring)."""
  tp, n = prompt_len, new_tokens
  matmul = 2 * layer_matmul_params(cfg) * (tp + n - 1) + 2 * cfg.hidden_size * cfg.vocab_size * n
  keys = tp * (tp + 1) // 2 + (n - 1) * tp + n * (n - 1) // 2
  attn = 4 * cfg.num_layers * cfg.num_heads * cfg.resolved_head_dim * keys
  return float(batch) * (matmul + attn)


def training_flops(cfg: tfm.TransformerConfig, batch: int, prompt_len: int, new_tokens: int,
                   *, reference: bool) -> dict:
  """Useful FLOPs of an RL update on ``batch`` rows of ``prompt_len + new_tokens`` tokens.

  forward = 2 * P_layers * T + 4 * L * H * D * T (T + 1) / 2 (causal q.k and p.v) + 2 * E * V * N
  (the LM head on the N scored positions), with T = prompt_len + new_tokens; the gradient costs
  twice the forward (activations and weights), so the differentiated pass is 3x the forward; a
  KL term adds one forward of the frozen reference.
  """
  t, n = prompt_len + new_tokens, new_tokens
  fwd = (2 * layer_matmul_params(cfg) * t
         + 4 * cfg.num_layers * cfg.num_heads * cfg.resolved_head_dim * t * (t + 1) // 2
         + 2 * cfg.hidden_size * cfg.vocab_size * n) * float(batch)
  return {"forward": fwd, "update": 3 * fwd + (fwd if reference else 0.0)}


def measure_matmul_peak(n: int = 2048, repeats: int = 8) -> dict:
  """Best-of-``repeats`` f32 FLOP/s of a jitted [n, n] @ [n, n] matmul on the default device."""
  rng = np.random.default_rng(0)
  a = jnp.asarray(rng.standard_normal((n, n), np.float32))
  b = jnp.asarray(rng.standard_normal((n, n), np.float32))
  f = jax.jit(lambda x, y: x @ y)
  f(a, b).block_until_ready()
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    f(a, b).block_until_ready()
    times.append(time.perf_counter() - t0)
  flops = 2.0 * n ** 3
  return {"n": n, "gflops_best": flops / min(times) / 1e9,
          "gflops_median": flops / statistics.median(times) / 1e9, "repeats": repeats}


def cpu_model() -> str:
  """The CPU's model name from /proc/cpuinfo, else what ``platform`` reports."""
  try:
    with open("/proc/cpuinfo") as f:
      model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
  except OSError:
    model = ""
  return model or platform.processor() or platform.machine()


def load_average() -> list[float] | None:
  """The 1-, 5- and 15-minute load averages, or None where the system keeps none."""
  try:
    return list(os.getloadavg())
  except OSError:
    return None


def host_record() -> dict:
  """When and where a benchmark starts, for the JSON it writes: ``date`` (UTC, ISO 8601), the CPU
  model and core count, and ``loadavg_start``; the writer adds ``loadavg_end`` (``load_average()``)
  once the benchmark is done."""
  return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "cpu_model": cpu_model(), "cpu_cores": os.cpu_count(),
          "loadavg_start": load_average()}
