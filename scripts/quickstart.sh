#!/usr/bin/env bash
# One command on a fresh machine: set up .venv and run the default CPU job end to end:
# SFT warm start (cached after the first run), then GRPO on multi-step arithmetic, printing test
# pass@1 before and after and writing runs/<name>/learning_curve.png.
# With --smoke first: the one-minute smoke run (experiments/smoke.py) instead.
source "$(dirname "$0")/_venv.sh" hf
config=experiments/grpo_arithmetic.py
if [ "${1:-}" = "--smoke" ]; then
  config=experiments/smoke.py
  shift
fi
python scripts/train.py "$config" "$@"
