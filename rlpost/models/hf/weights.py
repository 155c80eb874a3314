"""Hugging Face safetensors weights: the parameter-name mapping, ``load_pretrained`` and
``save_pretrained``.

A checkpoint directory holds config.json (``rlpost.models.hf.config``), model.safetensors or
``model-0000i-of-0000n.safetensors`` shards with model.safetensors.index.json, and the tokenizer
files (``rlpost.models.hf.tokenizer``). ``load_pretrained`` builds the ``Transformer`` abstractly
and fills it tensor by tensor; ``save_pretrained`` writes a new directory atomically.

Weight layout: Hugging Face ``nn.Linear`` weights are ``[out, in]``; the NNX ``Linear`` kernels
here are ``[in, out]``, so projection weights are transposed on the way in and out. Embedding
``[V, E]`` and norm ``[E]`` tensors keep their layout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx

from rlpost.models.hf.config import (CONFIG_NAME, architecture_of, config_from_hf, config_to_hf,
                                     read_json)
from rlpost.models.hf.tokenizer import TOKENIZER_FILES, special_token_ids
from rlpost.models.transformer import Transformer, TransformerConfig

SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"

# Tensors that some exporters write but that carry no parameters of this model.
_HARMLESS_TENSORS = re.compile(r"(^|\.)rotary_emb\.inv_freq$")

_NP_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16),
              "float16": np.dtype(np.float16)}


# --------------------------------------------------------------------------------------------
# Parameter-name mapping
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Entry:
  hf_name: str
  path: tuple  # NNX state path
  transpose: bool  # Linear kernel: HF [out, in] <-> NNX [in, out]
  layer: int | None = None  # with layers stored stacked: the tensor is path's slice [layer]


def _param_map(cfg: TransformerConfig) -> list[_Entry]:
  """Every parameter of ``Transformer(cfg)`` with its Hugging Face tensor name."""
  entries = [_Entry("model.embed_tokens.weight", ("embed", "embedding"), False),
             _Entry("model.norm.weight", ("final_norm", "scale"), False)]
  if not cfg.tie_embeddings:
    entries.append(_Entry("lm_head.weight", ("lm_head", "kernel"), True))
  for i in range(cfg.num_layers):
    pre = f"model.layers.{i}."
    # Layers stored stacked share one path per tensor kind; the layer is an index into it.
    at, layer = (("layers",), i) if cfg.stacked_layers else (("layers", i), None)
    entry = lambda name, path, transpose: _Entry(name, at + path, transpose, layer)  # noqa: E731
    # The norm before the MLP is post_attention_layernorm in Llama's layout and
    # pre_feedforward_layernorm in Gemma's, whose post_attention_layernorm normalises the
    # attention output.
    norms = {"input_layernorm": "input_norm"}
    if cfg.sandwich_norm:
      norms.update(post_attention_layernorm="attn_out_norm",
                   pre_feedforward_layernorm="post_attn_norm",
                   post_feedforward_layernorm="mlp_out_norm")
    else:
      norms["post_attention_layernorm"] = "post_attn_norm"
    entries += [entry(f"{pre}{name}.weight", (attr, "scale"), False)
                for name, attr in norms.items()]
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
      entries.append(entry(f"{pre}self_attn.{proj}.weight", ("attn", proj, "kernel"), True))
      if cfg.o_bias if proj == "o_proj" else cfg.qkv_bias:
        entries.append(entry(f"{pre}self_attn.{proj}.bias", ("attn", proj, "bias"), False))
    if cfg.qk_norm:
      entries += [entry(f"{pre}self_attn.{n}.weight", ("attn", n, "scale"), False)
                  for n in ("q_norm", "k_norm")]
    for proj in ("gate_proj", "up_proj", "down_proj"):
      entries.append(entry(f"{pre}mlp.{proj}.weight", ("mlp", proj, "kernel"), True))
  return entries


def _hf_shape(shape: Sequence[int], transpose: bool) -> tuple[int, ...]:
  return tuple(reversed(shape)) if transpose else tuple(shape)


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _open_safetensors(file: Path):
  """``safe_open(file)`` for numpy; a truncated or damaged file is a ValueError naming it.

  safetensors' own ``SafetensorError`` (e.g. "incomplete metadata, file not fully covered")
  names no file; errors of the caller's own checks inside the block pass through unchanged.
  """
  from safetensors import SafetensorError, safe_open

  try:
    with safe_open(file, framework="numpy") as f:
      yield f
  except SafetensorError as e:
    raise ValueError(f"{file} is not a readable safetensors file (truncated or damaged?): "
                     f"{e}") from e


def _weight_files(path: Path) -> dict[str, Path]:
  """Tensor name -> safetensors file, from model.safetensors or the sharded index."""
  single = path / SAFE_WEIGHTS_NAME
  index = path / SAFE_WEIGHTS_INDEX_NAME
  if single.exists():
    with _open_safetensors(single) as f:
      return {name: single for name in f.keys()}
  if index.exists():
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict):
      raise ValueError(f"{index} has no 'weight_map' object")
    files = {}
    for name, shard in weight_map.items():
      shard_path = path / shard
      if not shard_path.exists():
        raise FileNotFoundError(f"shard {shard!r} listed in {index} for tensor {name!r} "
                                "not found")
      files[name] = shard_path
    return files
  raise FileNotFoundError(f"no {SAFE_WEIGHTS_NAME} or {SAFE_WEIGHTS_INDEX_NAME} in {path} "
                          "(only safetensors checkpoints are supported)")


def load_pretrained(path: str | os.PathLike, *, dtype: str = "float32",
                    param_dtype: str | None = None, attention: str = "xla",
                    stacked_layers: bool = False) -> Transformer:
  """Load a Hugging Face checkpoint directory of a supported architecture into a ``Transformer``.

  Args:
    path: directory with config.json and model.safetensors or model.safetensors.index.json
      (+ shards).
    dtype: activation / matmul dtype name.
    param_dtype: dtype the parameters are cast to (defaults to ``dtype``), whatever dtype the
      checkpoint stores.
    attention: ``TransformerConfig.attention`` (how uncached passes attend; not in the files).
    stacked_layers: ``TransformerConfig.stacked_layers``: the layers' tensors are stacked
      into one [num_layers, ...] parameter each (the files are the same either way).

  The module is built abstractly (``nnx.eval_shape``), so no random initialisation runs.
  Raises ValueError naming the tensor(s) for missing or unexpected tensors and for shape
  mismatches (with expected and found shapes and the file) and for truncated or damaged
  safetensors files (naming the file); FileNotFoundError for missing files.
  """
  path = Path(path)
  config = config_from_hf(read_json(path / CONFIG_NAME), dtype=dtype, param_dtype=param_dtype)
  config = config.replace(attention=attention, stacked_layers=bool(stacked_layers))
  files = _weight_files(path)
  entries = _param_map(config)
  expected = {e.hf_name for e in entries}
  missing = [e.hf_name for e in entries if e.hf_name not in files]
  if missing:
    raise ValueError(f"checkpoint {path} is missing {len(missing)} tensor(s): {missing[:20]}")
  ignored = set()
  if config.tie_embeddings:
    ignored.add("lm_head.weight")  # transformers also ignores it and re-ties to the embedding
  unexpected = sorted(n for n in files if n not in expected and n not in ignored
                      and not _HARMLESS_TENSORS.search(n))
  if unexpected:
    raise ValueError(f"checkpoint {path} has {len(unexpected)} unexpected tensor(s) for a "
                     f"{config.num_layers}-layer model with tie_embeddings="
                     f"{config.tie_embeddings}: {unexpected[:20]}")

  abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  graphdef, abstract_state = nnx.split(abstract)
  abstract_flat = dict(nnx.to_flat_state(abstract_state))
  unmapped = sorted(set(abstract_flat) - {e.path for e in entries}, key=str)
  if unmapped:
    raise AssertionError(f"parameters without a Hugging Face name: {unmapped}")
  target = _NP_DTYPES[config.param_dtype]

  by_file: dict[Path, list[_Entry]] = {}
  for e in entries:
    by_file.setdefault(files[e.hf_name], []).append(e)
  arrays: dict[tuple, jax.Array] = {}
  # Stacked paths: a host buffer [L, ...] that each layer's tensor is written into, moved to
  # the device once its last layer is in (one host copy of the tensor kind at most).
  buffers: dict[tuple, tuple[np.ndarray, set]] = {}
  for file, file_entries in by_file.items():
    with _open_safetensors(file) as f:
      for e in file_entries:
        shape = abstract_flat[e.path].shape
        want = _hf_shape(shape if e.layer is None else shape[1:], e.transpose)
        sl = f.get_slice(e.hf_name)
        found = tuple(sl.get_shape())
        if found != want:
          raise ValueError(f"tensor {e.hf_name!r} in {file} has shape {found}, expected "
                           f"{want} from config.json")
        if sl.get_dtype() not in ("F32", "F16", "BF16", "F64"):
          raise ValueError(f"tensor {e.hf_name!r} in {file} has dtype {sl.get_dtype()}, "
                           "expected a floating-point dtype")
        x = f.get_tensor(e.hf_name)
        if e.transpose:
          x = x.T
        x = np.ascontiguousarray(x.astype(target, copy=False))
        if e.layer is None:
          arrays[e.path] = jnp.asarray(x)
          continue
        if e.path not in buffers:
          buffers[e.path] = (np.empty(shape, target), set())
        buffer, done = buffers[e.path]
        buffer[e.layer] = x
        done.add(e.layer)
        if len(done) == shape[0]:
          arrays[e.path] = jnp.asarray(buffers.pop(e.path)[0])

  flat = [(p, var.replace(arrays[p])) for p, var in abstract_flat.items()]
  return nnx.merge(graphdef, nnx.from_flat_state(flat))


# --------------------------------------------------------------------------------------------
# Saving
# --------------------------------------------------------------------------------------------

def _shards(tensors: dict[str, np.ndarray], max_shard_bytes: int | None) -> list[list[str]]:
  """Greedy, order-preserving split of tensor names into shards of <= max_shard_bytes.

  A tensor larger than the limit gets a shard of its own.
  """
  names = list(tensors)
  if max_shard_bytes is None or sum(t.nbytes for t in tensors.values()) <= max_shard_bytes:
    return [names]
  shards, current, size = [], [], 0
  for name in names:
    n = tensors[name].nbytes
    if current and size + n > max_shard_bytes:
      shards.append(current)
      current, size = [], 0
    current.append(name)
    size += n
  if current:
    shards.append(current)
  return shards


def _chmod_as_created(folder: Path) -> None:
  """Give ``folder`` and its files the modes a plain mkdir / open would (mkdtemp makes 0700)."""
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(folder, 0o777 & ~umask)
  for file in folder.iterdir():
    os.chmod(file, 0o666 & ~umask)


def save_pretrained(model: Transformer, path: str | os.PathLike, *,
                    architecture: str | None = None, max_shard_bytes: int | None = None,
                    source: str | os.PathLike | None = None,
                    bos_token_id: int | None = None,
                    eos_token_id: int | Sequence[int] | None = None,
                    pad_token_id: int | None = None,
                    extra_config: dict | None = None,
                    extra_files: Iterable[str | os.PathLike] = (),
                    overwrite: bool = False) -> Path:
  """Write ``model`` as a Hugging Face checkpoint directory loadable by transformers.

  Writes config.json and model.safetensors, or ``model-0000i-of-0000n.safetensors`` shards plus
  model.safetensors.index.json when the parameters exceed ``max_shard_bytes``. Tensors keep the
  model's parameter dtype. Tied embeddings store only ``model.embed_tokens.weight``.

  Args:
    model: the model to save.
    path: the checkpoint directory to create.
    architecture: a key of ``ARCHITECTURES`` (or the class name); None: the source's
      architecture with ``source``, else ``architecture_for(model.cfg)``. See ``config_to_hf``.
    max_shard_bytes: shard size limit in bytes; None writes a single file.
    source: the Hugging Face checkpoint directory the model came from: its special token ids
      (``special_token_ids``) go into config.json and its tokenizer files (``TOKENIZER_FILES``
      present there, generation_config.json included) are copied.
    bos_token_id, eos_token_id, pad_token_id: config.json's special ids (over ``source``'s).
    extra_config: keys merged into config.json last.
    extra_files: files copied into the checkpoint (after ``source``'s, replacing same names).
    overwrite: replace an existing ``path``; otherwise an existing path is an error.

  The checkpoint is written to a temporary sibling directory and renamed into place, so an
  interrupted save never leaves a partial checkpoint at ``path``. Returns ``path``.
  """
  from safetensors.numpy import save_file

  path = Path(path)
  if path.exists() and not overwrite:
    raise FileExistsError(f"{path} exists; pass overwrite=True to replace it")
  cfg = model.cfg
  if architecture is None and source is not None:
    architecture = architecture_of(read_json(Path(source) / CONFIG_NAME))
  hf_config = config_to_hf(cfg, architecture)
  copies: list[Path] = []
  if source is not None:
    source = Path(source)
    hf_config.update(special_token_ids(source))
    copies = [source / name for name in TOKENIZER_FILES if (source / name).is_file()]
  given = dict(bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id)
  hf_config.update({k: v for k, v in given.items() if v is not None})
  hf_config.update(extra_config or {})
  copies += [Path(f) for f in extra_files]
  flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  tensors: dict[str, np.ndarray] = {}
  for e in _param_map(cfg):
    x = np.asarray(jax.device_get(flat[e.path][...] if e.layer is None
                                  else flat[e.path][...][e.layer]))
    tensors[e.hf_name] = np.ascontiguousarray(x.T if e.transpose else x)

  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
  try:
    with open(tmp / CONFIG_NAME, "w") as f:
      json.dump(hf_config, f, indent=2, sort_keys=True)
    shards = _shards(tensors, max_shard_bytes)
    if len(shards) == 1:
      save_file(tensors, str(tmp / SAFE_WEIGHTS_NAME), metadata={"format": "pt"})
    else:
      weight_map = {}
      for i, names in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n] for n in names}, str(tmp / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in names})
      index = {"metadata": {"total_size": int(sum(t.nbytes for t in tensors.values()))},
               "weight_map": weight_map}
      with open(tmp / SAFE_WEIGHTS_INDEX_NAME, "w") as f:
        json.dump(index, f, indent=2, sort_keys=True)
    for file in copies:
      shutil.copy2(file, tmp / file.name)
    _chmod_as_created(tmp)
    if path.exists():
      old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
      os.replace(path, old / "ckpt")
      os.replace(tmp, path)
      shutil.rmtree(old, ignore_errors=True)
    else:
      os.replace(tmp, path)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return path
