"""Policy models."""

from rlpost.models.transformer import (KVCache, LayerCache, Transformer, TransformerConfig,
                                       apply, completion_logprobs, completion_scores, forward, init_cache, init_model,
                                       sequence_logprobs)

__all__ = ["KVCache", "LayerCache", "Transformer", "TransformerConfig", "apply", "completion_logprobs",
           "completion_scores", "forward",
           "init_cache", "init_model", "sequence_logprobs"]
