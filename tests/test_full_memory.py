"""scripts/benchmarks/full_memory.py on a toy policy: XLA's plan of the gradient pass, with the
layers stored one by one and stacked (``TransformerConfig.stacked_layers``); the whole step's
plan per device and scripts/benchmarks/roofline.py against hand computations, and a row for
every full-size run (nothing big is compiled)."""

import json
from pathlib import Path

import jax
import pytest

from rlpost.models import transformer as tfm
from scripts.benchmarks import full_memory

GRAD_PLANS = Path(__file__).resolve().parents[1] / "results" / "bench" / "full_memory.json"


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="sizes of the CPU compiler's plan")
def test_stacked_layers_drop_the_scans_copies(monkeypatch):
  toy = tfm.TransformerConfig(vocab_size=64, hidden_size=256, num_layers=4, num_heads=4,
                              num_kv_heads=2, intermediate_size=1024, dtype="bfloat16",
                              param_dtype="float32")
  monkeypatch.setattr(full_memory, "model_config",
                      lambda policy, attention: toy.replace(attention=attention))
  kw = dict(policy="toy", prompt=4, completion=4, rows=1, remat=True, chunk=0,
            attention="blockwise")
  stored = full_memory.analyse(**kw)
  stacked = full_memory.analyse(**kw, stacked_layers=True)
  layer_gib = 4 * 4 * (4 * 256 * 64 * 3 + 3 * 256 * 1024) / 2 ** 30  # f32 layer weights (+-)
  # The same parameters and gradients either way. Stored one by one, the remat scan copies the
  # weights in stacked and the gradients out (1.6 float32 copies of the layer weights here);
  # stored stacked, the scan reads the weights in place and writes the gradients stacked, and
  # what is left is a fraction of one copy (the activations of 4 tokens are tiny).
  assert stacked["argument_gib"] == pytest.approx(stored["argument_gib"], rel=1e-3)
  assert stacked["output_gib"] == pytest.approx(stored["output_gib"], rel=1e-3)
  assert stored["temp_gib"] > 1.4 * layer_gib
  assert 0 < stacked["temp_gib"] < 0.5 * layer_gib
  rows = [dict(policy="toy", prompt_tokens=4, completion_tokens=4, rows_per_device=1,
               runs=["x:y"], layers=layers, **r)
          for layers, r in (("stored", stored), ("stored", dict(stored, attention="xla")),
                            ("stacked", stacked))]
  table = full_memory.table(rows)
  assert "temp GiB, stacked, blockwise" in table and table.count("\n") == 2
  t0, t1 = f"{stored['temp_gib']:.1f}", f"{stacked['temp_gib']:.1f}"
  assert table.splitlines()[2].endswith(f"| {t0} | {t0} | - | {t1} |")


# A toy policy in the shape of the full-size ones (Qwen2: q/k/v biases, tied embeddings).
TOY = dict(architecture="qwen2", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
           intermediate_size=128, vocab_size=100, max_seq_len=4096, rope_theta=10000.0,
           rms_norm_eps=1e-6, tie_embeddings=True)
# Its parameters by hand: embedding 100 x 64; per layer q 64x64 + 64, k and v 64x32 + 32 each,
# o 64x64, MLP 3 x 64 x 128, two norms of 64; the final norm.
TOY_LAYER = (64 * 64 + 64) + 2 * (64 * 32 + 32) + 64 * 64 + 3 * 64 * 128 + 2 * 64
TOY_PARAMS = 100 * 64 + 2 * TOY_LAYER + 64


def _toy_run(monkeypatch, prompt: int, completion: int) -> dict:
  """dars:plain-n8 (1,024 rows, sampled 512 at a time, 4 rows per device per micro-batch) on
  the toy policy at these lengths."""
  from experiments import full_size
  from experiments.dars import full as dars

  monkeypatch.setitem(full_size.POLICIES, "Toy", TOY)
  return dict(dars.FULL["plain-n8"], policy="checkpoints/Toy", max_prompt_tokens=prompt,
              max_new_tokens=completion)


def test_param_count_matches_the_model():
  from flax import nnx

  from scripts.benchmarks import roofline

  counts = roofline.param_counts(dict(TOY, head_dim=16))
  assert counts["total"] == TOY_PARAMS and counts["layer"] == TOY_LAYER
  arch = {k: v for k, v in TOY.items() if k != "architecture"}
  model = nnx.eval_shape(lambda: tfm.Transformer(
      tfm.TransformerConfig(**arch, qkv_bias=True), rngs=nnx.Rngs(0)))
  assert sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))) == TOY_PARAMS
  # The full-size policies: their float32 parameters are the arguments of the committed
  # gradient-pass plans (with the micro-batch's few token arrays).
  with open(GRAD_PLANS) as f:
    rows = json.load(f)["rows"]
  for r in rows:
    params = roofline.param_counts(roofline.arch(r["policy"]))["total"]
    assert 4 * params / 2 ** 30 == pytest.approx(r["argument_gib"], rel=1e-4)


def test_whole_step_terms_by_hand(monkeypatch):
  cfg = _toy_run(monkeypatch, prompt=8, completion=100)
  plan = full_memory.whole_step(cfg, grad_temp_gib=1.5)
  gib = 2 ** 30
  r = 512 // 8  # rollout_chunk rows per device
  kv_slot = 2 * 2 * 2 * 16 * 2  # layers x (k, v) x kv heads x head_dim x bfloat16
  # 99 decode steps in 4 segments: steps 1-24, 25-49, 50-74, 75-99 over caches of 8 + 24,
  # 8 + 49, 8 + 74 and 8 + 99 slots (step i feeds token i - 1 into slot 8 + i - 1).
  assert plan["decode"]["kv_cache"] * gib == r * 107 * kv_slot
  assert plan["decode"]["kv_cache_previous_segment"] * gib == r * 82 * kv_slot
  assert plan["decode"]["decode_logits"] * gib == r * 100 * 4
  assert plan["prefill"]["prefill_cache"] * gib == r * 8 * kv_slot
  assert plan["prefill"]["prefill_scores"] * gib == 2 * r * 4 * 8 * 8 * 4
  # every layer's MLP weights and the embedding, gathered whole in float32 for the prefill
  assert plan["prefill"]["prefill_gathered"] * gib == 4 * (2 * 3 * 64 * 128 + 100 * 64)
  assert plan["persistent"]["params"] * gib == pytest.approx(4 * TOY_PARAMS / 8)
  assert plan["persistent"]["adam_moments"] * gib == pytest.approx(8 * TOY_PARAMS / 8)
  # No reference log-probs (DARS: no KL); 1,024 rows of 8 + 100 tokens over 8 devices.
  assert not plan["reference_pass"]
  assert plan["persistent"]["batch"] * gib == pytest.approx(1024 * (8 * 5 + 100 * 17) / 8)
  assert plan["update"]["grad_pass_temps"] == 1.5 and plan["micro_rows_per_device"] == 4
  sampling = (sum(plan["sampling_weights"].values()) +
              max(sum(plan["prefill"].values()), sum(plan["decode"].values())))
  assert plan["sampling_gib"] == pytest.approx(sampling)
  assert plan["peak_gib"] == pytest.approx(
      plan["persistent_gib"] + max(sampling, sum(plan["update"].values())))


def test_roofline_flops_by_hand(monkeypatch):
  from scripts.benchmarks import roofline

  cfg = _toy_run(monkeypatch, prompt=8, completion=24)
  a = roofline.arch("Toy")
  mm = 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128)  # layers' matmul weights
  head = 100 * 64
  # One row of 32 tokens scoring 24, blockwise attention (half the 32 x 32 square):
  # 2 x 32 x mm + 2 x 24 x head + 2 layers x 4 x 32^2 x (4 heads x 16) x 0.5.
  row = 2 * 32 * mm + 2 * 24 * head + 2 * 4 * 32 ** 2 * 64 * 0.5
  assert roofline.forward_flops(a, 32, 24, 0.5) == row
  work = roofline.step_work(cfg)
  assert work["update_flops"] == 1024 * 4 * row  # 1 epoch, forward + remat + backward
  assert work["reference_flops"] == 0 and work["sampler_calls"] == 2
  # 23 decode steps in one segment over 8 + 23 slots, 64 rows per device per chunk; the bytes
  # per device-step are the float32 attention projections whole, an eighth of the float32 MLP
  # and LM head, and the chunk's cache.
  (dec,) = work["decode"]
  assert (dec["steps"], dec["cache_slots"], dec["rows_per_device"]) == (2 * 23, 31, 64)
  assert dec["flops"] == 64 * (2 * mm + 2 * head + 2 * 4 * 31 * 64)
  attn = 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64)
  assert dec["bytes"] == 4 * (attn + (mm - attn + head) / 8) + 64 * 31 * (2 * 2 * 2 * 16 * 2)
  s = roofline.predict(work, roofline.H100)
  bound = max(dec["bytes"] / (3.35e12 * 0.6), dec["flops"] / (989e12 * 0.4))
  assert s["decode"] == pytest.approx(2 * 23 * bound)
  assert s["update"] == pytest.approx(1024 * 4 * row / 8 / (989e12 * 0.4))


def test_every_full_run_gets_a_row(tmp_path):
  from scripts.benchmarks import roofline

  names = {f"{e}:{n}" for e, n, _ in roofline.full_runs()}
  assert len(names) == 35
  assert {r["run"] for r in roofline.rows_of_runs()} == names
  # The whole step from the committed gradient-pass file: nothing is compiled.
  out = full_memory.main(["--whole-step", "--grad-from", str(GRAD_PLANS),
                          "--out", str(tmp_path / "step.json")])
  assert {r["run"] for r in out["rows"]} == names
  by_run = {r["run"]: r for r in out["rows"]}
  assert by_run["dars:dars-b-hw"]["rows"] == 3072 * 64
  assert by_run["ace:dapo"]["reference_pass"] and not by_run["dars:plain-n8"]["reference_pass"]
  assert all(r["peak_gib"] > r["persistent_gib"] > 0 for r in out["rows"])
