"""GRPO-family objectives as small, pure, composable transforms.

Shape legend: P prompts, G_max padded group size, B = P * G_max rollouts (rollout b belongs to
group ``group_id[b]``, ``b // G_max`` in the canonical layout), T tokens. float32 rewards,
log-probs and advantages; int32 ids; bool masks.

Modules:
  base         Advantages, AdvantageTransform, chain, compute_advantages, LossParts, finalize.
  groups       masked segment statistics (mean, std, median, first-of-group).
  advantages   reward shaping, baselines, scalings, pivot exclusion, ACE, clipping, sign flips.
  ratios       token / sequence (GSPO) / sequence-token / prefix (PNPO) ratios, TIS weights.
  losses       PPO clip (+ dual clip), KL k1/k2/k3, entropy, aggregation, policy_loss.
  diagnostics  sign-flip rates, zero-variance groups, clip fractions, ESS, ACE errors, DARS buckets.
  recipes      GRPO, Dr.GRPO, DAPO, GSPO, PNPO, RLOO, MC-GRPO, ACE, DARS; get_recipe.
"""

from rlpost.types import (
    FiniteCheck,
    RolloutBatch,
    assert_finite,
    check_finite,
    check_shapes,
    group_layout,
    raise_if_nonfinite,
)
from rlpost.objectives import advantages, diagnostics, groups, losses, ratios, recipes
from rlpost.objectives.base import (
    AdvantageTransform,
    Advantages,
    ChainState,
    EmptyState,
    LossParts,
    chain,
    combine,
    compute_advantages,
    finalize,
    finalize_metrics,
    identity,
    init_advantages,
    safe_divide,
    stateless,
)
from rlpost.objectives.advantages import (
    ace_confidence_penalty,
    ace_modulate,
    center_by_group_mean,
    center_by_group_median,
    center_by_leave_one_out,
    clip_advantages,
    confidence_shift,
    exclude_median_pivot,
    exclude_min_abs_reward,
    flip_signs,
    group_baseline,
    group_scale,
    overlong_penalty,
    overlong_shaping,
    scale_by_batch_std,
    scale_by_group_mad,
    scale_by_group_std,
)
from rlpost.objectives.ratios import (
    log_ratio,
    prefix_log_ratio,
    sequence_log_ratio,
    sequence_token_log_ratio,
    token_log_ratio,
    truncated_importance_weights,
)
from rlpost.objectives.losses import (
    AGGREGATIONS,
    ClipIndicators,
    PolicyLossConfig,
    aggregate,
    clip_indicators,
    kl_estimate,
    kl_k1,
    kl_k2,
    kl_k3,
    policy_loss,
    ppo_clip_token_loss,
    token_entropy,
)
from rlpost.objectives.diagnostics import (
    advantage_by_difficulty,
    clip_fractions,
    effective_sample_size,
    overconfident_error_fraction,
    sign_flip_rates,
    zero_variance_fraction,
)
from rlpost.objectives.recipes import (
    Recipe,
    get_recipe,
    list_recipes,
    make_recipe,
    register_recipe,
)

__all__ = [
    # batch
    "RolloutBatch",
    "FiniteCheck",
    "check_shapes",
    "check_finite",
    "raise_if_nonfinite",
    "assert_finite",
    "group_layout",
    # algebra
    "Advantages",
    "AdvantageTransform",
    "EmptyState",
    "ChainState",
    "stateless",
    "identity",
    "chain",
    "init_advantages",
    "compute_advantages",
    "LossParts",
    "safe_divide",
    "finalize",
    "combine",
    "finalize_metrics",
    # advantage transforms
    "overlong_penalty",
    "overlong_shaping",
    "center_by_group_mean",
    "center_by_group_median",
    "center_by_leave_one_out",
    "group_baseline",
    "scale_by_group_std",
    "scale_by_group_mad",
    "scale_by_batch_std",
    "group_scale",
    "exclude_median_pivot",
    "exclude_min_abs_reward",
    "confidence_shift",
    "ace_modulate",
    "ace_confidence_penalty",
    "clip_advantages",
    "flip_signs",
    # ratios and losses
    "token_log_ratio",
    "sequence_log_ratio",
    "sequence_token_log_ratio",
    "prefix_log_ratio",
    "log_ratio",
    "truncated_importance_weights",
    "ppo_clip_token_loss",
    "clip_indicators",
    "ClipIndicators",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_estimate",
    "token_entropy",
    "aggregate",
    "AGGREGATIONS",
    "PolicyLossConfig",
    "policy_loss",
    # diagnostics
    "sign_flip_rates",
    "zero_variance_fraction",
    "clip_fractions",
    "effective_sample_size",
    "overconfident_error_fraction",
    "advantage_by_difficulty",
    # recipes
    "Recipe",
    "make_recipe",
    "register_recipe",
    "get_recipe",
    "list_recipes",
    # submodules
    "advantages",
    "diagnostics",
    "groups",
    "losses",
    "ratios",
    "recipes",
]
