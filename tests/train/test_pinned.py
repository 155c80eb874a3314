"""Pinned starting policies (rlpost.train.pinned, config key init_params, scripts/testbed.py)."""

import os
import shutil

import jax
import numpy as np
import pytest

from rlpost.train import config as config_lib
from rlpost.train import pinned, rl, setup

TINY = dict(task="arithmetic", task_spec=dict(min_digits=1, max_digits=1, terms=2), num_train=64,
            num_test=16, sft_steps=20, sft_batch_size=16, num_prompts=2, group_size=2, steps=1,
            eval_problems=4, eval_samples=2, eval_batch=8,
            model=dict(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                       intermediate_size=32))


def _tree(scale=1.0):
  return {"b": {"kernel": np.arange(6, dtype=np.float32).reshape(2, 3) * scale},
          "a": np.ones(4, np.int32)}


def test_digest_is_of_the_content_and_checked_on_load(tmp_path):
  path = pinned.save(_tree(), str(tmp_path), "toy")
  name, d = pinned.parse_name(path)
  assert name == "toy" and d == pinned.digest(_tree())
  assert pinned.digest(_tree(2.0)) != d  # one changed value moves the digest
  back = pinned.load(path, _tree(0.0))
  np.testing.assert_array_equal(back["b"]["kernel"], _tree()["b"]["kernel"])
  before = os.stat(path)
  assert pinned.save(_tree(), str(tmp_path), "toy") == path  # same content, same file
  after = os.stat(path)
  assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # not rewritten
  # A file whose content is not what its name says is refused, naming the file.
  other = pinned.save(_tree(2.0), str(tmp_path), "toy")
  renamed = os.path.join(tmp_path, f"toy-{d[::-1]}.npz")
  shutil.copy(other, renamed)
  with pytest.raises(pinned.PinnedError, match="does not match its name"):
    pinned.load(renamed, _tree())
  with open(path, "r+b") as f:
    f.truncate(100)
  with pytest.raises(pinned.PinnedError, match="not a readable"):
    pinned.load(path, _tree())
  with pytest.raises(pinned.PinnedError, match=r"kernel.* is float32\[2, 3\], the model's is "
                                               r"float32\[3, 2\]"):
    pinned.load(other, {"b": {"kernel": np.zeros((3, 2), np.float32)}, "a": np.ones(4, np.int32)})
  with pytest.raises(pinned.PinnedError, match="do not fit what it is loaded into"):
    pinned.load(other, {"c": np.ones(4, np.int32)})
  with pytest.raises(pinned.PinnedError, match="is named <name>-"):
    pinned.parse_name("start.npz")


def test_init_params_config_errors(tmp_path):
  path = pinned.save(_tree(), str(tmp_path), "toy")

  def make(**kw):
    return config_lib.from_dict(rl.RLConfig, dict(TINY, **kw)).validate()

  with pytest.raises(ValueError, match="'init_params'.*sft_steps must be 0"):
    make(init_params=path, sft_steps=5)
  with pytest.raises(ValueError, match="'init_params'.*is named <name>-"):
    make(init_params=str(tmp_path / "start.npz"), sft_steps=0)
  with pytest.raises(ValueError, match="'init_params'.*no such file"):
    make(init_params=str(tmp_path / f"toy-{'0' * 16}.npz"), sft_steps=0)
  cfg = config_lib.from_dict(rl.RLConfig, dict(TINY, init_params=path, sft_steps=None))
  assert cfg.sft_steps == 0  # unset: no warm start when the start is pinned


def test_a_run_starts_from_the_pinned_policy_without_sft(tmp_path):
  dirs = dict(data_dir=str(tmp_path / "data"), cache_dir=str(tmp_path / "cache"))
  cfg = config_lib.from_dict(rl.RLConfig, dict(TINY, **dirs))
  start = setup.character_start(cfg, lambda s: None, progress=False)
  init = config_lib.from_dict(rl.RLConfig, dict(TINY, **dirs, sft_steps=0))
  fresh = setup.character_start(init, lambda s: None, progress=False)
  assert pinned.digest(fresh) != pinned.digest(start)  # the SFT moved the weights
  path = pinned.save(start, str(tmp_path / "beds"), "tiny")
  shutil.rmtree(tmp_path / "cache")  # no SFT cache to fall back on
  logs = []
  trainer = rl.make_train(dict(TINY, **dirs, init_params=path, sft_steps=0), log=logs.append)
  params = trainer.init_state().params
  assert any("starting from the pinned policy" in line for line in logs)
  assert not any("sft" in line.lower() and "step" in line.lower() for line in logs)
  np.testing.assert_array_equal(
      np.concatenate([np.ravel(x) for x in jax.tree.leaves(params)]),
      np.concatenate([np.ravel(x) for x in jax.tree.leaves(start)]))
  cache = tmp_path / "cache"
  assert not cache.exists() or not [n for n in os.listdir(cache) if n.startswith("sft-")]


def test_testbed_command_verifies_the_committed_start():
  import subprocess
  import sys

  from experiments import testbeds

  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  out = subprocess.run([sys.executable, "scripts/testbed.py", "verify"], cwd=root,
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr
  for name, d in testbeds.PINNED.items():
    assert f"{name}: experiments/testbeds/{name}-{d}.npz matches digest {d}" in out.stdout
  bad = subprocess.run([sys.executable, "scripts/testbed.py", "build", "nope"], cwd=root,
                       capture_output=True, text=True, timeout=600)
  assert bad.returncode == 2 and bad.stderr.strip().startswith("error: no testbed 'nope'")


def test_dataset_testbeds_are_what_the_roundtrip_tables_load():
  """The pinned datasets have the splits and shapes of their recipe, the round-trip units name
  the file they load (so its digest is in their cache key and in the table's testbeds), and a
  system without a pinned dataset names none (its data is integrated when the table runs)."""
  from experiments import harness, roundtrip, testbeds
  from experiments.roundtrip import config as rt_config
  from rlpost.dynamics import data as data_lib

  for name, recipe in testbeds.DATA.items():
    system = recipe["system_name"]
    file, splits = testbeds.dataset(system, recipe["seed"])
    assert file == f"experiments/testbeds/{name}-{testbeds.PINNED[name]}.npz"
    assert list(splits) == list(data_lib.SPLITS)
    assert splits["train"].shape[0] == recipe["num_train"] and splits["train"].dtype == np.float32
    assert np.all(np.isfinite(splits["test"])) and np.std(splits["test"]) > 0
  units = roundtrip.units(rt_config.get_config(True))
  by_system = {u.spec["system"]: u.spec.get("testbed") for u in units.values()}
  assert by_system == {"kdv1d": testbeds.dataset_file("kdv1d", 0),
                       "ks1d": testbeds.dataset_file("ks1d", 0), "ns2d": None}
  assert harness.testbeds_in([u.spec for u in units.values()]) == sorted(
      testbeds.PINNED[n] for n in testbeds.DATA)
  assert testbeds.dataset("ns2d", 0) is None and testbeds.dataset("kdv1d", 1) is None
