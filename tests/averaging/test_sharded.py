"""Averaging on 8 simulated devices: shardings kept, no collectives, restore onto the mesh."""

CODE = r"""
import os, tempfile
import jax, jax.numpy as jnp, numpy as np, optax
from jax.sharding import NamedSharding, PartitionSpec as P
from rlpost import averaging as A, sharding
from rlpost.train import checkpoint

assert len(jax.devices()) == 8
mesh = sharding.make_mesh(data=2, fsdp=4)
rng = np.random.default_rng(0)
host = [{"w": rng.normal(size=(64, 32)).astype(np.float32),
         "e": rng.normal(size=(16, 8)).astype(np.float32).astype(jnp.bfloat16),
         "b": rng.normal(size=(32,)).astype(np.float32)} for _ in range(4)]
specs = {"w": P("fsdp", None), "e": P(None, ("data", "fsdp")), "b": P()}
shard = {k: NamedSharding(mesh, s) for k, s in specs.items()}
trees = [jax.device_put(h, shard) for h in host]

# 1. The compiled accumulate step is shard-local: no all-gather, all-reduce or other collective.
hlo = A.accumulate_hlo(trees[0]).lower()
for op in ("all-gather", "all-reduce", "collective-permute", "all-to-all", "reduce-scatter"):
  assert op not in hlo, op

# 2. The streaming mean keeps each leaf's sharding and equals the host mean.
acc = A.StreamingMean(trees[0])
same = lambda x, k: x.sharding.is_equivalent_to(shard[k], x.ndim)
assert all(same(a, k) for a, k in zip(acc.acc, sorted(specs)))
for i, t in enumerate(trees):
  acc.add(t, 1.0 + i, step=i)
out = acc.result()
for k in specs:
  assert same(out[k], k), (k, out[k].sharding)
  w = np.arange(1, 5) / 10.0
  ref = sum(wi * np.asarray(h[k], np.float64) for wi, h in zip(w, host))
  np.testing.assert_allclose(np.asarray(out[k], np.float64), ref, rtol=2e-2 if k == "e" else 1e-5, atol=1e-6)
assert out["e"].dtype == jnp.bfloat16

# 3. A NaN on one device's shard is caught and names the step.
bad = jax.device_put(dict(host[0], w=np.where(np.arange(64)[:, None] == 63, np.nan, host[0]["w"])), shard)
acc2 = A.StreamingMean(trees[0])
try:
  acc2.add(bad, step=1234)
  raise SystemExit("NaN not caught")
except FloatingPointError as e:
  assert "step 1234" in str(e) and "['w'] (32 values)" in str(e), e

# 4. Post hoc from checkpoints: parameters restored straight onto the mesh, optimizer never read.
d = tempfile.mkdtemp()
ck = checkpoint.Checkpointer(os.path.join(d, "ck"), keep_last=10, async_save=False)
opt = optax.adam(1e-3)
for s, h in zip((10, 20, 30, 40), host):
  ck.save(s, (h, opt.init(h)), {})
ck.close()
like = (host[0], opt.init(host[0]))
with A.CheckpointSource(os.path.join(d, "ck"), like=like, select=lambda s: s[0], shardings=shard) as src:
  first = src.load(10)
  assert all(same(first[k], k) for k in specs)
  avg = A.average(src.load, A.plan_lawa(src.steps, 2, every=20))
for k in specs:
  assert same(avg[k], k)
np.testing.assert_allclose(np.asarray(avg["w"]), (host[1]["w"] + host[3]["w"]) / 2, rtol=1e-5)
print("OK")
"""


def test_sharded_averaging_on_8_devices(with_devices):
  assert "OK" in with_devices(CODE, 8)
