"""Attention memory: XLA's temporary bytes of one attention layer's forward + backward, by impl.

Nothing runs: each program is compiled from abstract inputs (``jax.ShapeDtypeStruct``) and
``compiled.memory_analysis().temp_size_in_bytes`` is read, so the numbers are what XLA plans on
this backend for the program (on CPU here; a GPU compiler plans its own buffers, so rerun there
for GPU numbers). The program is ``jax.vjp`` of ``rlpost.models.attention.attend`` on
q [B, T, H, D], k and v [B, T, K, D] with positions, validity and an output cotangent as inputs:
the training pass's attention (causal by position, no cache), gradients wrt q, k and v.
Arguments (q, k, v, the cotangent) and outputs (the three gradients) are not temporaries and
are reported apart.

Default shapes: Qwen2.5-7B's attention (H=28 query heads, K=4 key/value heads, D=128), bfloat16,
B=1, T = 1024, 4096, 10240 (ACE's full-size rows). For scale, "scores MiB" is one [B, H, T, T]
float32 score tensor, which the plain ("xla") attention materialises several times over.

  python -m scripts.benchmarks.attention_memory  # writes results/bench/attention_memory.json
  python -m scripts.benchmarks.attention_memory --seq 1024,4096 --impls xla,blockwise
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from rlpost.models import attention

QWEN25_7B = {"heads": 28, "kv_heads": 4, "head_dim": 128}
MIB = 2 ** 20


def attention_grad_memory(impl: str, *, batch: int, seq: int, heads: int, kv_heads: int,
                          head_dim: int, dtype=jnp.bfloat16, window: int | None = None,
                          block_q: int = attention.BLOCK_Q,
                          block_k: int = attention.BLOCK_K) -> dict:
  """Compile forward + backward of one ``attend`` call on abstract inputs; XLA's byte counts.

  Returns temp / argument / output bytes and the compile seconds.
  """
  sds = jax.ShapeDtypeStruct
  q = sds((batch, seq, heads, head_dim), dtype)
  kv = sds((batch, seq, kv_heads, head_dim), dtype)
  pos, valid = sds((batch, seq), jnp.int32), sds((batch, seq), jnp.bool_)

  def fwd_bwd(q, k, v, pos, valid, d_out):
    f = lambda q, k, v: attention.attend(  # noqa: E731
        q, k, v, attention.Tokens(pos, valid), scale=head_dim ** -0.5, window=window,
        impl=impl, block_q=block_q, block_k=block_k)
    _, vjp = jax.vjp(f, q, k, v)
    return vjp(d_out)

  t0 = time.perf_counter()
  compiled = jax.jit(fwd_bwd).lower(q, kv, kv, pos, valid, q).compile()
  seconds = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  return {"impl": impl, "batch": batch, "seq": seq, "heads": heads, "kv_heads": kv_heads,
          "head_dim": head_dim, "dtype": jnp.dtype(dtype).name, "window": window,
          "block_q": block_q, "block_k": block_k,
          "temp_bytes": int(mem.temp_size_in_bytes),
          "argument_bytes": int(mem.argument_size_in_bytes),
          "output_bytes": int(mem.output_size_in_bytes),
          "scores_bytes": 4 * batch * heads * seq * seq,
          "compile_s": seconds}


# Markdown columns: (header, cell of one result row).
COLUMNS = (
    ("T", lambda r: f"{r['seq']:,}"),
    ("impl", lambda r: r["impl"]),
    ("blocks", lambda r: f"{r['block_q']}x{r['block_k']}" if r["impl"] == "blockwise" else "-"),
    ("temp MiB", lambda r: f"{r['temp_bytes'] / MIB:,.1f}"),
    ("args MiB", lambda r: f"{r['argument_bytes'] / MIB:,.1f}"),
    ("outputs MiB", lambda r: f"{r['output_bytes'] / MIB:,.1f}"),
    ("one f32 [B,H,T,T] scores MiB", lambda r: f"{r['scores_bytes'] / MIB:,.1f}"),
    ("temp / scores", lambda r: f"{r['temp_bytes'] / r['scores_bytes']:.3f}"),
    ("compile s", lambda r: f"{r['compile_s']:.1f}"),
)


def format_table(rows: list[dict]) -> str:
  lines = ["| " + " | ".join(name for name, _ in COLUMNS) + " |",
           "|---:|---|" + "---:|" * (len(COLUMNS) - 2)]
  lines += ["| " + " | ".join(cell(r) for _, cell in COLUMNS) + " |" for r in rows]
  return "\n".join(lines)


def add_args(p) -> None:
  p.add_argument("--seq", default="1024,4096,10240", help="sequence lengths T (= S)")
  p.add_argument("--impls", default="xla,blockwise", help="attend implementations")
  p.add_argument("--batch", type=int, default=1)
  p.add_argument("--heads", type=int, default=QWEN25_7B["heads"])
  p.add_argument("--kv-heads", type=int, default=QWEN25_7B["kv_heads"])
  p.add_argument("--head-dim", type=int, default=QWEN25_7B["head_dim"])
  p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
  p.add_argument("--block-q", type=int, default=attention.BLOCK_Q)
  p.add_argument("--block-k", type=int, default=attention.BLOCK_K)


def run(args) -> dict:
  rows = []
  for seq in (int(x) for x in args.seq.split(",")):
    for impl in args.impls.split(","):
      rows.append(attention_grad_memory(
          impl, batch=args.batch, seq=seq, heads=args.heads, kv_heads=args.kv_heads,
          head_dim=args.head_dim, dtype=jnp.dtype(args.dtype), block_q=args.block_q,
          block_k=args.block_k))
      r = rows[-1]
      print(f"T={seq} {impl}: temp {r['temp_bytes'] / MIB:,.1f} MiB "
            f"(compiled in {r['compile_s']:.1f} s)", flush=True)
  print()
  print(format_table(rows))
  return {"benchmark": "attention_memory",
          "what": "XLA temp bytes of forward + backward (vjp wrt q, k, v) of one attention layer",
          "backend": jax.default_backend(), "jax": jax.__version__,
          "machine": platform.machine(), "results": rows}


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_args(p)
  p.add_argument("--out", default="results/bench/attention_memory.json")
  args = p.parse_args(argv)
  result = run(args)
  Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
  print(f"\nwrote {args.out}")


if __name__ == "__main__":
  main()
