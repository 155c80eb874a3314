"""scripts/bench.py: every benchmark runs at toy size and writes the documented JSON.

No timing assertions: the numbers depend on the machine and its load."""

import datetime
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import env_without_compilation_cache

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
  for key in ("date", "cpu_model", "cpu_cores", "loadavg_start", "loadavg_end", "jax",
              "jax_backend", "torch", "transformers"):
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
    assert ours["minor_faults_per_call"] >= 0 and ours["system_s_per_call"] >= 0
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


def test_host_record_dates_the_run_and_names_the_cpu():
  from scripts.benchmarks.common import host_record
  before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
  record = host_record()
  when = datetime.datetime.fromisoformat(record["date"])
  assert when.utcoffset() == datetime.timedelta(0)
  assert before <= when <= datetime.datetime.now(datetime.timezone.utc)
  assert record["cpu_model"] and record["cpu_cores"] >= 1
  load = record["loadavg_start"]
  assert load is None or (len(load) == 3 and min(load) >= 0)
  json.dumps(record)  # goes into the --out JSON as it is


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


def test_training_flops_by_hand():
  bench = _load_bench()
  cfg = bench.MODELS["toy"]  # E=32, 2 layers, H=4, D=8, V=64
  per_layer = 32 * 8 * (4 + 2 * 2) + 4 * 8 * 32 + 3 * 32 * 64
  t = 3 + 2
  fwd = 2 * 2 * per_layer * t + 4 * 2 * 4 * 8 * (1 + 2 + 3 + 4 + 5) + 2 * 32 * 64 * 2
  from scripts.benchmarks.common import training_flops
  assert training_flops(cfg, 7, 3, 2, reference=False) == {"forward": 7 * fwd, "update": 21 * fwd}
  assert training_flops(cfg, 7, 3, 2, reference=True)["update"] == 28 * fwd


HAVE_TRL = HAVE_BASELINE and importlib.util.find_spec("trl") is not None


def _run_bench(tmp_path, *args):
  out = tmp_path / "bench.json"
  proc = subprocess.run([sys.executable, "scripts/bench.py", *args, "--out", str(out)],
                        cwd=ROOT, capture_output=True, text=True, timeout=900,
                        env=env_without_compilation_cache())
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(out.read_text()), proc.stdout


def test_train_vs_trl_quick(tmp_path):
  data, stdout = _run_bench(tmp_path, "train", "--quick", "--data-dir", str(tmp_path / "data"))
  assert data["benchmark"] == "train"
  rows = data["results"]
  assert [r["beta"] for r in rows] == data["settings"]["betas"] == [0.0, 0.04]
  for r in rows:
    assert r["compilations"] == 1
    ours = r["rlpost"]
    assert len(ours["seconds"]) == data["settings"]["repeats"]
    assert ours["min_s"] <= ours["median_s"] <= ours["max_s"]
    for k in ("sample_s", "score_s", "update_s", "fused_step_s"):
      assert r["split"][k] > 0
    f = r["flops"]
    assert f["sample"] > 0 and f["update"] > 0 and f["peak_gflops"] > 0
    assert f["step_at_peak_s"] == pytest.approx((f["sample"] + f["update"]) / f["peak_gflops"] / 1e9)
    if HAVE_TRL:
      theirs = r["trl"]
      assert len(theirs["seconds"]) == len(ours["seconds"])
      assert r["ratio"] == pytest.approx(theirs["median_s"] / ours["median_s"])
      assert set(theirs["split"]) == {"generate_s", "score_and_ref_s", "update_s"}
      assert theirs["split"]["generate_s"] > 0
    else:
      assert r["trl"] is None and r["ratio"] is None
  assert "| beta | rlpost ms/step" in stdout


def test_scaling_quick(tmp_path):
  data, stdout = _run_bench(tmp_path, "scaling", "--quick", "--data-dir", str(tmp_path / "data"))
  rows = data["results"]
  sweeps = {r["sweep"] for r in rows}
  assert sweeps == {"batch", "sequence", "model"}
  for r in rows:
    assert r["median_s"] > 0 and r["tokens"] == r["rollouts"] * (r["prompt_len"] + r["new_tokens"])
    # One compilation of the fused step per distinct shape, none in later steps.
    assert r["compiles_later"] == 0 and r["step_traces"] == 1
  assert [r["rollouts"] for r in rows if r["sweep"] == "batch"] == [4, 8]
  assert [r["new_tokens"] for r in rows if r["sweep"] == "sequence"] == [4, 8]
  first = {s: next(r for r in rows if r["sweep"] == s) for s in sweeps}
  assert all(first[s]["vs_linear"] == pytest.approx(1.0) for s in sweeps)
  comp = data["compilations"]
  assert comp["compilations_after_first"] == 0 and comp["compilations_per_step"][0] >= 1
  assert "| sweep | rollouts |" in stdout


def test_ablate_quick(tmp_path):
  data, stdout = _run_bench(tmp_path, "ablate", "--quick")
  assert data["benchmark"] == "ablate"
  assert "all on" in stdout and "all off" in stdout


@pytest.mark.skipif(importlib.util.find_spec("tunix") is not None,
                    reason="Tunix is installed: tests/peers runs the real peer")
def test_peer_tunix_missing_runs_rlpost_alone(tmp_path):
  """``--peer tunix`` without the peers extra says so in one line and times rlpost alone."""
  data, stdout = _run_bench(tmp_path, "sampler", "--quick", "--peer", "tunix")
  assert "Tunix baseline skipped" in stdout
  assert data["peer"] == "tunix" and data["tunix_baseline"] is None
  for r in data["results"]:
    assert r["baseline"] == "tunix" and r["tunix"] is None and r["ratio"] is None
    assert r["rlpost"]["tokens_per_s"] > 0


def test_train_packed_quick(tmp_path):
  """``--pack-buckets`` times rlpost's padding-free update (one compilation, as padded)."""
  data, _ = _run_bench(tmp_path, "train", "--quick", "--no-trl", "--betas", "0",
                       "--pack-buckets", "0.5,0.875", "--data-dir", str(tmp_path / "data"))
  assert data["settings"]["config"]["pack_buckets"] == [0.5, 0.875]
  (row,) = data["results"]
  assert row["compilations"] == 1 and row["trl"] is None
  assert row["rlpost"]["median_s"] > 0 and row["split"]["update_s"] > 0
  # The packed path ran: it reports the slots holding real tokens and the slots it computed
  # (one of the buckets, or all of them), as shares of the padded layout.
  ours = row["rlpost"]
  assert 0 < ours["mean_real_tokens_share"] <= ours["mean_packed_slots_share"] <= 1
