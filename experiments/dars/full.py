"""DARS / DARS-B at full size (accelerators): the official scripts' Qwen2.5-Math-1.5B setup.

Paper: "Depth-Breadth Synergy in RLVR" (DARS, DARS-B; arXiv 2508.13755). Its abstract gives no
hyperparameters; the values below are those of the official code (yangzhch6/DARS, a verl fork):
``experiments/DARS-1.5B-{ET,HW}-Breadth.sh`` for the breadth arms, and for the standard-breadth
arms the repository's earlier ``scripts/train/DARS-Qwen2.5-Math-1.5B-openr1-nothink-3k-func1-
bs128-pp2.sh`` (DARS) and ``scripts/train/Qwen2.5-Math-1.5B-openr1-nothink-3k.sh`` (GRPO
baseline). Comments mark every value that is not from there. The 7B runs of the paper use the
same scripts with ``MODEL_PATH`` set to Qwen2.5-Math-7B: pass ``policy=/path/to/Qwen2.5-Math-7B``.

Common to every arm: Qwen2.5-Math-1.5B, temperature 1.0, prompts <= 1,024 tokens, completions
<= 3,072 tokens, N = 8 rollouts per prompt in stage 1, the DARS objective (advantage r - mean
over the merged group without std, PPO clip 0.2 with verl's dual clip, token sum over a constant
length, entropy bonus 0.001, no KL and no reference model), AdamW with weight decay 0.01 and a
constant learning rate, gradient clip 1.0 (the fork's defaults).

* ``plain-n8``: the baseline, 128 prompts x 8, mini-batches of 64 prompts (2 updates per step),
  1 epoch, lr 1e-6.
* ``plain-n16``: the naive larger N of the CPU table (N = 16, otherwise ``plain-n8``; not an
  official script).
* ``dars-et`` / ``dars-hw``: DARS with the equal-treatment (n_max 32) / hardness-weighted
  (n_max 64) schedule, 128 prompts, mini-batches of 64 prompts, 1 epoch (the official DARS
  script makes 2; see Deviations), lr 1e-6.
* ``plain-breadth``: breadth without DARS (3,072 prompts, full-batch updates, 2 epochs, lr 5e-6,
  86 steps; the DARS-B scripts without the schedule).
* ``dars-b-et`` / ``dars-b-hw``: DARS-B, the breadth scripts: 3,072 prompts x 8 per step,
  mini-batch = full batch, 2 epochs (exactly 2 optimizer updates per step), lr 5e-6, 86 steps.

Data: the paper trains on its OpenR1-derived set and evaluates on its ``capacity_val`` set (the
DARS-Dataset ``openr1.parquet`` / ``capacity_val.parquet``, verl's layout):
``python scripts/prepare_data.py dars openr1.parquet capacity_val.parquet --out data/dars``
writes ``data/dars/train.jsonl`` and ``data/dars/test.jsonl`` (the system prompt of each source
row is kept in its record, not used). Evaluation as the breadth
scripts: 128 samples per problem at temperature 1.0 (pass@1..128).

Deviations: answers are checked by math-verify as verl's math reward calls it
(``answer_check=math_verify``, ``rlpost.tasks.answer_check``); the fork's reward calls
math-verify with its default extraction and the reference wrapped in ``$...$`` rather than
``\\boxed{}``; stage 2 samples what the schedule asks for, as the official code does, in
calls of ``STAGE2_CHUNK`` rows (as many as the step's demand needs, up to the schedule's
largest demand P x (n_max - N), so it never truncates: ``dars_truncated_fraction`` is logged
and is 0; the update skips the rows of calls not made), and the step's rows are split into
the configured number of mini-batches rather than mini-batches of a fixed size; the standard
DARS arms run 1 epoch per step like ``plain-n8`` (the official DARS script runs 2, so its
comparison with the baseline mixes the allocation with a second pass over the batch; the
breadth arms all run DARS-B's 2, as the breadth scripts do); the prompt is
Qwen2.5-Math's chain-of-thought chat prompt (the fork's own template, ``data.use_template``, is
not reproduced); the standard arms' step count is not stated in the paper's scripts (see
``STANDARD_STEPS``).

Command (one arm per run):

    python scripts/train.py experiments/dars/full.py:dars-b-et \\
        policy=/path/to/Qwen2.5-Math-1.5B \\
        task_spec='{"train": "data/dars/train.jsonl", "test": "data/dars/test.jsonl"}' \\
        mesh_fsdp=8 run_dir=runs/dars-b-et

or every arm x seed: ``python scripts/launch.py dars --seeds K --runs runs/dars policy=...
task_spec=... mesh_fsdp=8`` (``--dry-run`` prints the commands, ``--slurm TEMPLATE`` writes
an array job; finished runs are skipped).

Table: ``python scripts/reproduce.py dars --full --runs runs/dars`` judges the finished run
directories (plain-n8, plain-n16, dars-et, plain-breadth, dars-b-et) with the CPU table's code,
intervals and rules; it refuses runs of other weights, data or dtypes, and fewer seeds per arm
than the power plan (``experiments/full_size.py``: 6 at the stated SD 0.01 and this table's
smallest effect of interest, 0.02) unless ``--allow-underpowered``.

Hardware: accelerators; the official runs used one node of 8 GPUs (80 GB class) with vLLM
rollouts, FSDP and gradient checkpointing. Planned here for that node (``mesh_fsdp=8``): rollouts
sampled 512 rows at a time, per-layer rematerialisation, the LM head in 512-token chunks and
gradient micro-batches of at most 4 rows per device (``full_size.with_memory_plan``), blockwise
attention and layers stored stacked (``full_size.common``). XLA's memory analysis (compiled for
CPU, one device; not measured on an accelerator; ``python -m scripts.benchmarks.full_memory``):
the gradient pass of a micro-batch of 4 Qwen2.5-Math-1.5B rows of 1,024 + 3,072 tokens plans
8.3 GiB of temporaries beyond its inputs and outputs (the parameters and their gradients,
5.8 + 5.8 GiB); 25.2 GiB with the plain attention and the layers stored one by one. The whole
step per device (``full_memory --whole-step``): 19.2-20.5 GiB. Runtime: not measured; the
roofline (``scripts/benchmarks/roofline.py``, worst-case lengths, assumed utilisations) predicts
39 s per step for ``plain-n8`` and 1,361-10,890 s for the breadth arms on 8 x H100
(BENCHMARKS.md, "Whole step on paper"). Status: not run at full size here (no numbers);
``tests/experiments/test_full_configs.py`` builds every configuration at toy size and
trains one run of each kind for a step, and ``tests/experiments/test_dress_rehearsal.py``
runs the table's arms end to end at toy size on 8 simulated devices (converted data,
a tiny checkpoint of the family, the launcher's commands, a resume, the aggregator's table
over 2 seeds).
"""

from __future__ import annotations

from experiments import full_size
from rlpost.tasks import math_data

N = 8
STANDARD_PROMPTS = 128
BREADTH_PROMPTS = 3072
BREADTH_STEPS = 86
# Not given for the standard arms: the same number of prompts as the breadth arms' 86 steps
# (86 x 3072 / 128), the CPU table's rule for comparing breadths.
STANDARD_STEPS = BREADTH_STEPS * BREADTH_PROMPTS // STANDARD_PROMPTS


def _base() -> dict:
  return dict(
      full_size.common(),
      task="math", policy=full_size.policy_path("Qwen2.5-Math-1.5B"),
      task_spec={"train": "data/dars/train.jsonl", "test": "data/dars/test.jsonl"},
      num_train=10 ** 6, num_test=10 ** 6,  # every record of the files
      prompt_template=math_data.QWEN_MATH_TEMPLATE,
      max_prompt_tokens=1024, max_new_tokens=3072,
      recipe="dars", recipe_args={}, group_size=N,
      allocation="plain",  # the plain-* arms: DARS's objective, plain allocation
      weight_decay=0.01,  # the fork's AdamW default (fsdp_workers.py)
      eval_problems=0, eval_samples=128,  # all test problems, n_val 128
  )


def _standard(**kw) -> dict:
  return dict(_base(), num_prompts=STANDARD_PROMPTS, num_minibatches=2, lr=1e-6,
              steps=STANDARD_STEPS, eval_every=10, **kw)  # mini-batch 64 prompts; test_freq 10


def _breadth(**kw) -> dict:
  return dict(_base(), num_prompts=BREADTH_PROMPTS, num_minibatches=1, num_iterations=2,
              lr=5e-6, steps=BREADTH_STEPS, eval_every=14, **kw)  # test_freq 14


# Stage-2 rows per sampling call: the memory plan's rollout chunk (8 devices x 64 rows).
STAGE2_CHUNK = 512


def _dars(schedule: str, rule: str = "dars") -> dict:
  n_max = {"et": 32, "hw": 64}[schedule]
  return dict(allocation=rule, allocation_args=dict(schedule=schedule, n_max=n_max,
                                                     chunk=STAGE2_CHUNK))


FULL = {
    "plain-n8": _standard(num_iterations=1),
    "plain-n16": dict(_standard(num_iterations=1), group_size=2 * N),
    "dars-et": _standard(num_iterations=1, **_dars("et")),
    "dars-hw": _standard(num_iterations=1, **_dars("hw")),
    "plain-breadth": _breadth(),
    "dars-b-et": _breadth(**_dars("et", "dars_b")),
    "dars-b-hw": _breadth(**_dars("hw", "dars_b")),
}
FULL = {k: full_size.with_memory_plan(v) for k, v in FULL.items()}
CONFIG = FULL["dars-b-et"]
