#!/usr/bin/env bash
# One command on a fresh machine: set up .venv and run the default CPU job end to end.
source "$(dirname "$0")/_venv.sh" hf
python scripts/quickstart.py "$@"
