"""The checkpoint format module: one owner of the on-disk layout, readable by plain orbax."""

import ast
import glob
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rlpost import averaging as A
from rlpost import checkpoint_format as F
from rlpost.train import checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tree():
  return {"a": {"w": jnp.arange(6.0).reshape(2, 3)}, "b": jnp.int32(4),
          "c": jnp.ones(3, jnp.bfloat16)}


def _assert_tree_equal(got, want):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert g.dtype == w.dtype
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def _imported_modules(path):
  names = []
  for node in ast.walk(ast.parse(open(path).read())):
    if isinstance(node, ast.Import):
      names += [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module:
      names.append(node.module)
  return names


def test_layering():
  """The format module imports nothing from rlpost; averaging never imports rlpost.train."""
  assert not [m for m in _imported_modules(F.__file__) if m.split(".")[0] == "rlpost"]
  for path in glob.glob(os.path.join(ROOT, "rlpost", "averaging", "*.py")):
    assert not [m for m in _imported_modules(path) if m.startswith("rlpost.train")], path
  code = ("import sys, rlpost.averaging; "
          "print(sorted(m for m in sys.modules if m.startswith('rlpost.train')))")
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300, check=True)
  assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_one_owner_of_the_shared_names():
  assert checkpoint.CheckpointError is F.CheckpointError
  assert checkpoint.INTEGRITY_KEY == F.INTEGRITY_KEY == "integrity"
  assert A.checkpoints.flat_key is F.flat_key and F.flat_key(7) == "00007"
  assert (F.STATE_ITEM, F.META_ITEM) == ("state", "meta")


def test_reads_what_plain_orbax_wrote(tmp_path):
  """The layout older rlpost wrote (orbax StandardSave of the flat dict) still reads back."""
  tree = _tree()
  flat = dict(zip(["00000", "00001", "00002"], jax.tree.leaves(tree)))
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(str(tmp_path / "sp"), flat)
    ckptr.save(str(tmp_path / "wp" / "params"), flat)
  (tmp_path / "wp" / "averaging.json").write_text('{"method": "x"}')
  _assert_tree_equal(checkpoint.load_params(str(tmp_path / "sp"), tree), tree)
  got, info = A.read_params(str(tmp_path / "wp"), like=tree)
  _assert_tree_equal(got, tree)
  assert info == {"method": "x"}
  _assert_tree_equal(F.read_tree(str(tmp_path / "sp")), flat)


def test_write_tree_is_plain_orbax_and_atomic(tmp_path):
  tree = _tree()
  path = tmp_path / "p"
  assert F.write_tree(str(path), tree) == str(path)
  with ocp.StandardCheckpointer() as ckptr:
    stored = ckptr.restore(str(path))
  assert sorted(stored) == ["00000", "00001", "00002"]
  with pytest.raises(FileExistsError, match="exists"):
    F.write_tree(str(path), tree)
  bigger = jax.tree.map(lambda x: x + 1, tree)
  F.write_tree(str(path), bigger, overwrite=True)
  _assert_tree_equal(F.read_tree(str(path), tree), bigger)

  def boom(tmp):
    assert "_METADATA" in os.listdir(tmp) or os.listdir(tmp) == ["arrays"]  # arrays written
    raise KeyboardInterrupt("simulated crash")

  with pytest.raises(KeyboardInterrupt):
    F.write_tree(str(tmp_path / "q"), tree, item="arrays", add_files=boom)
  with pytest.raises(KeyboardInterrupt):
    F.write_tree(str(path), tree, overwrite=True, add_files=boom)
  assert sorted(os.listdir(tmp_path)) == ["p"]
  _assert_tree_equal(checkpoint.load_params(str(path), tree), bigger)


def test_save_params_and_write_params_share_the_layout(tmp_path):
  tree = _tree()
  checkpoint.save_params(str(tmp_path / "sp"), tree)
  checkpoint.save_params(str(tmp_path / "sp"), tree)  # replaces
  A.write_params(str(tmp_path / "wp"), tree, {"k": np.int64(2)})
  got, info = A.read_params(str(tmp_path / "wp"))
  assert info == {"k": 2}
  _assert_tree_equal(got, F.read_tree(str(tmp_path / "sp")))
  _assert_tree_equal(checkpoint.load_params(str(tmp_path / "wp" / "params"), tree), tree)


def test_manifest_records():
  x = np.arange(4, dtype=np.float32)
  (entry,) = F.manifest([jnp.asarray(x)])
  assert entry == {"shape": [4], "dtype": "float32", "crc32": F.crc32_of(x)}
