#!/usr/bin/env bash
# One command on a fresh machine: set up .venv and run the default CPU job end to end:
# SFT warm start (cached after the first run), then GRPO on multi-step arithmetic, printing test
# pass@1 before and after and writing runs/<name>/learning_curve.png.
source "$(dirname "$0")/_venv.sh" hf
python scripts/train.py experiments/grpo_arithmetic.py "$@"
