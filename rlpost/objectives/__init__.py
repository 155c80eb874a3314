"""GRPO-family objectives as small, pure, composable transforms.

Shape legend: P prompts, G_max padded group size, B = P * G_max rollouts (rollout b belongs to
group ``group_id[b]``, ``b // G_max`` in the canonical layout), T tokens. float32 rewards,
log-probs and advantages; int32 ids; bool masks.

Modules (each imports only those above it; ``parts`` imports none):
  parts        LossParts, safe_divide, finalize, combine, finalize_metrics.
  groups       masked segment statistics (mean, std, median, first-of-group).
  ratios       token / sequence (GSPO) / sequence-token / prefix (PNPO) ratios, TIS weights.
  losses       PPO clip (+ dual clip), KL k1/k2/k3, entropy, aggregation, loss terms, policy_loss.
  base         Advantages, AdvantageTransform, chain, compute_advantages, Recipe, make_recipe,
               RecipeContext (re-exports the ``parts`` names).
  advantages   reward shaping, baselines, scalings, pivot exclusion, ACE, clipping, sign flips.
  diagnostics  sign-flip rates, zero-variance groups, clip fractions, ESS, ACE errors, DARS buckets.
  recipes      GRPO, Dr.GRPO, DAPO, GSPO, PNPO, RLOO, MC-GRPO, ACE, DARS; get_recipe.
"""

from rlpost.types import (
    TOKEN_FIELDS,
    FiniteCheck,
    RolloutBatch,
    assert_finite,
    check_finite,
    check_shapes,
    group_layout,
    raise_if_nonfinite,
)
from rlpost.objectives import advantages, diagnostics, groups, losses, parts, ratios, recipes
from rlpost.objectives.parts import LossParts, combine, finalize, finalize_metrics, safe_divide
from rlpost.objectives.base import (
    OPTIONAL_INPUTS,
    AdvantageTransform,
    Advantages,
    ChainState,
    EmptyState,
    RecipeContext,
    chain,
    compute_advantages,
    identity,
    init_advantages,
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
    LossInputs,
    PolicyLossConfig,
    Term,
    aggregate,
    clip_indicators,
    entropy_term,
    kl_estimate,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_term,
    loss_inputs,
    policy_gradient_term,
    policy_loss,
    policy_terms,
    ppo_clip_token_loss,
    sum_terms,
    token_entropy,
    token_means,
    truncated_importance_term,
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
    default_overlong_buffer,
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
    "TOKEN_FIELDS",
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
    "LossInputs",
    "loss_inputs",
    "Term",
    "policy_gradient_term",
    "truncated_importance_term",
    "kl_term",
    "entropy_term",
    "policy_terms",
    "token_means",
    "sum_terms",
    # diagnostics
    "sign_flip_rates",
    "zero_variance_fraction",
    "clip_fractions",
    "effective_sample_size",
    "overconfident_error_fraction",
    "advantage_by_difficulty",
    # recipes
    "Recipe",
    "RecipeContext",
    "OPTIONAL_INPUTS",
    "make_recipe",
    "register_recipe",
    "default_overlong_buffer",
    "get_recipe",
    "list_recipes",
    # submodules
    "advantages",
    "diagnostics",
    "groups",
    "losses",
    "parts",
    "ratios",
    "recipes",
]
