"""Mesh helpers and the sampler on 8 simulated devices versus one."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from rlpost import sharding

# The same model, prompts and key in the parent (1 device) and the child (8 devices).
SETUP = """
import jax, numpy as np
from flax import nnx
from rlpost import sampling, sharding
from rlpost.models import transformer as tfm
cfg = tfm.TransformerConfig(vocab_size=64, hidden_size=64, num_layers=2, num_heads=4,
                            num_kv_heads=2, intermediate_size=128, qkv_bias=True, init_std=0.2)
model = tfm.init_model(cfg, seed=3)
prompts = [[1 + (i * 7 + j) % 60 for j in range(1 + i % 5)] for i in range(16)]
toks, mask = sampling.pad_prompts(prompts, side="left")
scfg = sampling.SamplingConfig(max_new_tokens=10, temperature=1.0, top_k=20, stop_tokens=(5,))
sampler = sampling.Sampler(model, scfg)
params = nnx.state(model)
"""


def _run_single():
  env = {}
  exec(SETUP, env)
  out = env["sampler"](env["params"], env["toks"], env["mask"], jax.random.key(42))
  return jax.tree.map(np.asarray, out)


def test_sampler_8_devices_matches_1(with_devices, tmp_path):
  path = tmp_path / "out.npz"
  with_devices(SETUP + f"""
assert len(jax.devices()) == 8
mesh = sharding.make_mesh(data=4, fsdp=2)
params = sharding.shard_params(params, mesh, mode="fsdp", min_size=1024)
sharded_leaves = [x for x in jax.tree.leaves(params) if not x.sharding.is_fully_replicated]
assert sharded_leaves, "fsdp mode sharded no parameter"
toks, mask = sharding.shard_batch((toks, mask), mesh)
out = sampler(params, toks, mask, jax.random.key(42))
assert not out.tokens.sharding.is_fully_replicated
assert out.tokens.sharding.spec[0] is not None, out.tokens.sharding
np.savez({str(path)!r}, **{{k: np.asarray(v) for k, v in vars(out).items()}})
""")
  multi = np.load(path)
  single = _run_single()
  np.testing.assert_array_equal(multi["tokens"], single.tokens)
  np.testing.assert_array_equal(multi["mask"], single.mask)
  np.testing.assert_array_equal(multi["finish_reason"], single.finish_reason)
  np.testing.assert_allclose(multi["logprobs"], single.logprobs, atol=1e-5)
  np.testing.assert_allclose(multi["policy_logprobs"], single.policy_logprobs, atol=1e-5)


def test_mesh_and_rules():
  mesh = sharding.make_mesh()
  assert mesh.axis_names == ("data", "fsdp")
  assert sharding.param_spec((1024, 64), 2, min_size=0) == P("fsdp", None)
  assert sharding.param_spec((63, 64), 2, min_size=0) == P(None, "fsdp")
  assert sharding.param_spec((63, 65), 2, min_size=0) == P()
  assert sharding.param_spec((8, 8), 2) == P()  # below min_size: replicated
  assert sharding.param_spec((1024, 64), 1, min_size=0) == P()
  with pytest.raises(ValueError, match="fsdp=3"):
    sharding.make_mesh(fsdp=3, devices=jax.devices()[:1])
  with pytest.raises(ValueError, match="data=2 x fsdp=1"):
    sharding.make_mesh(data=2, devices=jax.devices()[:1])
  with pytest.raises(ValueError, match="sharding mode"):
    sharding.param_shardings({}, mesh, mode="tp")


def test_shard_batch_rejects_indivisible(with_devices):
  out = with_devices("""
import numpy as np
from rlpost import sharding
mesh = sharding.make_mesh(data=8)
try:
  sharding.shard_batch(np.zeros((6, 3)), mesh)
except ValueError as e:
  print(e)
""")
  assert "batch dimension 6 is not divisible" in out
