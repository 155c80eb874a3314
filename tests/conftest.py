"""Shared test helpers."""

import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run, so CI results are reproducible.
settings.register_profile("rlpost", derandomize=True, deadline=None)
settings.load_profile("rlpost")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_with_devices(code: str, num_devices: int = 8, timeout: int = 600) -> str:
  """Run ``code`` in a fresh Python process with ``num_devices`` simulated CPU devices.

  Returns stdout; raises with the child's stderr if it fails.
  """
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                      f" --xla_force_host_platform_device_count={num_devices}").strip()
  env["JAX_PLATFORMS"] = "cpu"
  proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=timeout)
  if proc.returncode != 0:
    raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
  return proc.stdout


@pytest.fixture
def with_devices():
  return run_with_devices
