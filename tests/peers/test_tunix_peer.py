"""The Tunix peer of ``bench.py sampler|train`` (scripts/benchmarks/tunix_peer.py).

Tunix lives in its own environment (the ``peers`` extra pins an older transformers than the
``oracle`` extra): ``scripts/test_peers.sh`` builds ``.venv-peers`` and runs this module there
with ``RLPOST_PEERS_REQUIRED=1``, under which a missing Tunix fails instead of skipping. In the
main environment the module skips. No timing assertions.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if os.environ.get("RLPOST_PEERS_REQUIRED") != "1":
  pytest.importorskip("tunix", reason="google-tunix is not installed here (the peers extra; "
                                      "scripts/test_peers.sh runs this module)")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from rlpost import sampling  # noqa: E402
from rlpost.models import transformer as tfm  # noqa: E402
from rlpost.models import scoring  # noqa: E402
from scripts.benchmarks import tunix_peer  # noqa: E402

TOY = tfm.TransformerConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                            num_kv_heads=2, intermediate_size=64, qkv_bias=True,
                            tie_embeddings=True, max_seq_len=64)


def test_tokenizers_round_trip():
  tok = tunix_peer.IdTokenizer(vocab_size=64, eos_id=64)
  ids = [1, 5, 63, 7]
  assert tok.encode(tok.decode(ids)) == ids and len(tok.decode(ids)) == len(ids)
  assert tok.bos_id() == 0 and tok.pad_id() == 0 and tok.eos_id() == 64
  char = tunix_peer.CharTokenizer()
  assert char.decode(char.encode("12+3=")) == "12+3="
  assert char.decode([0, 1, 2]) == "\x00" * 3  # PAD, BOS, EOS: one character each
  assert (char.pad_id(), char.bos_id(), char.eos_id()) == (0, 1, 2)


def test_config_maps_every_shape():
  cfg = tunix_peer.model_config(TOY)
  assert (cfg.num_layers, cfg.vocab_size, cfg.embed_dim, cfg.hidden_dim) == (2, 64, 32, 64)
  assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (4, 2, 8)
  assert cfg.use_tied_embedding and cfg.rope_theta == TOY.rope_theta
  with pytest.raises(ValueError, match="qkv_bias"):
    tunix_peer.model_config(tfm.TransformerConfig(vocab_size=64, hidden_size=32, num_layers=1,
                                                  num_heads=4, num_kv_heads=2,
                                                  intermediate_size=64, qkv_bias=False))


def test_tunix_greedy_tokens_equal_rlpost_on_the_same_weights(tmp_path):
  """The weight mapping is right: greedy decoding agrees token for token (float32)."""
  model = tfm.init_model(TOY, seed=3)
  tokens = np.random.default_rng(0).integers(1, TOY.vocab_size, (8, 6)).astype(np.int32)
  theirs = tunix_peer.TunixSampler(model, tmp_path, prompt_len=6, new_tokens=10).generate(
      tokens, 10)
  out = sampling.Sampler(model, sampling.SamplingConfig(max_new_tokens=10, temperature=0.0))(
      nnx.state(model), tokens, np.ones_like(tokens, bool), jax.random.key(0))
  ours = np.asarray(out.tokens)
  assert theirs.shape == ours.shape == (8, 10)
  # Two programs: argmax ties within float rounding may break either way. The contract: the
  # first token agrees wherever rlpost's top-two logits are more than 1e-4 apart (most rows
  # here), and later tokens agree but for rows that diverged after such a tie.
  logits = np.asarray(scoring.forward(model, jnp.asarray(tokens), jnp.ones_like(tokens, bool)))
  top2 = np.sort(logits[:, -1], axis=-1)[:, -2:]
  clear = top2[:, 1] - top2[:, 0] > 1e-4
  assert clear.sum() >= 6 and len(set(ours[:, 0])) > 1  # a non-trivial comparison
  np.testing.assert_array_equal(theirs[clear, 0], ours[clear, 0])
  assert np.mean(theirs == ours) >= 0.9
  with pytest.raises(ValueError, match="pad id"):
    tunix_peer.TunixSampler(model, tmp_path, 6, 10).generate(np.zeros((1, 6), np.int32), 10)


def test_tunix_grpo_learner_trains_and_times_its_steps(tmp_path):
  from rlpost.train import rl
  from scripts.benchmarks import train as bench_train

  class Args:
    quick, prompts, group_size, new_tokens, data_dir = True, 4, 4, 8, str(tmp_path / "data")

  trainer = rl.make_train(bench_train._config(Args, 0.0) | {"num_prompts": 4, "group_size": 4,
                                                            "max_new_tokens": 8},
                          log=lambda s: None)
  calls = []
  # The count of '1's varies across a random policy's completions: advantages are non-zero.
  peer = tunix_peer.GRPOPeer(trainer, tmp_path, beta=0.0, lr=1e-3, grad_clip=1.0, clip_eps=0.2,
                             steps=3, after_step=lambda: calls.append(1),
                             reward_fn=lambda c, a: c.count("1") + c.count("2"))
  peer.train()
  assert len(peer.times) == len(calls) == 3 and all(t > 0 for t in peer.times)
  assert len(peer.split["generate"]) == len(peer.split["generate_and_score"]) == 3
  assert all(g <= p for g, p in zip(peer.split["generate"], peer.split["generate_and_score"]))
  assert peer.max_param_change() > 0


def _run_bench(tmp_path, *args):
  out = tmp_path / "bench.json"
  proc = subprocess.run([sys.executable, "scripts/bench.py", *args, "--out", str(out)],
                        cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(out.read_text()), proc.stdout


def test_bench_sampler_peer_tunix_quick(tmp_path):
  data, stdout = _run_bench(tmp_path, "sampler", "--quick", "--peer", "tunix")
  assert data["peer"] == "tunix" and data["tunix_baseline"]["version"]
  for r in data["results"]:
    assert r["baseline"] == "tunix" and r["tunix"]["tokens_per_s"] > 0
    assert r["ratio"] == pytest.approx(r["rlpost"]["tokens_per_s"] / r["tunix"]["tokens_per_s"])
    assert 0.0 <= r["first_token_agreement"] <= 1.0
  # Greedy first tokens of two programs: equal but at float near-ties (checked with margins in
  # the test above); over the 5 rows of the quick settings at most one may differ.
  rows = [(r["batch"], r["first_token_agreement"]) for r in data["results"]]
  assert sum(b * a for b, a in rows) >= sum(b for b, _ in rows) - 1
  assert "tunix tok/s" in stdout


def test_bench_train_peer_tunix_quick(tmp_path):
  data, stdout = _run_bench(tmp_path, "train", "--quick", "--peer", "tunix", "--data-dir",
                            str(tmp_path / "data"))
  assert data["settings"]["peer"] == "tunix"
  for r in data["results"]:
    theirs = r["tunix"]
    assert len(theirs["seconds"]) == len(r["rlpost"]["seconds"]) == data["settings"]["repeats"]
    assert r["ratio"] == pytest.approx(theirs["median_s"] / r["rlpost"]["median_s"])
    assert set(theirs["split"]) == {"generate_s", "score_and_ref_s", "update_s"}
    assert "max_ratio_vs_peer" in r["flops"] and "max_ratio_vs_trl" not in r["flops"]
  assert "| beta | rlpost ms/step (spread) | Tunix ms/step" in stdout
