"""The ACE experiment runs end to end at toy size and judges only the pre-declared arm."""

import json
import os

import pytest

from experiments import ace
from scripts import reproduce


def test_arms_and_configs():
  sz = ace.Sizes()
  spec = ace.arms(sz)
  assert spec["grpo"] is None and ace.MAIN in spec
  assert ace.arm_config({}, spec["grpo"])["recipe"] == "grpo"
  cfg = ace.arm_config({}, spec[f"ace-relu-mul-{sz.main_alpha}"])
  assert cfg["recipe"] == "ace" and cfg["recipe_args"] == {"alpha": sz.main_alpha, "fn": "relu"}


@pytest.mark.slow
def test_reproduce_ace_quick(tmp_path):
  out = tmp_path / "ace"
  reproduce.main(["ace", "--quick", "--out", str(out), "--no-progress"])
  for name in ("table.md", "results.json", "passk.png", "training.png"):
    assert os.path.getsize(out / name) > 0, name
  res = json.loads((out / "results.json").read_text())
  s = res["summary"]
  assert s["ks"] == [1, 2, 4, 8] and s["main"] == "ace-softplus-mul-0.5"
  assert set(s["verdicts"].values()) <= {"reproduced", "not reproduced", "inconclusive"}
  for arm in res["arms"].values():
    assert arm["compilations"] == 1
    assert len(arm["train"]["overconfident_errors"]) == res["sizes"]["steps"]
  assert "## Paper claims" in (out / "table.md").read_text()
