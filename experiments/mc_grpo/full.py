"""MC-GRPO at full size (accelerators): the official code's MATH and GSM8K recipes.

Paper: "MC-GRPO: Median-Centered Group Relative Policy Optimization" (arXiv 2601.22582). Its
abstract gives no hyperparameters; the values below are those of the official code
(lotusroot-kim/MC-GRPO, TRL-based): ``recipes/math/Qwen2.5-Math-1.5B.yaml`` launched on 4
processes by ``scripts/GRPO_math.sh``, and ``recipes/gsm8k/Qwen2.5-1.5B-Instruct.yaml`` on the 2
processes of ``scripts/MCGRPO_gsm.sh`` (which launches the repository's Qwen3-1.7B GSM8K recipe
the same way). Comments mark every value that is not from there.

Arms (``FULL``), as the CPU table: for G in {2, 4, 8} gradient-contributing rollouts, ``mean``
(GRPO, G rollouts), ``mean_drop`` (G+1 rollouts, mean over all, the smallest |r| dropped: the
official ``mc=False`` same-compute ablation), ``mean_random`` (G+1 rollouts, mean over all, a
uniformly random rollout dropped: the unbiased control) and ``median`` (MC-GRPO, G+1 rollouts, median
baseline, MAD scale, pivot excluded; on GSM8K also the official GSM trainer's rescale of the
non-zero advantages by (G+1) / n_nonzero). The official trainer keeps the completions per step
fixed (per-device batch x processes) and divides them by G, so the prompts per step shrink as G
grows: MATH 64 / G, GSM8K 128 / G; MC-GRPO samples one extra rollout per prompt on top.

* ``math-G{g}-{baseline}``: Qwen2.5-Math-1.5B; MATH's 7,500 training problems, one epoch
  (7500 // P steps); evaluation on MATH-500. lr 1e-6, cosine decay with 10% linear warmup,
  2 optimizer updates per rollout batch (TRL ``num_iterations``), KL 0.04 (k3), PPO clip 0.2,
  temperature 1.0, prompts <= 512 tokens, completions <= 3,072 tokens; the recipe's system
  prompt in Qwen's chat format; reward = answer correctness only.
* ``gsm8k-G{g}-{baseline}``: Qwen2.5-1.5B-Instruct; GSM8K's 7,473 training problems, one epoch;
  evaluation on the GSM8K test set (1,319). lr 2e-6, completions <= 1,024 tokens, the GSM8K
  recipe's system prompt; reward = the GSM8K recipe's ``accuracy`` + ``format`` (weights 1.0):
  2.0 when the ``<answer>`` tag's text equals the reference, 1.5 when its one number does,
  plus 1.0 for any ``\\boxed{}`` (``graded_reward=true``,
  ``rlpost.tasks.math_data.mc_grpo_gsm8k_reward``; a completion counts as correct from 1.5);
  otherwise as MATH.

The MATH reward takes two values (0 or 2) and the GSM8K reward six, so ``reproduce.py mc_grpo
--full`` judges MATH runs in the 0/1 reward's claim family (``mc_grpo_01``) and GSM8K runs in
the graded one (``mc_grpo``), as the CPU table's two tables: a baseline can flip an advantage's
sign only under a graded reward.

Data: ``python scripts/prepare_data.py math MATH/ --out data/math`` (the MATH release's
``train/<subject>/<n>.json`` tree), ``prepare_data.py math500 MATH-500/test.jsonl --out
data/math500`` and ``prepare_data.py gsm8k gsm8k/main --out data/gsm8k`` (openai/gsm8k's
parquet files or the original jsonl): the paths below.

Deviations from the official code: MATH answers are checked by math-verify as verl's math
reward calls it (``answer_check=math_verify``, ``rlpost.tasks.answer_check``), while the
official MATH trainer calls it in open-r1's way (the reference parsed from the solution, the
completion as LaTeX with boxed answers first) and rewards 2 rather than 1 for a right answer
(the same advantages up to the scale's epsilon: every baseline here divides by a scale); TRL
truncates prompts longer than 512 tokens from the left, here they are dropped (logged); the
number of evaluation samples is not the official one (see ``EVAL``).

Command (one arm per run; every arm has the same shape of command):

    python scripts/train.py experiments/mc_grpo/full.py:math-G2-median \\
        policy=/path/to/Qwen2.5-Math-1.5B \\
        task_spec='{"train": "/path/to/math/train.jsonl", "test": "/path/to/math500/test.jsonl"}' \\
        mesh_fsdp=8 run_dir=runs/mc_grpo-math-G2-median

Hardware: accelerators; the official runs used 4 (MATH) and 2 (GSM8K) GPUs with vLLM rollouts,
DeepSpeed ZeRO-3 and gradient checkpointing. Planned here for one node of 8 (``mesh_fsdp=8``,
parameters and optimizer state sharded), with per-layer rematerialisation, the LM head in
512-token chunks and micro-batches of at most 4 rows per device (``full_size.with_memory_plan``:
4 where the mini-batch divides so, else 2 for the 80-row mini-batches of math-G4's G+1 arms and
3 for the 72- and 144-row ones of the G8 G+1 arms), blockwise attention and layers stored
stacked (``full_size.common``). XLA's memory analysis (compiled for CPU, one device; not
measured on an accelerator; ``python -m scripts.benchmarks.full_memory``): the gradient pass of
a micro-batch of 4 MATH rows (512 + 3,072 tokens) plans 7.9 GiB of temporaries and of 4 GSM8K
rows (512 + 1,024) 6.3 GiB, beyond its inputs and outputs (the parameters and their gradients,
5.8 + 5.8 GiB); 22.3 and 15.8 GiB with the plain attention and the layers stored one by one.
The whole step per device (``full_memory --whole-step``): 10.5-13.3 GiB. Runtime: not
measured; the roofline (``scripts/benchmarks/roofline.py``, worst-case lengths, assumed
utilisations) predicts 2.7-6.6 s per step on 8 x H100 (BENCHMARKS.md, "Whole step on paper").
Status: not run at full size here (no numbers); ``tests/experiments/test_full_configs.py`` builds every configuration at toy size and
trains one run of each kind for a step, and ``tests/experiments/test_dress_rehearsal.py``
runs the table's arms end to end at toy size on 8 simulated devices (converted data,
a tiny checkpoint of the family, the launcher's commands, a resume, the aggregator's table
over 2 seeds).
"""

from __future__ import annotations

import copy

from experiments import full_size
from experiments.mc_grpo.arms import arm_config

GROUP_SIZES = (2, 4, 8)
BASELINES = ("mean", "mean_drop", "mean_random", "median")
# Evaluation: pass@k from 8 samples per problem at the training temperature (not the official
# protocol, which reports TRL's eval accuracy; 8 keeps arms of every G comparable).
EVAL = dict(eval_samples=8)

_MATH_SYSTEM = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. And the answer should be of the following format: "
    "'Therefore, the final answer is: $\\boxed{{ANSWER}}$. I hope it is correct' (without "
    "quotes) where ANSWER is just the final number or expression that solves the problem. The "
    "reasoning process and answer are enclosed within <think> </think> and <answer> </answer> "
    "tags, respectively, i.e., <think> reasoning process here </think>\n<answer> answer here "
    "</answer>. ")
_GSM8K_SYSTEM = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. The reasoning process and answer are enclosed within "
    "<think> </think> and <answer> </answer> tags, respectively, i.e., <think> reasoning process "
    "here </think>\n<answer> answer here </answer>.")

# task, policy, data, lengths, learning rate and completions per step of each dataset's recipe
DATASETS = {
    "math": dict(
        task="math", policy=full_size.policy_path("Qwen2.5-Math-1.5B"),
        task_spec={"train": "data/math/train.jsonl", "test": "data/math500/test.jsonl"},
        num_train=7500, num_test=500, eval_problems=500,
        prompt_template=full_size.chat_template(_MATH_SYSTEM),
        max_prompt_tokens=512, max_new_tokens=3072, lr=1e-6,
        completions_per_step=16 * 4),  # per_device_train_batch_size x 4 processes
    "gsm8k": dict(
        task="gsm8k", policy=full_size.policy_path("Qwen2.5-1.5B-Instruct"),
        task_spec={"train": "data/gsm8k/train.jsonl", "test": "data/gsm8k/test.jsonl"},
        num_train=7473, num_test=1319, eval_problems=1319,
        prompt_template=full_size.chat_template(_GSM8K_SYSTEM),
        max_prompt_tokens=512, max_new_tokens=1024, lr=2e-6,
        graded_reward=True,  # the recipe's accuracy + format reward (mc_grpo_gsm8k_reward)
        completions_per_step=64 * 2),  # per_device_train_batch_size x 2 processes
}


def full_config(dataset: str, g: int, baseline: str) -> dict:
  """The RLConfig dict of one arm: ``dataset`` in DATASETS, G gradient rollouts, a baseline."""
  d = copy.deepcopy(DATASETS[dataset])
  p = d.pop("completions_per_step") // g
  steps = d["num_train"] // p  # one epoch (TRL num_train_epochs=1)
  iterations = 2  # TRL num_iterations: optimizer updates per rollout batch
  base = dict(
      full_size.common(), **d, **EVAL,
      num_prompts=p, steps=steps, num_iterations=iterations, num_minibatches=1,
      lr_schedule="cosine", lr_warmup_steps=round(0.1 * steps * iterations),  # warmup_ratio 0.1
      weight_decay=0.0,  # TRL default
      eval_every=50,  # eval_steps=100 optimizer updates
  )
  # The official GSM trainer rescales the median arm's non-zero advantages (mc=True); the MATH
  # trainer does not.
  cfg = arm_config(base, g, baseline, rescale=dataset == "gsm8k")
  if baseline == "mean":
    # TRL's GRPO scales by (std + 1e-4); KL 0.04 (beta) and clip 0.2 are the recipe defaults.
    cfg["recipe_args"] = dict(cfg["recipe_args"], std_eps=1e-4)
  return cfg


FULL = {f"{d}-G{g}-{b}": full_size.with_memory_plan(full_config(d, g, b))
        for d in DATASETS for g in GROUP_SIZES for b in BASELINES}
CONFIG = FULL["math-G2-median"]
