"""Memory of one training micro-batch of every full-size run (``experiments/*/full.py``).

For each distinct (policy, prompt + completion length, rows per device) of the full-size
configurations, XLA's memory analysis of the policy-gradient pass (``jax.grad`` of a loss over
``completion_scores`` with the run's remat and LM-head chunks) is read off the compiled program,
with ``attention="xla"`` and ``"blockwise"``, and with the layers stored one by one and stacked
(``stacked_layers``; the full-size configurations use blockwise attention and stacked layers).
Nothing runs: the inputs are abstract (``jax.ShapeDtypeStruct``) and the model is built with
``nnx.eval_shape``.

Reported per program: the parameter bytes (arguments), the gradient bytes (outputs) and XLA's
temporaries: what one device needs beyond its parameters, gradients and optimizer state. The
analysis is of the CPU compilation (one device, no sharding); an accelerator's compiler plans
its own buffers, so these are estimates of the same program, not device measurements.

    python -m scripts.benchmarks.full_memory [--out results/bench/full_memory.json]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import itertools
import json
import time

import jax
import jax.numpy as jnp
from flax import nnx

from experiments import full_size
from rlpost.models import transformer as tfm

EXPERIMENTS = ("mc_grpo", "ace", "dars")
GIB = 2 ** 30


def runs() -> dict[tuple, list[str]]:
  """(policy name, prompt tokens, completion tokens, rows per device, remat, logits chunk) ->
  the full-size runs with that training micro-batch."""
  out: dict[tuple, list[str]] = {}
  for exp in EXPERIMENTS:
    full = importlib.import_module(f"experiments.{exp}.full").FULL
    for name, cfg in full.items():
      rows = full_size.sampling_plan(cfg).rows
      per_device = rows // cfg.get("num_minibatches", 1) // cfg.get("grad_accum", 1)
      per_device //= full_size.DEVICES
      key = (cfg["policy"].rstrip("/").split("/")[-1], cfg["max_prompt_tokens"],
             cfg["max_new_tokens"], per_device, cfg.get("remat", False),
             cfg.get("logits_chunk", 0))
      out.setdefault(key, []).append(f"{exp}:{name}")
  return out


def model_config(policy: str, attention: str) -> tfm.TransformerConfig:
  arch = dict(full_size.POLICIES[policy])
  arch.pop("architecture")
  return tfm.TransformerConfig(**arch, qkv_bias=True, dtype="bfloat16", param_dtype="float32",
                               attention=attention)


def analyse(policy: str, prompt: int, completion: int, rows: int, remat: bool, chunk: int,
            attention: str, stacked_layers: bool = False) -> dict:
  """Bytes of the compiled gradient pass of one micro-batch (abstract; nothing runs).

  ``stacked_layers``: ``TransformerConfig.stacked_layers`` (layers stored as one [L, ...]
  parameter each, which the remat scan reads in place and whose gradients it writes stacked);
  otherwise layers stored one by one, which the scan stacks (a copy of the weights in, and of
  their gradients out)."""
  cfg = model_config(policy, attention).replace(max_seq_len=prompt + completion,
                                                stacked_layers=stacked_layers)
  graphdef, params = nnx.split(nnx.eval_shape(lambda: tfm.Transformer(cfg, rngs=nnx.Rngs(0))))
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype)  # noqa: E731
  args = (params, spec((rows, prompt), jnp.int32), spec((rows, prompt), bool),
          spec((rows, completion), jnp.int32), spec((rows, completion), bool),
          spec((rows, completion), jnp.float32))
  merged = functools.partial(nnx.merge, graphdef)

  def loss(w, pt, pm, ct, cm, adv):
    logp, _ = tfm.completion_scores(merged(w), pt, pm, ct, cm, logits_chunk=chunk, remat=remat)
    return -jnp.sum(logp * adv) / jnp.maximum(jnp.sum(cm), 1)

  start = time.perf_counter()
  stats = jax.jit(jax.grad(loss)).lower(*args).compile().memory_analysis()
  return dict(attention=attention, compile_seconds=round(time.perf_counter() - start, 1),
              argument_gib=stats.argument_size_in_bytes / GIB,
              output_gib=stats.output_size_in_bytes / GIB,
              temp_gib=stats.temp_size_in_bytes / GIB)


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default=None, help="default: results/bench/full_memory.json, or "
                      "results/bench/full_memory_P+C.json with --tokens")
  parser.add_argument("--tokens", default=None, metavar="P,C",
                      help="analyse every run's micro-batch at P prompt + C completion tokens "
                           "instead of its own (e.g. 64,64: what does not depend on the sequence)")
  args = parser.parse_args(argv)
  if args.tokens:
    short = tuple(int(x) for x in args.tokens.split(","))
    if len(short) != 2 or min(short) < 1:
      parser.error(f"--tokens takes two positive ints P,C, got {args.tokens!r}")
  out = args.out or ("results/bench/full_memory.json" if not args.tokens
                     else f"results/bench/full_memory_{short[0]}+{short[1]}.json")
  rows = []
  for (policy, prompt, completion, per_device, remat, chunk), names in runs().items():
    if args.tokens:
      prompt, completion = short
    for stacked, attention in itertools.product((False, True), ("xla", "blockwise")):
      row = dict(policy=policy, prompt_tokens=prompt, completion_tokens=completion,
                 rows_per_device=per_device, remat=remat, logits_chunk=chunk, runs=names,
                 layers="stacked" if stacked else "stored",
                 **analyse(policy, prompt, completion, per_device, remat, chunk, attention,
                           stacked_layers=stacked))
      print(json.dumps(row), flush=True)
      rows.append(row)
  command = "python -m scripts.benchmarks.full_memory" + (
      f" --tokens {args.tokens}" if args.tokens else "")
  result = dict(command=command, backend=jax.default_backend(), jax=jax.__version__, rows=rows)
  with open(out, "w") as f:
    json.dump(result, f, indent=2)
  print(table(rows))
  return result


COLUMNS = (("stored", "xla"), ("stored", "blockwise"), ("stacked", "xla"),
           ("stacked", "blockwise"))


def table(rows: list[dict]) -> str:
  """Markdown: one line per micro-batch, the temporaries (GiB) of each (layers, attention)."""
  lines = ["| policy | tokens (prompt + completion) | rows/device | runs | params GiB | " +
           " | ".join(f"temp GiB, {layers}, {attention}" for layers, attention in COLUMNS) + " |",
           "|---|---|---:|---|---:|" + "---:|" * len(COLUMNS)]
  by_key: dict[tuple, dict] = {}
  for r in rows:
    key = (r["policy"], r["prompt_tokens"], r["completion_tokens"], r["rows_per_device"])
    by_key.setdefault(key, {"runs": r["runs"], "params": r["argument_gib"]})[
        (r.get("layers", "stored"), r["attention"])] = r["temp_gib"]
  for (policy, p, c, n), v in by_key.items():
    temps = " | ".join(f"{v[col]:.1f}" if col in v else "-" for col in COLUMNS)
    lines.append(f"| {policy} | {p:,} + {c:,} | {n} | {', '.join(v['runs'])} | "
                 f"{v['params']:.1f} | {temps} |")
  return "\n".join(lines)


if __name__ == "__main__":
  main()
