"""scripts/recipe_fingerprint.py's comparison: bitwise by default, metrics that appear or vanish
are differences."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("fp", ROOT / "scripts" / "recipe_fingerprint.py")
fp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fp)


def run(loss=1.0, extra=None, ev=0.5):
  step = dict(loss=loss, reward=0.5, **(extra or {}))
  return {"grpo": dict(steps=[step, step], eval={"pass@1": ev})}


def test_compare(capsys):
  assert fp.compare(run(), run(), 0.0)
  assert not fp.compare(run(), run(loss=1.0 + 1e-7), 0.0)
  assert fp.compare(run(), run(loss=1.0 + 1e-7), 1e-6)
  assert not fp.compare(run(), run(extra={"kl": 0.0}), 0.0)
  assert not fp.compare(run(extra={"kl": 0.0}), run(), 0.0)
  assert not fp.compare(run(), run(ev=0.25), 0.1)
  assert "only in this run" in capsys.readouterr().out
  # --allow-new: a metric only this run has is listed, not a failure; a lost one still fails,
  # and so does a changed number.
  assert fp.compare(run(), run(extra={"kl": 0.0}), 0.0, allow_new=True)
  assert "kl only in this run" in capsys.readouterr().out
  assert not fp.compare(run(extra={"kl": 0.0}), run(), 0.0, allow_new=True)
  assert not fp.compare(run(), run(loss=2.0, extra={"kl": 0.0}), 0.0, allow_new=True)
