#!/usr/bin/env bash
# One command on a fresh machine: set up .venv with the test extras and run the whole test suite;
# with no arguments, then the peer benchmarks' tests in .venv-peers (scripts/test_peers.sh;
# RLPOST_SKIP_PEERS=1 leaves them out).
source "$(dirname "$0")/_venv.sh" test,hf,oracle,wandb
# Two workers match this machine's two cores; each test process pins JAX to one CPU thread pool.
python -m pytest -n "${RLPOST_TEST_WORKERS:-2}" "$@"
if [ "$#" -eq 0 ] && [ "${RLPOST_SKIP_PEERS:-0}" != "1" ]; then
  deactivate
  bash "$ROOT/scripts/test_peers.sh"
fi
