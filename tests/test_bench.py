"""scripts/bench.py: the sampler benchmark runs at toy size and writes the documented JSON.

No timing assertions: the numbers depend on the machine and its load."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAVE_BASELINE = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))


def _load_bench():
  spec = importlib.util.spec_from_file_location("rlpost_bench", os.path.join(ROOT, "scripts",
                                                                             "bench.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


@pytest.fixture(scope="module")
def quick_result(tmp_path_factory):
  out = tmp_path_factory.mktemp("bench") / "sampler.json"
  cmd = [sys.executable, "scripts/bench.py", "sampler", "--quick", "--out", str(out)]
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(out.read_text()), proc.stdout


def test_sampler_quick_json(quick_result):
  data, stdout = quick_result
  assert data["benchmark"] == "sampler"
  assert "bench.py sampler --quick" in data["command"]
  for key in ("cpu_model", "cpu_cores", "jax", "jax_backend", "torch", "transformers"):
    assert key in data["machine"]
  settings = data["settings"]
  assert settings["quick"] and settings["decoding"] == "greedy"
  assert data["matmul_peak"]["gflops"] > 0
  assert "P_layers" in data["flop_formula"]
  rows = data["results"]
  assert [(r["model"], r["batch"]) for r in rows] == [("toy", b) for b in settings["batches"]]
  for r in rows:
    assert r["params"] > r["layer_matmul_params"] > 0
    assert r["new_tokens"] == settings["new_tokens"] and r["prompt_len"] == settings["prompt_len"]
    ours = r["rlpost"]
    assert len(ours["seconds"]) == r["repeats"] >= 2
    assert ours["tokens_per_s_min"] <= ours["tokens_per_s"] <= ours["tokens_per_s_max"]
    assert ours["gflops"] > 0 and r["roofline_fraction"] > 0
    if HAVE_BASELINE:
      theirs = r["transformers"]
      assert theirs["tokens_per_s"] > 0 and len(theirs["seconds"]) == r["repeats"]
      assert theirs["torch_threads"] in data["transformers_baseline"]["torch_threads"]
      assert r["ratio"] == pytest.approx(ours["tokens_per_s"] / theirs["tokens_per_s"])
      assert 0.0 <= r["token_agreement"] <= 1.0
    else:
      assert r["transformers"] is None and r["ratio"] is None
  # The human-readable table is printed too.
  assert "| model | params | batch |" in stdout


def test_flop_formula_by_hand():
  bench = _load_bench()
  cfg = bench.MODELS["toy"]  # E=32, 2 layers, H=4, K=2, D=8, F=64, V=64
  per_layer = 32 * 8 * (4 + 2 * 2) + 4 * 8 * 32 + 3 * 32 * 64
  assert bench.layer_matmul_params(cfg) == 2 * per_layer
  tp, n = 3, 2
  # Forward passes on 3 prompt tokens + 1 fed-back token; LM head for 2 new tokens; keys
  # attended: 1 + 2 + 3 (prefill) + 4 (decode step).
  expect = 2 * 2 * per_layer * 4 + 2 * 32 * 64 * 2 + 4 * 2 * 4 * 8 * (1 + 2 + 3 + 4)
  assert bench.generation_flops(cfg, 5, tp, n) == 5 * expect


def test_train_time_split_quick(tmp_path):
  out = tmp_path / "train.json"
  proc = subprocess.run([sys.executable, "scripts/bench.py", "train", "--quick", "--cache-dir",
                         str(tmp_path / "cache"), "--out", str(out)],
                        cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-4000:]
  data = json.loads(out.read_text())
  assert data["benchmark"] == "train"
  for k in ("sample_s", "score_s", "update_s", "fused_step_s"):
    assert data["results"][k] > 0
  assert "| update |" in proc.stdout
