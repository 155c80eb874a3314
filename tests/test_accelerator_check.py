"""scripts/benchmarks/accelerator_check.py at its tiny size on the CPU: both phases run, the
update moves the parameters, the memory figures are read, and an existing output or a bad flag
is refused with exit status 2."""

import json
import math

import jax
import pytest

from scripts.benchmarks import accelerator_check


@pytest.mark.slow
@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the tiny run is sized for the CPU")
def test_tiny_run_measures_both_phases_and_never_overwrites(tmp_path):
  out = tmp_path / "check.json"
  assert accelerator_check.main(["--tiny", "--out", str(out)]) == 0
  r = json.loads(out.read_text())
  assert r["complete"] is True and r["stopped"] is None
  assert r["backend"] == "cpu" and r["model"]["config"]["attention"] == "blockwise"
  assert r["model"]["params"] == r["model"]["params_from_config"] > 0
  update, sampler = r["phases"]["update"], r["phases"]["sampler"]
  for phase in (update, sampler):
    assert phase["compile_s"] > 0 and phase["first_run_s"] > 0 and phase["run_s"] > 0
    assert phase["tokens_per_s"] > 0
    measured, planned = phase["memory"]["measured"]["compiled"], phase["memory"]["planned"]
    for key in ("argument_bytes", "temp_bytes", "total_bytes"):
      assert measured[key] > 0 and planned[key] > 0
  assert math.isfinite(update["loss"]) and update["grad_norm"] > 0
  assert update["param_change_max_abs"] > 0
  sizes = r["sizes"]
  assert sampler["generated_tokens"] == sizes["rows"] * sizes["completion"] > 0
  assert sampler["finite_logprobs"]
  assert update["memory"]["planned_gradient_pass"]["temp_bytes"] > 0

  before = out.read_bytes()
  assert accelerator_check.main(["--tiny", "--out", str(out)]) == 2
  assert out.read_bytes() == before
  assert sorted(p.name for p in tmp_path.iterdir()) == ["check.json"]


@pytest.mark.parametrize("flags", [["--rows", "0"], ["--train-rows", "3"],
                                   ["--time-limit", "0"], ["--attention", "flash"]])
def test_bad_flags_exit_2_without_writing(tmp_path, flags):
  out = tmp_path / "check.json"
  assert accelerator_check.main(["--tiny", "--out", str(out), *flags]) == 2
  assert not out.exists()
