"""The dress rehearsal of every full-size table (``tests/experiments/rehearsal.py``): converted
data, a tiny checkpoint of the configured family, the launcher's commands on 8 simulated devices
with FSDP, a checkpoint and a resume, evaluations, and the aggregator's table over 2 seeds.

Each table runs in its own process (the device count is fixed when JAX starts), compiled at
XLA's lowest backend optimisation level without LLVM's expensive passes: the programs are the
configured ones, and their compilation (every run compiles its own: programs with host
callbacks, the scorer, are not in the persistent cache) is the largest part of a run, about
20 s of its 50 on this 2-core machine (tracing, execution on 8 simulated devices and the
checkpoints make up the rest); the three tables take about 25 core-minutes.
"""

import json
import os

import numpy as np
import pytest

pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")
pytest.importorskip("pyarrow")

from conftest import run_with_devices  # noqa: E402

CODE = """
import os, sys
os.environ["XLA_FLAGS"] += (" --xla_backend_optimization_level=0"
                           " --xla_llvm_disable_expensive_passes=true")
sys.path[:0] = ["tests", "tests/experiments"]
import rehearsal
rehearsal.main({experiment!r}, {root!r})
"""

# The arms each table reads (rehearsal.TABLES), two seeds each.
ARMS = {"mc_grpo": 5, "ace": 2, "dars": 5}
HEADINGS = {"mc_grpo": "# MC-GRPO", "ace": "# ACE at full size",
            "dars": "# DARS / DARS-B at full size"}


@pytest.mark.slow
@pytest.mark.parametrize("experiment", sorted(ARMS))
def test_dress_rehearsal(experiment, tmp_path):
  out = run_with_devices(CODE.format(experiment=experiment, root=str(tmp_path)), 8,
                         timeout=1800)
  line = [ln for ln in out.splitlines() if ln.startswith("REHEARSAL ")]
  assert line, out[-3000:]
  seen = json.loads(line[-1][len("REHEARSAL "):])
  runs = seen["runs"]
  assert seen["devices"] == 8 and len(runs) == 2 * ARMS[experiment]
  assert sorted({r["seed"] for r in runs}) == [0, 1]
  # ACE's first run was stopped after step 1 and resumed from its checkpoint.
  resumed = [r["resumed_from"] for r in runs]
  assert resumed == ([1] if experiment == "ace" else [None]) + [None] * (len(runs) - 1)
  for r in runs:
    assert r["step"] == 2 and r["identity"], r
    assert r["evals"][-2:] == [1, 2] and r["checkpoints"][-1] == 2, r
    # A loss and a gradient norm at each step, finite (a tiny random policy may draw groups of
    # equal rewards, whose gradient is zero).
    assert len(r["train"]["loss"]) == len(r["train"]["grad_norm"]) == 2, r
    assert np.all(np.isfinite(r["train"]["loss"] + r["train"]["grad_norm"])), r
  for r in runs:
    if r["arm"].startswith("dars"):
      # Chunked stage 2 on the mesh: never truncated, exactly the calls of 16 rows the demand
      # needed.
      assert r["train"]["dars_truncated_fraction"] == [0.0, 0.0], r
      calls = r["train"]["dars_stage2_calls"]
      extra = r["train"]["dars_extra_rollouts"]
      assert calls == [float(-(-int(e) // 16)) for e in extra] and max(calls) > 1, r
    if experiment == "ace":
      assert len(r["train"]["overconfident_errors"]) == 2, r
  # Every launched run finished: launching again runs nothing.
  assert seen["left_to_run"] == 0
  # The run directories aggregate into the table, judged with the table's own claims.
  assert seen["seeds"] == 2 and seen["claims"]
  with open(seen["table"]) as f:
    table = f.read()
  assert table.startswith(HEADINGS[experiment]), table[:200]
  # 2 seeds against the power plan's 6-12: judged only because --allow-underpowered says so.
  assert "UNDERPOWERED: 2 <" in table.split("\n## ")[0]
  assert os.path.exists(os.path.join(os.path.dirname(seen["table"]), "results.json"))
