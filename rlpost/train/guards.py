"""Guards against the silent failures of RL post-training.

Runs that look healthy in a loss plot while learning nothing share a few signatures, each visible
in the step metrics the trainer already returns:

* ``zero_advantage_groups`` = 1: no group has a nonzero advantage the loss weighs, so nothing
  is learned (every group's rollouts got the same reward: too hard or too easy a task, a broken
  reward, a collapsed policy; or an allocation or chain that drops every group);
* ``truncated`` near 1: most completions hit the length limit, so they are scored as failures
  (or by an overlong penalty) and the policy learns nothing about answers;
* ``logp_mismatch`` large: the sampler's log-probs and the trainer's recomputation of them for
  the same parameters disagree (a cache or masking bug, or numerics), so importance ratios and
  KL terms are wrong;
* ``grad_norm`` exactly 0: nothing reaches the optimizer. (Not the loss value: a policy-gradient
  surrogate is 0 by value at ratio 1, e.g. GRPO's with zero-mean advantages, while its gradient
  is not.)
* a collapse, flagged within ``COLLAPSE_WINDOW`` steps whatever the patience: ``accuracy``
  exactly 0 (no correct rollout) after a step's accuracy or an evaluation's pass@1 reached
  ``COLLAPSE_LEVEL``, or test pass@1 falling to 0 from at least that level (``check_eval``).

``Guards.check(step, metrics)`` returns the alarms raised at that step (each names the metric,
its value, the step and what it means), once per episode: an alarm re-arms when its condition
clears. The loop logs them, records them in ``metrics.jsonl`` and, with action ``stop``, ends the
run after saving a checkpoint, so nothing is lost.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from rlpost.types import TOKEN_FIELDS


@dataclasses.dataclass(frozen=True)
class Alarm:
  metric: str
  value: float
  step: int
  steps: int  # consecutive steps the condition has held
  message: str

  def __str__(self) -> str:
    held = f" for {self.steps} consecutive steps" if self.steps > 1 else ""
    return f"step {self.step}: {self.metric} = {self.value:.4g}{held}: {self.message}"


COLLAPSE_WINDOW = 3  # consecutive steps without a correct rollout that flag a collapse
# The accuracy (or pass@1) a run must have reached before a fall to 0 counts as a collapse: at
# 0.1 a step of 32 rollouts has none correct with probability 0.9**32 = 3%, three in a row 4e-5;
# a run hovering near 0 on a hard task is the zero-variance guard's case, not a collapse.
COLLAPSE_LEVEL = 0.1


class TrainingStalled(RuntimeError):
  """Raised by the loop when a guard fires with action ``stop``."""


@dataclasses.dataclass(frozen=True)
class _Rule:
  metric: str
  bad: callable
  patience: int
  message: str


class Guards:
  """Consecutive-step alarms over step metrics.

  Args:
    patience: steps a condition must hold before ``zero_advantage_groups``, ``truncated`` and
      ``grad_norm`` alarms fire.
    truncated: fraction of truncated completions above which a step counts as bad.
    logp_mismatch: mean absolute per-token log-prob difference between sampler and trainer above
      which a step is bad; it fires at once (patience 1): it is a correctness problem.
  """

  def __init__(self, *, patience: int = 50, truncated: float = 0.5, logp_mismatch: float = 0.05):
    if patience < 1:
      raise ValueError(f"guard patience must be >= 1, got {patience}")
    self.rules = [
        _Rule("zero_advantage_groups", lambda v: v >= 1.0, patience,
              "no group has a nonzero advantage in the loss (identical rewards in every group, "
              "or every group dropped): nothing is learned"),
        _Rule("truncated", lambda v: v > truncated, patience,
              f"more than {truncated:.0%} of completions hit the length limit"),
        _Rule("logp_mismatch", lambda v: v > logp_mismatch, 1,
              f"sampler and trainer log-probs differ by more than {logp_mismatch} per token "
              f"for the same parameters"),
        _Rule("grad_norm", lambda v: v == 0.0, patience,
              "the gradient is exactly zero: nothing reaches the optimizer"),
    ]
    # A collapse is flagged at once, whatever the patience: no correct rollout for a short
    # window after correct ones were seen (``seen_correct``), or the evaluation's pass@1
    # falling to 0 from a positive value.
    self.rules.append(_Rule(
        "accuracy", lambda v: v == 0.0 and self.seen_correct, min(patience, COLLAPSE_WINDOW),
        "no rollout is correct any more: the policy has collapsed (a learning rate too high? "
        "a broken reward?)"))
    self.runs = {r.metric: 0 for r in self.rules}
    self.best_pass1: float | None = None
    self.seen_correct = False

  def check(self, step: int, metrics: dict) -> list[Alarm]:
    alarms = []
    for r in self.rules:
      if r.metric not in metrics:
        continue
      value = float(metrics[r.metric])
      self.runs[r.metric] = self.runs[r.metric] + 1 if r.bad(value) else 0
      if self.runs[r.metric] == r.patience:
        alarms.append(Alarm(r.metric, value, step, self.runs[r.metric], r.message))
    if float(metrics.get("accuracy", 0.0)) >= COLLAPSE_LEVEL:
      self.seen_correct = True
    return alarms


  def check_eval(self, step: int, evals: dict) -> list[Alarm]:
    """Alarms of an evaluation at ``step`` (``evals`` holds ``pass@1``): pass@1 0 after an
    earlier evaluation reached ``COLLAPSE_LEVEL`` (once per episode, re-armed when it
    recovers)."""
    value = evals.get("pass@1")
    if value is None:
      return []
    value = float(value)
    alarms = []
    fell = value == 0.0 and (self.best_pass1 or 0.0) >= COLLAPSE_LEVEL
    if fell and not self.runs.get("eval/pass@1"):
      alarms.append(Alarm("eval/pass@1", value, step, 1,
                          f"test pass@1 fell to 0 from {self.best_pass1:.3g}: the policy has "
                          "collapsed (a learning rate too high? a broken reward?)"))
    self.runs["eval/pass@1"] = int(fell)
    self.best_pass1 = max(self.best_pass1 or 0.0, value)
    self.seen_correct = self.seen_correct or value >= COLLAPSE_LEVEL
    return alarms


def all_finite(tree) -> jax.Array:
  """[] bool: every floating-point value of ``tree`` is finite (one reduction per leaf)."""
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


_FINITE_FIELDS = ("reward", *(f.replace("_logp", " log-prob") for f in TOKEN_FIELDS))


def raise_if_bad(metrics: dict, step: int) -> None:
  """Host-side checks after a step: non-finite rollouts, loss or parameters stop the run with
  the rollout, its prompt and group, or the likely cause named."""
  if int(metrics["nonfinite_batch"]):
    field = int(metrics.get("nonfinite_field", -1))
    what = _FINITE_FIELDS[field] if 0 <= field < len(_FINITE_FIELDS) else "reward or token value"
    raise FloatingPointError(
        f"step {step}: non-finite {what} at rollout index {int(metrics['nonfinite_index'])} "
        f"(train prompt {int(metrics['nonfinite_prompt'])}, group "
        f"{int(metrics['nonfinite_group'])} of the step)")
  if int(metrics.get("nonfinite_params", 0)):
    raise FloatingPointError(
        f"step {step}: the update made the policy parameters non-finite (gradient norm "
        f"{float(metrics['grad_norm']):.3g}); check lr, grad_clip and the recipe's coefficients")
  loss = float(metrics["loss"])
  if not math.isfinite(loss):
    raise FloatingPointError(f"step {step}: loss became {loss}")
