"""A one-minute smoke run: every stage of a run at toy size.

Command:  python scripts/train.py experiments/smoke.py        (or: bash scripts/quickstart.sh --smoke)
It builds a small arithmetic data set (1-2 digit addition), warm-starts a ~70k-parameter
character policy by SFT (cached), runs 20 GRPO steps with evaluations at steps 0, 10 and 20,
checkpoints and the learning curve, and prints test pass@1 before and after (about 0.3): a check
that the installation works, not a result. About a minute on 2 CPU cores (the first run; later
runs reuse the cached data and SFT policy).
"""

from experiments.grpo_arithmetic import CONFIG as _QUICKSTART

CONFIG = dict(
    _QUICKSTART,
    task_spec=dict(min_digits=1, max_digits=2, terms=2),
    num_train=500,
    num_test=100,
    model=dict(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128,
               max_seq_len=32),
    sft_steps=300,
    sft_batch_size=64,
    num_prompts=8,
    group_size=4,
    steps=20,
    eval_every=10,
    eval_problems=100,
    eval_samples=4,
    checkpoint_every=10,
)
