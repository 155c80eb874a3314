"""experiments/portability.py: the committed table follows from its results.json, and the
variants it records moved where the README says they did."""

import json
import os

import numpy as np

from experiments import portability

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "results", "portability")


def test_committed_table_renders_from_its_results():
  with open(os.path.join(OUT, "results.json")) as f:
    report = json.load(f)
  with open(os.path.join(OUT, "table.md")) as f:
    assert portability.render(report) == f.read()
  v = report["variants"]
  assert set(v) == set(portability.VARIANTS)
  # One code path twice: bitwise the same start and the same trained weights.
  assert v["default"]["sft_digest"] == v["default-again"]["sft_digest"]
  assert v["default"]["rl_digest"] == v["default-again"]["rl_digest"]
  # Another instruction set: another start, and RL weights that moved apart.
  assert v["avx2"]["sft_digest"] != v["default"]["sft_digest"]
  assert v["avx2"]["sft_max_abs_diff_vs_default"] > 0
  assert v["avx2"]["rl_digest"] != v["default"]["rl_digest"]
  # The default path's start is the pinned testbed.
  from experiments import testbeds
  assert v["default"]["sft_digest"] == testbeds.PINNED["b23-sft"]
  # Another host (CPU model, jax version, a GPU): other starts; the RL arm from the pin agrees
  # on pass@1 within 0.003 per seed (the README's statement).
  assert report["hosts"] and report["old_code"]
  for host in report["hosts"].values():
    for r in host.values():
      assert r["sft_digest"] != v["default"]["sft_digest"] and r["sft_max_abs_diff_vs_pin"] > 0
      assert max(abs(a - b) for a, b in zip(r["rl_pass1"], v["default"]["rl_pass1"])) <= 0.003
  # Other code versions retrain, on this host's code path, the pinned start itself; one with the
  # pin trains the RL arm to the default variant's weights, bitwise (two code versions, one
  # arithmetic).
  for r in report["old_code"].values():
    assert r["bitwise_equal_to_pin"]
  with_rl = [r for r in report["old_code"].values() if "rl_digest" in r]
  assert with_rl and all(r["rl_bitwise_equal_to_default"] for r in with_rl)
  assert all(r["rl_pass1"] == v["default"]["rl_pass1"] for r in with_rl)


def test_old_code_refuses_what_is_not_a_commit(tmp_path):
  import pytest

  (tmp_path / "results.json").write_text("{}")
  with pytest.raises(ValueError, match="--old-code nosuch: not a commit of this repository"):
    portability.old_code("nosuch", str(tmp_path))


def _host_dir(tmp_path, record: dict | None, last_line: str | None = None):
  import shutil

  from experiments import testbeds

  d = tmp_path / "host" / "cpu"
  d.mkdir(parents=True)
  shutil.copy(testbeds.path("b23-sft"), d / "cpu-x.npz")
  text = last_line if record is None else json.dumps(dict(record, sft_file="/elsewhere/cpu-x.npz"))
  (d / "record.json").write_text("building data...\n" + text + "\n")
  return tmp_path / "host"


def test_add_host_adds_rows_compared_with_the_pin(tmp_path):
  out = tmp_path / "out"
  out.mkdir()
  with open(os.path.join(OUT, "results.json")) as f:
    committed = json.load(f)
  (out / "results.json").write_text(json.dumps(dict(committed, hosts={})))
  row = dict(committed["variants"]["default"])
  row.pop("xla_flags"), row.pop("sft_max_abs_diff_vs_default")
  portability.add_host(str(_host_dir(tmp_path, row)), "other", str(out))
  report = json.loads((out / "results.json").read_text())
  assert report["hosts"]["other"]["cpu"]["sft_max_abs_diff_vs_pin"] == 0.0  # the pin itself
  assert "## Host other" in (out / "table.md").read_text()


def test_add_host_refuses_what_it_cannot_read(tmp_path):
  import pytest

  out = tmp_path / "out"
  out.mkdir()
  with pytest.raises(ValueError, match="run python -m experiments.portability first"):
    portability.add_host(str(tmp_path), "x", str(out))
  (out / "results.json").write_text("{}")
  host = _host_dir(tmp_path, None, last_line="Traceback (most recent call last):")
  with pytest.raises(ValueError, match=r"cpu/record.json: its last line is not a variant"):
    portability.add_host(str(host), "x", str(out))
  with pytest.raises(ValueError, match="needs --label"):
    portability.add_host(str(host), "", str(out))
  with pytest.raises(ValueError, match="is not a directory"):
    portability.add_host(str(tmp_path / "missing"), "x", str(out))
  # A record without its file, and a file of another model: one line naming the file.
  (host / "cpu" / "record.json").write_text('{"sft_digest": "x"}\n')
  with pytest.raises(ValueError, match=r"cpu/record.json: its last line is not a variant"):
    portability.add_host(str(host), "x", str(out))
  (host / "cpu" / "record.json").write_text('{"sft_file": "cpu-x.npz"}\n')
  np.savez(host / "cpu" / "cpu-x.npz", w=np.zeros(3))
  with pytest.raises(ValueError, match=r"cpu-x.npz: its leaves are not the pinned start's"):
    portability.add_host(str(host), "x", str(out))


def test_a_rerun_of_the_variants_keeps_what_was_added(tmp_path, monkeypatch):
  with open(os.path.join(OUT, "results.json")) as f:
    committed = json.load(f)
  (tmp_path / "results.json").write_text(json.dumps(committed))
  calls = []

  class Done:
    returncode = 0
    stdout = json.dumps(dict(committed["variants"]["default"], sft_file=str(tmp_path / "s.npz")))

  def fake_run(cmd, **kw):
    calls.append(cmd)
    return Done()

  import shutil

  from experiments import testbeds

  shutil.copy(testbeds.path("b23-sft"), tmp_path / "s.npz")
  monkeypatch.setattr(portability.subprocess, "run", fake_run)
  report = portability.main(["--out", str(tmp_path)])
  assert len([c for c in calls if "--variant" in c]) == len(portability.VARIANTS)
  for key in portability.ADDED:
    assert report[key] == committed[key]
  assert json.loads((tmp_path / "results.json").read_text())["hosts"] == committed["hosts"]
