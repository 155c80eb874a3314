"""GRPO on multi-step arithmetic (1-4 digit addition), CPU size: the quickstart's job.

Command:  python scripts/train.py experiments/grpo_arithmetic.py [key=value ...]
Hardware: 2 CPU cores. Policy: 2-layer decoder, d=128, 4 heads, MLP 512 (~0.4M parameters),
character vocabulary. SFT warm start 500 steps at 1e-3 (cached), then GRPO with 16 prompts x G=8,
Adam 1e-4, global-norm clip 1.0, PPO clip 0.2, KL k3 x 0.04 (the GRPO recipe's defaults).
Evaluation: 500 test problems x 16 samples at temperature 1 (pass@k, k = 1..16) and greedy.
"""

CONFIG = dict(
    task="arithmetic",
    task_spec=dict(min_digits=1, max_digits=4, terms=2),
    num_train=10000,
    num_test=1000,
    recipe="grpo",
    num_prompts=16,
    group_size=8,
    lr=1e-4,
    steps=500,
    eval_every=100,
    eval_problems=500,
    eval_samples=16,
    checkpoint_every=100,
)
