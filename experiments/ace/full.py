"""ACE at full size (accelerators): Qwen2.5-Math-7B on DAPO-Math-17K with DAPO, in verl's recipe.

Paper: "ACE: Asymmetric Confidence-aware Error Penalty". Its abstract states the setup (fine-tune
Qwen2.5-Math-7B, Qwen3-8B-Base and Llama-3.1-8B-Instruct on DAPO-Math-17K with GRPO and DAPO in
verl; evaluate pass@k on MATH-500 and AIME 2025) but no hyperparameters, and no code is public.
The values below are therefore verl's own DAPO recipe for this model and data,
``recipe/dapo/test_dapo_7b_math.sh`` (volcengine/verl): none of them is the paper's. ACE's alpha
has no published default: the arms sweep it as the CPU table does (0.1, 0.5, 2.0; the
pre-declared main arm is 0.5, multiplicative softplus).

verl's DAPO recipe, as used here: 512 prompts x 16 rollouts per step, mini-batches of 32 prompts
(16 optimizer updates per step, one epoch), lr 1e-6 with 10 scheduler steps of linear warmup
then constant, weight decay 0.1, gradient clip 1.0, clip-higher 0.2 / 0.28, dual clip c = 10,
token-mean loss, no KL, prompts <= 2,048 tokens, completions <= 8,192 tokens with a 4,096-token
overlong buffer (penalty 1.0), temperature 1.0, 200 steps, evaluation every 10 steps. verl
raises the model's ``max_position_embeddings`` to 32,768 for these lengths (Qwen2.5-Math-7B's
config.json says 4,096); ``model.max_seq_len`` does the same here.

Arms (``FULL``): ``dapo`` (the baseline) and ``ace-dapo-{alpha}`` (ACE over DAPO; it needs the
reference policy's log-probs although the KL coefficient is 0). Qwen3-8B-Base and
Llama-3.1-8B-Instruct are not covered (rlpost loads Qwen2 and Llama checkpoints, but their
settings are not stated); neither are the paper's GRPO arms (settings not stated).

Data: ``python scripts/prepare_data.py dapo_math_17k dapo-math-17k.parquet --out
data/dapo_math_17k`` (DAPO's instruction around each problem removed, the published file's
repeated problems dropped; the manifest counts them) and ``prepare_data.py math500 test.jsonl
--out data/math500`` for the test file (or ``prepare_data.py aime`` for AIME 2025, the second
benchmark). Evaluation: pass@k for k = 1..32 from 32 samples per problem at temperature 1.0
(the paper's k range and sample count are not stated in the abstract).

Deviations: answers are checked by math-verify as verl's math reward calls it
(``answer_check=math_verify``, ``rlpost.tasks.answer_check``) instead of verl's DAPO reward (which
reads the "Answer:" line DAPO's instruction asks for); the prompt is Qwen2.5-Math's
chain-of-thought chat prompt (``prepare_data.py dapo_math_17k`` removes DAPO's own instruction
from each problem); verl's scheduler advances once per rollout batch, here once per optimizer update,
so its 10 warmup steps become 160 updates.

Command (one arm per run):

    python scripts/train.py experiments/ace/full.py:ace-dapo-0.5 \\
        policy=/path/to/Qwen2.5-Math-7B \\
        task_spec='{"train": "data/dapo_math_17k/train.jsonl", "test": "data/math500/test.jsonl"}' \\
        mesh_fsdp=8 run_dir=runs/ace-dapo-0.5

Hardware: accelerators; verl's recipe is written for 8 nodes x 8 GPUs with sequence parallelism,
gradient checkpointing and parameter offload. Planned here with rollouts sampled 128 rows at a
time, per-layer rematerialisation, the LM head in 512-token chunks and one row per device per
gradient micro-batch (``full_size.with_memory_plan``), blockwise (flash) attention and layers
stored stacked (``full_size.common``). XLA's memory analysis (compiled for CPU, one device; not
measured on an accelerator; ``python -m scripts.benchmarks.full_memory``) puts the gradient
pass of one 10,240-token row of the 7B model at 9.5 GiB of temporaries beyond its inputs and
outputs (the parameters and their gradients, 28.4 + 28.4 GiB unsharded); with the plain
attention and the layers stored one by one it was 87.7 GiB (BENCHMARKS.md, "One full-size
training row"). The whole step per device (``full_memory --whole-step``): 61.8 GiB by the
arithmetic, 68.8 with XLA's plan of the sampler, over JAX's default 75% of an 80 GB GPU (raise
``XLA_PYTHON_CLIENT_MEM_FRACTION``). Runtime: not measured; the roofline
(``scripts/benchmarks/roofline.py``, worst-case lengths, assumed utilisations) predicts 5,583 s
per step on 8 x H100, most of it decode (BENCHMARKS.md, "Whole step on paper"). Status: not run
at full size here (no numbers); ``tests/experiments/test_full_configs.py`` builds every configuration at toy size and
trains one run of each kind for a step, and ``tests/experiments/test_dress_rehearsal.py``
runs the table's arms end to end at toy size on 8 simulated devices (converted data,
a tiny checkpoint of the family, the launcher's commands, a resume, the aggregator's table
over 2 seeds).
"""

from __future__ import annotations

from experiments import full_size
from rlpost.tasks import math_data

ALPHAS = (0.1, 0.5, 2.0)
MAIN_ALPHA = 0.5
PROMPTS = 512
MINI_BATCH_PROMPTS = 32
MAX_NEW_TOKENS = 8 * 1024


def _base() -> dict:
  cfg = full_size.common()
  cfg["model"] = dict(cfg["model"], max_seq_len=32768)  # verl's max_position_embeddings override
  return dict(
      cfg,
      task="math", policy=full_size.policy_path("Qwen2.5-Math-7B"),
      task_spec={"train": "data/dapo_math_17k/train.jsonl", "test": "data/math500/test.jsonl"},
      num_train=10 ** 6, num_test=10 ** 6,  # every record of the files
      prompt_template=math_data.QWEN_MATH_TEMPLATE,
      max_prompt_tokens=2 * 1024, max_new_tokens=MAX_NEW_TOKENS,
      num_prompts=PROMPTS, group_size=16, num_minibatches=PROMPTS // MINI_BATCH_PROMPTS,
      num_iterations=1, steps=200,
      lr=1e-6, lr_schedule="constant", lr_warmup_steps=10 * (PROMPTS // MINI_BATCH_PROMPTS),
      weight_decay=0.1,
      eval_every=10, eval_problems=0, eval_samples=32,  # all test problems
      # the reference pass every step, so that the DAPO arm logs the confidence diagnostics
      # (overconfident errors, confidence-shift quantiles) that the table compares
      log_confidence=True,
  )


# DAPO as in verl's recipe: overlong buffer 4096 of 8192, dual clip c = 10 (clip_ratio_c).
DAPO_ARGS = dict(overlong_buffer=4 * 1024, dual_clip=10.0)


def full_config(alpha: float | None) -> dict:
  """The RLConfig dict of the DAPO baseline (alpha None) or of ACE over DAPO with ``alpha``."""
  if alpha is None:
    return dict(_base(), recipe="dapo", recipe_args=dict(DAPO_ARGS))
  return dict(_base(), recipe="ace",
              recipe_args=dict(DAPO_ARGS, base="dapo", alpha=alpha, mode="multiplicative",
                               fn="softplus"))


FULL = {"dapo": full_config(None), **{f"ace-dapo-{a}": full_config(a) for a in ALPHAS}}
# One 10,240-token row per device per micro-batch, 16 rollout rows per device at a time.
FULL = {k: full_size.with_memory_plan(v, train_rows_per_device=1, rollout_rows_per_device=16)
        for k, v in FULL.items()}
CONFIG = FULL[f"ace-dapo-{MAIN_ALPHA}"]
