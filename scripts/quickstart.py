"""Default CPU job: sample rollouts from a small random policy and report decode throughput.

Run through ``scripts/quickstart.sh`` (which sets up .venv). Until the RL trainer lands this shows
the rollout engine end to end: a Qwen2-style policy, padded prompts of different lengths, the
jitted KV-cache sampler, and a check that the sampler's log-probs equal a full forward pass.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np
from flax import nnx

from rlpost import sampling
from rlpost.models import transformer as tfm


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__)
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--new-tokens", type=int, default=128)
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args(argv)

  cfg = tfm.TransformerConfig(vocab_size=512, hidden_size=128, num_layers=4, num_heads=4,
                              num_kv_heads=2, intermediate_size=384, qkv_bias=True,
                              tie_embeddings=True, max_seq_len=512)
  model = tfm.init_model(cfg, seed=args.seed)
  params = nnx.state(model)
  rng = np.random.default_rng(args.seed)
  prompts = [list(rng.integers(1, cfg.vocab_size, size=rng.integers(8, 33)))
             for _ in range(args.batch)]
  tokens, mask = sampling.pad_prompts(prompts, side="left")
  sampler = sampling.Sampler(model, sampling.SamplingConfig(
      max_new_tokens=args.new_tokens, temperature=1.0, top_p=0.95))
  print(f"policy: {cfg.num_params() / 1e6:.2f}M parameters, {len(jax.devices())} "
        f"{jax.devices()[0].platform} device(s)")

  t0 = time.perf_counter()
  out = jax.block_until_ready(sampler(params, tokens, mask, jax.random.key(args.seed)))
  compile_s = time.perf_counter() - t0
  times = []
  for i in range(3):
    t0 = time.perf_counter()
    out = jax.block_until_ready(sampler(params, tokens, mask, jax.random.key(args.seed + i + 1)))
    times.append(time.perf_counter() - t0)
  n_tokens = int(np.asarray(out.lengths).sum())
  best = min(times)
  print(f"first call (compile + run): {compile_s:.2f}s; compilations: {sampler.num_traces}")
  print(f"decode: batch {args.batch}, {args.new_tokens} new tokens -> "
        f"{n_tokens / best:,.0f} tokens/s (best of 3: {best * 1e3:.0f} ms)")
  full = tfm.completion_logprobs(model, tokens, mask, out.tokens, out.mask)
  err = float(np.max(np.abs(np.asarray(full) - np.asarray(out.policy_logprobs))))
  print(f"max |sampler log-prob - full forward log-prob| = {err:.2e}")
  if not err < 1e-4:
    raise SystemExit("sampler log-probs disagree with the full forward pass")


if __name__ == "__main__":
  main()
