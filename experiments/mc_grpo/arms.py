"""The MC-GRPO arms as RLConfig overrides: a baseline over G gradient-contributing rollouts.
Both the CPU table (``experiments/mc_grpo/__init__.py``) and the full-size configurations
(``experiments/mc_grpo/full.py``) build their arms with it."""

from __future__ import annotations


def overrides(g: int, baseline: str, *, kl_coef: float | None = None, rescale: bool = False,
              recipe: str = "grpo") -> dict:
  """The RLConfig keys of one arm (G is the number of gradient-contributing rollouts).

  ``kl_coef``: the recipes' KL coefficient (None: theirs, 0.04); ``rescale``: the median arm
  multiplies non-zero advantages by (G+1) / n_nonzero (the official GSM trainer's rule);
  ``recipe``: the base ("grpo", "dapo", "dr_grpo"; the mean and median baselines only)."""
  args = {} if kl_coef is None else {"kl_coef": kl_coef}
  if recipe != "grpo":
    if baseline not in ("mean", "median"):
      raise ValueError(f"baseline {baseline!r} is only run over the GRPO base")
    args = dict(args, base=recipe) if baseline == "median" else args
  if baseline == "mean":
    return dict(recipe=recipe, group_size=g, recipe_args=args)
  if baseline == "median":
    return dict(recipe="mc_grpo", group_size=g + 1,
                recipe_args=dict(args, rescale=True) if rescale else args)
  if baseline in ("mean_drop", "mean_random"):
    kind = "mean" if baseline == "mean_drop" else "mean_random"
    return dict(recipe="mc_grpo", group_size=g + 1, recipe_args=dict(args, baseline=kind))
  raise ValueError(f"unknown baseline {baseline!r}")


def arm_config(base: dict, g: int, baseline: str, **kw) -> dict:
  """The RLConfig dict of one arm: ``overrides`` over ``base``."""
  return dict(base, **overrides(g, baseline, **kw))
