#!/usr/bin/env bash
# Regenerate requirements.lock: the exact versions of every package that scripts/test.sh's
# environment holds (rlpost with its test, hf, oracle and wandb extras), resolved afresh from
# pyproject.toml's ranges in a throwaway environment. scripts/_venv.sh installs with it as pip
# constraints, so quickstart.sh and test.sh get these versions on any machine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
"${PYTHON:-python3}" -m venv "$TMP/venv"
"$TMP/venv/bin/python" -m pip install -q --upgrade pip
"$TMP/venv/bin/python" -m pip install -q -e ".[test,hf,oracle,wandb]"
{
  echo "# The versions CI and the scripts install (scripts/_venv.sh installs rlpost's extras with this"
  echo "# file as pip constraints); pyproject.toml keeps the ranges for library users. Regenerate with"
  echo "# bash scripts/lock.sh after changing a dependency."
  # torch's local '+cpu' label is dropped: '==2.13.0' matches the CPU wheel wherever it comes from.
  "$TMP/venv/bin/python" -m pip freeze --exclude-editable --all \
    | grep -v '^pip==\|^setuptools==\|^wheel==\|^rlpost' | sed 's/+cpu$//'
} > requirements.lock.tmp
mv requirements.lock.tmp requirements.lock
echo "requirements.lock: $(grep -c '==' requirements.lock) packages"
