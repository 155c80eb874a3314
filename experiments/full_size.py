"""Shared pieces of the experiments' full-size configurations (``experiments/*/full.py``).

A full-size configuration is a dict of ``RLConfig`` values that follows a paper's setup: a
Hugging Face policy and GSM8K / MATH-format data, both read from local files (nothing is
downloaded). Paths in the dicts are placeholders under ``checkpoints/`` and ``data/``; pass the
real ones as overrides::

    python scripts/train.py experiments/mc_grpo/full.py:math-G2-median \\
        policy=/models/Qwen2.5-Math-1.5B \\
        task_spec='{"train": "/data/math/train.jsonl", "test": "/data/math500/test.jsonl"}'

The placeholder checkpoint's directory name is the policy's name in ``POLICIES``, which records
the architecture of its published config.json, so a test can build a tiny random model of the
same family (same flags, smaller widths) and run every configuration for a step.

Data files: ``scripts/prepare_data.py NAME SRC --out data/NAME`` converts each paper's set from
its published files (GSM8K, MATH, MATH-500, AIME, DAPO-Math-17K, the DARS sets, any verl-style
parquet; ``rlpost.tasks.convert``) into the project's record format, ``data/NAME/<split>.jsonl``
with a manifest beside it: the paths the configurations name. The tasks also read GSM8K's own
jsonl (``question``, ``answer`` "... #### 72") and MATH-format json / jsonl records (``problem``
and ``answer`` or a ``solution`` holding a ``\\boxed{}`` answer, an optional ``level``).
"""

from __future__ import annotations

import dataclasses

# Architecture of each policy's published config.json (Qwen2ForCausalLM: q/k/v biases, SwiGLU,
# RMSNorm, RoPE without scaling). Widths are listed for reference; tests mirror the flags
# (architecture, tied embeddings, rope_theta, rms_norm_eps, context length, query heads per
# key-value head) at a tiny width.
POLICIES = {
    "Qwen2.5-Math-1.5B": dict(
        architecture="qwen2", hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2,
        intermediate_size=8960, vocab_size=151936, max_seq_len=4096, rope_theta=10000.0,
        rms_norm_eps=1e-6, tie_embeddings=True),
    "Qwen2.5-Math-7B": dict(
        architecture="qwen2", hidden_size=3584, num_layers=28, num_heads=28, num_kv_heads=4,
        intermediate_size=18944, vocab_size=152064, max_seq_len=4096, rope_theta=10000.0,
        rms_norm_eps=1e-6, tie_embeddings=False),
    "Qwen2.5-1.5B-Instruct": dict(
        architecture="qwen2", hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2,
        intermediate_size=8960, vocab_size=151936, max_seq_len=32768, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_embeddings=True),
}

# Settings every full-size run shares: the checkpoint is the starting policy (no SFT), bfloat16
# matmuls over float32 parameters and optimizer state (as FSDP mixed precision in verl / TRL),
# parameters and optimizer state sharded over the mesh's fsdp axis (set ``mesh_fsdp`` to the
# number of devices), and Qwen chat turns ending at ``<|im_end|>`` (the base checkpoints' own
# eos is ``<|endoftext|>``).
def common() -> dict:
  """A fresh dict of these shared settings."""
  return dict(
      sft_steps=0,
      # Answers checked as the papers' trainers check them: math-verify, called as verl's math
      # reward calls it (rlpost.tasks.answer_check).
      answer_check="math_verify",
      # Memory (values unchanged): blockwise attention (on GPUs "cudnn" is the fast choice of
      # the same memory class) and layers stored stacked, which the remat scan reads in place.
      model=dict(dtype="bfloat16", param_dtype="float32", attention="blockwise",
                 stacked_layers=True),
      param_sharding="fsdp",
      extra_stop_tokens=("<|im_end|>",),
      temperature=1.0,
      top_p=1.0,
      grad_clip=1.0,
      checkpoint_every=50,
      eval_batch=1024,
      # Memory (values unchanged): per-layer rematerialisation and the LM head over 512-token
      # chunks; ``with_memory_plan`` adds gradient and rollout micro-batching per run.
      remat=True,
      logits_chunk=512,
  )


# The power plan of every full-size table (experiments/STATISTICS.md step 5): the seeds per arm
# that give each claim's smallest effect of interest 80% power at alpha 0.05 for this seed SD of
# the primary metric. No full-size run exists to measure it, so it is stated, not measured:
# evaluation noise alone is about 0.007 for MATH-500 pass@1 from 4 samples per problem
# (sqrt(0.1 / (500 x 4)), p(1 - p) ~ 0.1 per problem), and training seeds add to it. Replace
# it with the SD of a pilot's seeds when there is one; ``reproduce.py NAME --full`` refuses
# fewer seeds than the plan asks for unless --allow-underpowered is given.
SEED_SD = 0.01
SEED_SD_SOURCE = ("stated, not measured: experiments/full_size.py SEED_SD, evaluation noise of "
                  "~0.007 plus training seeds")
FULL_MIN_SEEDS = 2


def power_fields() -> dict:
  """The Design fields of a full-size table's power plan: the stated SD, its source and the
  floor of seeds per arm (two: an interval needs a spread)."""
  return dict(pilot_sd=SEED_SD, sd_source=SEED_SD_SOURCE, min_seeds=FULL_MIN_SEEDS)


# Devices a full-size run is planned for (one node), training rows per device per micro-batch,
# and rollout rows per device per sampling chunk.
DEVICES = 8
TRAIN_ROWS_PER_DEVICE = 4
ROLLOUT_ROWS_PER_DEVICE = 64


def with_memory_plan(cfg: dict, *, devices: int = DEVICES,
                     train_rows_per_device: int = TRAIN_ROWS_PER_DEVICE,
                     rollout_rows_per_device: int = ROLLOUT_ROWS_PER_DEVICE) -> dict:
  """``cfg`` with ``grad_accum`` and ``rollout_chunk`` sized for ``devices`` devices (pass
  ``mesh_fsdp=<devices>`` when launching; a config fixing it would not validate elsewhere).

  grad_accum splits each optimizer mini-batch into micro-batches of at most
  ``train_rows_per_device`` rows per device: the fewest micro-batches that divide the mini-batch
  into equal parts, each a multiple of ``devices`` rows (what ``RLConfig.validate`` requires).
  Such a split exists whenever the mini-batch is a multiple of ``devices`` (one row per device
  at worst); otherwise this raises. Mini-batches with few divisors get smaller micro-batches
  than the bound (80 rows: 5 x 16, not 2 x 40). rollout_chunk samples
  ``rollout_rows_per_device`` rows per device at a time when that divides every sampling call.
  Measured with XLA's memory analysis (compiled for CPU, one device, the settings of
  ``common``: bfloat16 compute over float32 parameters, remat, 512-token logits chunks,
  blockwise attention, layers stored stacked; ``python -m scripts.benchmarks.full_memory``):
  the gradient pass of a micro-batch of 4 Qwen2.5-Math-1.5B rows of 512 + 3,072 tokens plans
  7.9 GiB of temporaries and of 4 GSM8K rows of 512 + 1,024 tokens 6.3 GiB, beyond its inputs
  and outputs (the parameters and their gradients, 5.8 + 5.8 GiB); without remat and chunks a
  3,584-token row needed 69 GiB.
  """
  out = dict(cfg)
  plan = sampling_plan(cfg)
  rows = plan.rows
  mb = rows // cfg.get("num_minibatches", 1)
  if mb % devices:
    raise ValueError(f"with_memory_plan: the mini-batch of {mb} rows cannot be split evenly over "
                     f"{devices} devices; change num_prompts, group_size or num_minibatches")
  cap = devices * train_rows_per_device
  out["grad_accum"] = next(a for a in range(-(-mb // cap), mb // devices + 1)
                           if mb % a == 0 and (mb // a) % devices == 0)
  calls = plan.calls
  chunk = devices * rollout_rows_per_device
  out["rollout_chunk"] = chunk if all(c % chunk == 0 for c in calls) and max(calls) > chunk else 0
  return out


def sampling_plan(cfg: dict):
  """The rows of each sampling call and of the step's batch of an RLConfig dict
  (``rlpost.rollouts.allocate.Plan``), after the rule's own checks, without validating the
  rest of the config."""
  from rlpost.train.rl_config import RLConfig

  cfg = RLConfig.upgrade(dict(cfg))
  known = {f.name for f in dataclasses.fields(RLConfig)}
  return dataclasses.replace(RLConfig(), **{k: v for k, v in cfg.items() if k in known}
                             ).allocation_plan()


def policy_path(name: str) -> str:
  """Placeholder checkpoint directory of policy ``name`` (its basename is the name)."""
  if name not in POLICIES:
    raise ValueError(f"unknown policy {name!r}; known: {sorted(POLICIES)}")
  return f"checkpoints/{name}"


def chat_template(system: str) -> str:
  """A Qwen chat prompt with ``system`` as the system turn and the question as the user turn,
  ending where the assistant's turn begins (``apply_chat_template(...,
  add_generation_prompt=True)`` of the Qwen2.5 tokenizers)."""
  return (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n" + "{question}" +
          "<|im_end|>\n<|im_start|>assistant\n")
