"""Hugging Face checkpoint interop: ``config.json`` + safetensors + ``tokenizer.json``.

Reads and writes the on-disk format of the ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``,
``LlamaForCausalLM`` (``attention_bias`` included), ``MistralForCausalLM`` and
``Gemma3ForCausalLM`` (Gemma 3 text) checkpoints, so that a model trained here loads in
``transformers.AutoModelForCausalLM.from_pretrained`` and vice versa. Only the ``hf`` extra
(``safetensors``, ``tokenizers``) is needed; torch and transformers are never imported.

Modules (each imports only those above it):
  config     config.json: reading it and the mapping to and from ``TransformerConfig``.
  tokenizer  tokenizer.json with its special ids, the tokenizer files, the character tokenizer.
  weights    the parameter-name mapping, ``load_pretrained`` and ``save_pretrained``.

Public API (every name re-exported here):
  config_from_hf(hf_config)                     -> TransformerConfig
  config_to_hf(config, architecture=None)       -> dict (config.json contents)
  architecture_for(config)                      -> the short name a config exports as
  load_pretrained(path, dtype=, param_dtype=)   -> Transformer
  save_pretrained(model, path, architecture=None, source=, eos_token_id=, ...)
  special_token_ids(path)                       -> {"bos_token_id", "eos_token_id", "pad_token_id"}
  load_tokenizer(path)                          -> Tokenizer
  read_json(path)                               -> dict (a JSON object; errors name the file)
  write_char_tokenizer(tok, folder)             -> [paths] (a CharTokenizer for transformers)
"""

from rlpost.models.hf import config, tokenizer, weights
from rlpost.models.hf.config import (ARCHITECTURES, CONFIG_NAME, MODEL_TYPES, architecture_for,
                                     architecture_of, config_from_hf, config_to_hf, read_json)
from rlpost.models.hf.tokenizer import (CHAR_SPECIAL_TOKENS, SPECIAL_ID_KEYS, TOKENIZER_FILES,
                                        Tokenizer, load_tokenizer, special_token_ids,
                                        write_char_tokenizer)
from rlpost.models.hf.weights import (SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME,
                                      load_pretrained, save_pretrained)

__all__ = [
    # config.json
    "ARCHITECTURES",
    "MODEL_TYPES",
    "CONFIG_NAME",
    "architecture_of",
    "architecture_for",
    "config_from_hf",
    "config_to_hf",
    "read_json",
    # tokenizer
    "TOKENIZER_FILES",
    "SPECIAL_ID_KEYS",
    "CHAR_SPECIAL_TOKENS",
    "Tokenizer",
    "load_tokenizer",
    "special_token_ids",
    "write_char_tokenizer",
    # weights
    "SAFE_WEIGHTS_NAME",
    "SAFE_WEIGHTS_INDEX_NAME",
    "load_pretrained",
    "save_pretrained",
    # submodules
    "config",
    "tokenizer",
    "weights",
]
