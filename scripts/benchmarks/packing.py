"""``bench.py packing``: the policy-gradient pass padded vs packed, against the share of padding.

The pass ``rlpost.train.update`` differentiates: ``completion_scores`` of R rollout rows
(prompt buffer Tp, completion buffer N) and the gradient of sum(logp * advantage), jitted. The
padded pass runs the decoder over all R x (Tp + N) slots; the packed one
(``rlpost.models.packing``, ``pack_buckets`` in the trainer) over the smallest bucket of bins
the rows' real tokens fit into (``Buckets.run``: a ``lax.switch`` over whole forward and
backward programs, as ``rlpost.train.update`` runs it). The rows are synthetic, with controlled lengths: prompts of
``--prompt-len`` tokens +-25% in a buffer of Tp = 1.25 x that, completions uniform in
[0.5, 1.5] x (a share of N), so that the real tokens are a given share of the padded slots.

The policy is ``bench.py train``'s (0.81M parameters, hidden 128, 4 layers, character
vocabulary). For each real-token share the two passes alternate call by call (``--repeats``
each, the compilation call untimed) in one process. Reported per share: padded ms, packed ms,
their ratio, the bucket that ran (its slots as a share of the padded layout) and each program's
compile time. The same buckets serve every share (one compiled program).
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from scripts.benchmarks.train import POLICY, TOY_POLICY

BUCKETS = (0.25, 0.375, 0.5, 0.625, 0.75, 0.875)


def add_args(p) -> None:
  p.add_argument("--quick", action="store_true", help="toy model and batch (seconds)")
  p.add_argument("--rows", type=int, default=128, help="rollout rows R (16 prompts x G=8)")
  p.add_argument("--prompt-len", type=int, default=12)
  p.add_argument("--new-tokens", type=int, default=64)
  p.add_argument("--shares", default="0.9,0.7,0.5,0.3",
                 help="real tokens as shares of the padded slots (comma list)")
  p.add_argument("--buckets", default=",".join(map(str, BUCKETS)))
  p.add_argument("--bin-rows", type=int, default=2)
  p.add_argument("--attention", default="xla", choices=("xla", "blockwise", "cudnn"),
                 help="training-pass attention (cudnn: GPUs, with --dtype bfloat16)")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                 help="activation and matmul dtype (parameters stay float32)")
  p.add_argument("--repeats", type=int, default=7)


def make_rows(rows: int, prompt_len: int, new_tokens: int, share: float, vocab: int, seed=0):
  """Left-padded prompts and prefix completions whose real tokens are ~``share`` of the slots.

  Returns numpy (prompts [R, Tp] int32, pmask [R, Tp] bool, comp [R, N] int32, cmask [R, N]).
  """
  rng = np.random.default_rng(seed)
  tp = int(round(1.25 * prompt_len))
  pl = np.clip(np.round(prompt_len * rng.uniform(0.75, 1.25, rows)), 1, tp).astype(int)
  comp_mean = share * (tp + new_tokens) - pl.mean()
  if not 1 <= comp_mean <= new_tokens:
    raise ValueError(f"--shares: {share} cannot be reached with prompts of ~{prompt_len} in "
                     f"{tp} slots and {new_tokens} new tokens")
  half = min(0.5 * comp_mean, new_tokens - comp_mean, comp_mean - 1)
  cl = np.clip(np.round(rng.uniform(comp_mean - half, comp_mean + half, rows)), 1,
               new_tokens).astype(int)
  pmask = np.arange(tp)[None, :] >= tp - pl[:, None]
  cmask = np.arange(new_tokens)[None, :] < cl[:, None]
  prompts = np.where(pmask, rng.integers(3, vocab, (rows, tp)), 0).astype(np.int32)
  comp = np.where(cmask, rng.integers(3, vocab, (rows, new_tokens)), 0).astype(np.int32)
  return prompts, pmask, comp, cmask


def _median_ms(times):
  return 1e3 * statistics.median(times), 1e3 * (max(times) - min(times))


def run(args) -> dict:
  from rlpost.models import packing
  from rlpost.models import transformer as tfm
  from rlpost.models import scoring
  from rlpost.tokenizer import CharTokenizer

  if args.quick:
    args.rows, args.prompt_len, args.new_tokens, args.repeats = 16, 6, 12, 2
    args.shares = "0.7,0.4"
  buckets = tuple(float(b) for b in args.buckets.split(","))
  shares = [float(s) for s in args.shares.split(",")]
  vocab = CharTokenizer().vocab_size
  model_kw = dict(TOY_POLICY if args.quick else POLICY)
  cfg = tfm.TransformerConfig(vocab_size=vocab, max_seq_len=256, attention=args.attention,
                              dtype=args.dtype, **model_kw)
  graphdef, params = nnx.split(tfm.init_model(cfg, seed=0))

  buckets_obj = packing.Buckets(buckets, args.bin_rows)

  def grad_fn(packed: bool):
    def loss(p, num_bins, prompts, pmask, comp, cmask, adv):
      model = nnx.merge(graphdef, p)
      if num_bins is None:
        logp, _ = scoring.completion_scores(model, prompts, pmask, comp, cmask)
      else:
        logp, _ = packing.completion_scores(model, prompts, pmask, comp, cmask,
                                            num_bins=num_bins, bin_rows=args.bin_rows)
      return jnp.sum(logp * adv[:, None])

    def fn(p, *batch):
      # as rlpost.train.update does: one whole forward + backward program per bucket
      vg = lambda num_bins: jax.value_and_grad(loss)(p, num_bins, *batch)  # noqa: E731
      return buckets_obj.run(vg, batch[1], batch[3]) if packed else vg(None)
    return jax.jit(fn)

  fns = {"padded": grad_fn(False), "packed": grad_fn(True)}
  compile_s = {}
  rows = []
  for share in shares:
    prompts, pmask, comp, cmask = make_rows(args.rows, args.prompt_len, args.new_tokens, share,
                                            vocab)
    adv = np.random.default_rng(1).standard_normal(args.rows).astype(np.float32)
    batch = tuple(jnp.asarray(x) for x in (prompts, pmask, comp, cmask, adv))
    times = {k: [] for k in fns}
    values = {}
    for k, fn in fns.items():  # compilation (first share only) and warm-up, untimed
      t0 = time.perf_counter()
      values[k] = jax.block_until_ready(fn(params, *batch))
      compile_s.setdefault(k, time.perf_counter() - t0)
    for _ in range(args.repeats):
      for k, fn in fns.items():
        t0 = time.perf_counter()
        jax.block_until_ready(fn(params, *batch))
        times[k].append(time.perf_counter() - t0)
    m = jax.device_get(buckets_obj.metrics(batch[1], batch[3]))
    gap = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
        jax.tree.leaves(values["padded"][1]), jax.tree.leaves(values["packed"][1])))
    row = {"share": share,
           "real_tokens": float(m["real_tokens"].sum / m["real_tokens"].denominator),
           "packed_slots": float(m["packed_slots"].sum / m["packed_slots"].denominator),
           "max_grad_gap": gap,
           "loss_gap": abs(float(values["padded"][0]) - float(values["packed"][0]))}
    for k in fns:
      row[f"{k}_ms"], row[f"{k}_spread_ms"] = _median_ms(times[k])
    row["speedup"] = row["padded_ms"] / row["packed_ms"]
    rows.append(row)
    print(f"real {row['real_tokens']:.2f}: padded {row['padded_ms']:.1f} ms, packed "
          f"{row['packed_ms']:.1f} ms ({row['speedup']:.2f}x), bucket "
          f"{row['packed_slots']:.3f} of the slots", flush=True)
  print()
  print(format_table(rows))
  return {"benchmark": "packing",
          "settings": {"quick": bool(args.quick), "rows": args.rows,
                       "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
                       "buckets": buckets, "bin_rows": args.bin_rows,
                       "attention": args.attention, "dtype": args.dtype,
                       "backend": jax.default_backend(), "repeats": args.repeats,
                       "model": model_kw, "params": cfg.num_params(),
                       "order": "alternating padded, packed; compilation call untimed"},
          "compile_s": compile_s, "results": rows}


def format_table(rows: list[dict]) -> str:
  lines = ["| real tokens | bucket (share of slots) | padded ms | packed ms | speedup | "
           "max grad gap |", "|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    lines.append(f"| {r['real_tokens']:.2f} | {r['packed_slots']:.3f} | "
                 f"{r['padded_ms']:.1f} (±{r['padded_spread_ms']:.0f}) | "
                 f"{r['packed_ms']:.1f} (±{r['packed_spread_ms']:.0f}) | {r['speedup']:.2f}x | "
                 f"{r['max_grad_gap']:.1e} |")
  return "\n".join(lines)
