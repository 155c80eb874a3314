"""Averaging specs: short strings that name in-training averaging transforms.

    parse_spec("lawa:k=5,every=50")                 -> transforms.lawa(k=5, every=50)
    parse_specs("lawa:k=5,every=50;ema:decay=0.99")  -> transforms.named(lawa_k5_every50=..., ...)

Grammar: ``name[:key=value[,key=value...]]``, several joined by ``;``. Values are parsed as int,
float, bool (true/false) or None; ``as=NAME`` sets the result's name in ``parse_specs`` (default:
the spec with punctuation replaced). Unknown methods or keys raise a ValueError listing the
accepted ones.

The same spec names a post-hoc average of a run's checkpoints (``plan_from_spec``), each saved
checkpoint standing for one snapshot:

    plan_from_spec("lawa:k=5,every=50", steps)  -> posthoc.plan_lawa(steps, 5, every=50)
    plan_from_spec("swa:start=100", steps)      -> posthoc.plan_swa(steps, start=100)
    plan_from_spec("ema:decay=0.9", steps)      -> posthoc.plan_ema(steps, 0.9) (per checkpoint)
"""

from __future__ import annotations

import inspect
import re

from rlpost.averaging import posthoc
from rlpost.averaging import weights as W
from rlpost.averaging import transforms as T

METHODS = {"lawa": T.lawa, "ema": T.ema, "swa": T.swa, "power_ema": T.power_ema}


def _value(text: str):
  low = text.strip().lower()
  if low in ("true", "false"):
    return low == "true"
  if low == "none":
    return None
  for cast in (int, float):
    try:
      return cast(text)
    except ValueError:
      pass
  raise ValueError(f"cannot parse value {text!r} (expected a number, true/false or none)")


def _split(spec: str) -> tuple[str, dict, str | None]:
  spec = spec.strip()
  if not spec:
    raise ValueError("empty averaging spec")
  name, _, rest = spec.partition(":")
  name = name.strip()
  if name not in METHODS:
    raise ValueError(f"unknown averaging method {name!r}; known: {sorted(METHODS)}")
  kwargs, alias = {}, None
  for part in filter(None, (p.strip() for p in rest.split(","))):
    key, eq, val = part.partition("=")
    if not eq:
      raise ValueError(f"averaging spec {spec!r}: expected key=value, got {part!r}")
    key = key.strip()
    if key == "as":
      alias = val.strip()
      continue
    kwargs[key] = _value(val)
  params = inspect.signature(METHODS[name]).parameters
  unknown = sorted(set(kwargs) - set(params))
  if unknown:
    raise ValueError(f"averaging spec {spec!r}: unknown key(s) {unknown} for {name}; "
                     f"accepted: {list(params)}")
  return name, kwargs, alias


def parse_spec(spec: str) -> T.AveragingTransform:
  """One averaging transform from ``name:key=value,...``."""
  name, kwargs, _ = _split(spec)
  try:
    return METHODS[name](**kwargs)
  except TypeError as e:
    raise ValueError(f"averaging spec {spec!r}: {e}") from None


def plan_from_spec(spec: str, steps) -> posthoc.Plan:
  """The post-hoc ``Plan`` over checkpoint ``steps`` (ints) that one spec names.

  Each checkpoint is one snapshot: ``lawa`` averages the ``k`` latest checkpoints (at spacing
  ``every`` steps, all of which must exist), ``swa`` every checkpoint from ``start`` (at spacing
  ``every``), ``ema`` weights the checkpoints from the first one taken (spacing ``every``) by
  decay ** (checkpoints younger), bias-corrected. ``recompute_every`` (lawa) is accepted and has
  no effect here. Raises ValueError for what a checkpoint series cannot give: ``power_ema``
  (needs stored power-EMA snapshots: ``scripts/average.py --method posthoc_ema``), ``ema`` with
  ``warmup`` or ``debias=false``, and a selection the steps do not contain (naming them).
  """
  parse_spec(spec)  # the transform's own checks: required keys, value ranges
  name, kwargs, _ = _split(spec)
  steps = sorted(int(s) for s in steps)
  if not steps:
    raise ValueError(f"averaging spec {spec!r}: no checkpoints to average")
  if name == "lawa":
    return posthoc.plan_lawa(steps, kwargs["k"], every=kwargs.get("every"))
  if name == "swa":
    return posthoc.plan_swa(steps, start=kwargs.get("start", 0), every=kwargs.get("every"))
  if name == "ema":
    if kwargs.get("warmup") is not None or not kwargs.get("debias", True):
      raise ValueError(f"averaging spec {spec!r}: warmup and debias=false need every training "
                       "step, not checkpoints; use plain ema:decay=D[,every=N] post hoc")
    every = kwargs.get("every")
    chosen = W.select_from(steps, steps[0], every=every) if every else steps
    return posthoc.plan_ema(chosen, kwargs["decay"], start=chosen[0])
  raise ValueError(f"averaging spec {spec!r}: {name} cannot be computed from checkpoints; "
                   "use scripts/average.py --method posthoc_ema with power-EMA snapshots")


def spec_name(spec: str) -> str:
  """The result name of one spec: its ``as=`` alias or e.g. ``lawa_k5_every50``."""
  name, kwargs, alias = _split(spec)
  if alias:
    return alias
  parts = [name] + [f"{k}{v}" for k, v in kwargs.items()]
  return re.sub(r"[^A-Za-z0-9_.]+", "_", "_".join(parts))


def parse_specs(specs: str) -> T.AveragingTransform:
  """Several specs joined by ``;`` as one ``transforms.named`` transform (results by name)."""
  parts = [s for s in (p.strip() for p in specs.split(";")) if s]
  if not parts:
    raise ValueError("empty averaging spec")
  named = {}
  for p in parts:
    key = spec_name(p)
    if key in named:
      raise ValueError(f"two averaging specs share the name {key!r}; add as=NAME to one")
    named[key] = parse_spec(p)
  return T.named(**named)


class Tracker:
  """Host-side holder of one averaging state for a run loop that keeps it beside the train state.

      tracker = Tracker("lawa:k=5,every=50;ema:decay=0.99", state.params)
      tracker.update(state.params)                    # after every training step
      metrics.update(tracker.evaluate(evaluate_fn, state.params, keys=("pass@1",)))

  ``update`` is the jitted pure ``update`` with the old state donated. ``state`` is a pytree the
  caller checkpoints beside the train state (the run loop does), so a resumed run continues its
  averages exactly.
  """

  def __init__(self, specs: str, params):
    import jax

    self.transform = parse_specs(specs)
    self.names = [spec_name(p) for p in specs.split(";") if p.strip()]
    self.state = self.transform.init(params)
    self._update = jax.jit(self.transform.update, donate_argnums=1)
    self._result = jax.jit(self.transform.result)

  def update(self, params) -> None:
    self.state = self._update(params, self.state)

  def results(self, params) -> dict:
    """{name: averaged parameters}."""
    return self._result(self.state, params)

  def evaluate(self, evaluate_fn, params, *, keys=None, prefix: str = "avg/") -> dict:
    """{f"{prefix}{name}/{metric}": value} from ``evaluate_fn(averaged params) -> dict``."""
    out = {}
    for name, p in self.results(params).items():
      for k, v in evaluate_fn(p).items():
        if keys is None or k in keys:
          out[f"{prefix}{name}/{k}"] = v
    return out
