"""Policy models."""

from rlpost.models.config import TransformerConfig
from rlpost.models.scoring import (completion_logprobs, completion_scores, forward,
                                   sequence_logprobs)
from rlpost.models.transformer import (KVCache, LayerCache, Transformer, apply, init_cache,
                                       init_model)

__all__ = ["KVCache", "LayerCache", "Transformer", "TransformerConfig", "apply",
           "completion_logprobs", "completion_scores", "forward", "init_cache", "init_model",
           "sequence_logprobs"]
