"""scripts/benchmarks/full_memory.py on a toy policy: XLA's plan of the gradient pass, with the
layers stored one by one and stacked (``TransformerConfig.stacked_layers``)."""

import jax
import pytest

from rlpost.models import transformer as tfm
from scripts.benchmarks import full_memory


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="sizes of the CPU compiler's plan")
def test_stacked_layers_drop_the_scans_copies(monkeypatch):
  toy = tfm.TransformerConfig(vocab_size=64, hidden_size=256, num_layers=4, num_heads=4,
                              num_kv_heads=2, intermediate_size=1024, dtype="bfloat16",
                              param_dtype="float32")
  monkeypatch.setattr(full_memory, "model_config",
                      lambda policy, attention: toy.replace(attention=attention))
  kw = dict(policy="toy", prompt=4, completion=4, rows=1, remat=True, chunk=0,
            attention="blockwise")
  stored = full_memory.analyse(**kw)
  stacked = full_memory.analyse(**kw, stacked_layers=True)
  layer_gib = 4 * 4 * (4 * 256 * 64 * 3 + 3 * 256 * 1024) / 2 ** 30  # f32 layer weights (+-)
  # The same parameters and gradients either way. Stored one by one, the remat scan copies the
  # weights in stacked and the gradients out (1.6 float32 copies of the layer weights here);
  # stored stacked, the scan reads the weights in place and writes the gradients stacked, and
  # what is left is a fraction of one copy (the activations of 4 tokens are tiny).
  assert stacked["argument_gib"] == pytest.approx(stored["argument_gib"], rel=1e-3)
  assert stacked["output_gib"] == pytest.approx(stored["output_gib"], rel=1e-3)
  assert stored["temp_gib"] > 1.4 * layer_gib
  assert 0 < stacked["temp_gib"] < 0.5 * layer_gib
  rows = [dict(policy="toy", prompt_tokens=4, completion_tokens=4, rows_per_device=1,
               runs=["x:y"], layers=layers, **r)
          for layers, r in (("stored", stored), ("stored", dict(stored, attention="xla")),
                            ("stacked", stacked))]
  table = full_memory.table(rows)
  assert "temp GiB, stacked, blockwise" in table and table.count("\n") == 2
  t0, t1 = f"{stored['temp_gib']:.1f}", f"{stacked['temp_gib']:.1f}"
  assert table.splitlines()[2].endswith(f"| {t0} | {t0} | - | {t1} |")
