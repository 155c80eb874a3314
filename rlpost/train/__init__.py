"""Training: SFT warm start, GRPO-family RL loop, checkpoints, configs."""
