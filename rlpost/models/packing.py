"""Padding-free scoring: rollout rows packed into fewer rows of the same width.

A rollout batch holds R rows of a Tp-slot prompt buffer and an N-slot completion buffer, and a
row's real tokens (its valid prompt tokens, then its valid completion tokens) are often far
fewer than its W = Tp + N slots. ``pack`` moves every row's real tokens, contiguously and in
order, into P packed rows ("bins") of ``bin_rows`` x W slots (first-fit decreasing over the row
lengths), with
segment ids (row index + 1; 0 on padding) and positions restarting at 0 in every segment: the
positions ``attention.positions_from_mask`` gives the row's valid tokens in the padded layout.
The decoder then runs over P x bin_rows x W slots instead of R x W, each query attending only
to earlier tokens of its own segment (``attention.packed`` tokens, the segment test of
``attention.visible``), so every token sees exactly the context it sees in the padded layout.
Bins wider than one row (``bin_rows`` = 2, the default) let rows longer than W / 2 pair with
shorter ones; the price is attention over the wider bin (the "xla" implementation computes all
of a bin's [bin_rows W]^2 scores, "blockwise" skips tiles that no segment spans).

Shapes are static and whether R rows fit into P bins is known only at run time, so
``Buckets`` holds a few bucket sizes P_1 < P_2 < ... (as fractions f of the padded layout's
R x W slots: P = ceil(f R / bin_rows)) and runs, through ``lax.switch``, the computation of the
smallest bucket that fits, with the padded pass as the last branch. The result never depends
on which branch ran (up to float summation order), every branch is compiled once in the same
program, and nothing recompiles as lengths vary. (Under ``vmap`` a switch on a batched index
evaluates every branch, so packing costs more than it saves in vmapped seeds.)

Which bucket fits: first fit places a row in the lowest-index bin with room and never looks at
how many bins exist, so one plan with R bins (which always fits: no row is longer than a bin)
gives the placement for every bucket; a bucket fits iff it has at least as many bins as that
plan uses.

The LM head runs on the [R, N] completion positions gathered from the packed hidden states, as
in the padded pass (``scoring.scores_from_hidden``, with ``logits_chunk``).

Contract: completion masks are prefixes (a completion's valid tokens come first, as the sampler
makes them), every row has at least one valid prompt token, and prompts may be padded on
either side. Values equal ``scoring.completion_scores``: logp everywhere (0 where masked),
entropy where the completion mask is set.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp

from rlpost.models import attention
from rlpost.models import transformer as tfm
from rlpost.models import scoring
from rlpost.types import LossParts


class Plan(NamedTuple):
  """Placement of R rows: ``bin`` [R] int32, ``offset`` [R] int32 (first slot in the bin) and
  ``bins_used`` int32 scalar."""

  bin: jax.Array
  offset: jax.Array
  bins_used: jax.Array


def plan(lengths: jax.Array, width: int) -> Plan:
  """First-fit decreasing placement of rows of ``lengths`` [R] int32 (each <= width) into at
  most R bins of ``width`` slots."""
  r = lengths.shape[0]
  order = jnp.argsort(-lengths, stable=True)

  def place(fill, i):
    n = lengths[i]
    j = jnp.argmax(fill + n <= width)  # some bin has room: at most R - 1 rows precede this one
    return fill.at[j].add(n), (j, fill[j])

  fill, (bins, offsets) = jax.lax.scan(place, jnp.zeros(r, jnp.int32), order)
  row_bin = jnp.zeros(r, jnp.int32).at[order].set(bins.astype(jnp.int32))
  row_offset = jnp.zeros(r, jnp.int32).at[order].set(offsets)
  return Plan(row_bin, row_offset, jnp.sum(fill > 0).astype(jnp.int32))


class Packed(NamedTuple):
  """Packed rows: ``tokens``, ``positions``, ``segments`` [P, W] int32 (W the bin width) and
  ``select`` [R, N] int32, the flat slot (bin * W + column) of the token that predicts each
  completion token."""

  tokens: jax.Array
  positions: jax.Array
  segments: jax.Array
  select: jax.Array


def row_lengths(prompt_mask: jax.Array, completion_mask: jax.Array) -> jax.Array:
  """Real tokens per row [R] int32."""
  return (jnp.sum(prompt_mask.astype(jnp.int32), axis=1)
          + jnp.sum(completion_mask.astype(jnp.int32), axis=1))


def pack(prompt_tokens, prompt_mask, completion_tokens, completion_mask, num_bins: int,
         where: Plan | None = None, *, bin_rows: int = 1) -> Packed:
  """The rows' real tokens in ``num_bins`` packed rows of ``bin_rows`` x (Tp + N) slots.

  prompt_tokens, prompt_mask: [R, Tp]; completion_tokens, completion_mask: [R, N]. ``where``:
  the rows' ``plan`` at that width (computed here when None); it must use at most
  ``num_bins`` bins, or rows past the last bin are dropped.
  """
  r, tp = prompt_tokens.shape
  n = completion_tokens.shape[1]
  w = bin_rows * (tp + n)
  seq = jnp.concatenate([prompt_tokens, completion_tokens], axis=1).astype(jnp.int32)
  valid = jnp.concatenate([prompt_mask, completion_mask], axis=1).astype(bool)
  rank = jnp.cumsum(valid.astype(jnp.int32), axis=1) - 1  # [R, Tp + N]
  if where is None:
    where = plan(jnp.sum(valid, axis=1).astype(jnp.int32), w)
  start = where.bin * w + where.offset  # [R]
  flat = jnp.where(valid, start[:, None] + rank, num_bins * w).reshape(-1)  # out of range: drop

  def scatter(values):
    out = jnp.zeros(num_bins * w, jnp.int32).at[flat].set(values.reshape(-1), mode="drop")
    return out.reshape(num_bins, w)

  segment = jnp.broadcast_to(jnp.arange(1, r + 1, dtype=jnp.int32)[:, None], (r, tp + n))
  # Completion token j is predicted by the row's previous real token, of rank rank[Tp + j] - 1
  # (the last prompt token for j = 0); masked positions read slot 0.
  select = jnp.where(completion_mask.astype(bool), start[:, None] + rank[:, tp:] - 1, 0)
  return Packed(scatter(seq), scatter(rank), scatter(segment), select.astype(jnp.int32))


def bucket_rows(num_rows: int, buckets: Sequence[float], bin_rows: int = 1) -> tuple[int, ...]:
  """Bins of each of ``buckets`` (fractions of the ``num_rows`` padded rows' slots, bins of
  ``bin_rows`` rows), ascending and distinct; buckets with as many slots as the padded
  layout are left out (the padded pass is the last branch)."""
  bins = sorted({max(1, math.ceil(f * num_rows / bin_rows)) for f in buckets})
  return tuple(p for p in bins if p * bin_rows < num_rows)


def packed_hidden(model: tfm.Transformer, packed: Packed, *, remat: bool = False) -> jax.Array:
  """Final-norm hidden states [R, N, E] predicting each completion token, from packed rows."""
  h, _ = model.hidden(packed.tokens, attention.packed(packed.positions, packed.segments),
                      remat=remat)  # [P, W, E]
  return h.reshape(-1, h.shape[-1])[packed.select]


def completion_scores(model: tfm.Transformer, prompt_tokens, prompt_mask, completion_tokens,
                      completion_mask, *, num_bins: int, bin_rows: int = 2,
                      entropy: bool = False, logits_chunk: int = 0, remat: bool = False):
  """``scoring.completion_scores`` over the rows packed into ``num_bins`` bins of
  ``bin_rows`` rows, which must hold them (``Buckets.index`` picks such a bucket; rows past the
  last bin would be dropped).

  Returns (logp [R, N] float32, entropy [R, N] float32 or None).
  """
  packed = pack(prompt_tokens, prompt_mask, completion_tokens, completion_mask, num_bins,
                bin_rows=bin_rows)
  return scoring.scores_from_hidden(model, packed_hidden(model, packed, remat=remat),
                                    completion_tokens, completion_mask, entropy=entropy,
                                    logits_chunk=logits_chunk)


@dataclasses.dataclass(frozen=True)
class Buckets:
  """Bucket sizes as ``fractions`` of the padded layout's slots, in bins of ``bin_rows`` rows.

  ``run(fn, prompt_mask, completion_mask)`` calls ``fn(num_bins)`` for the smallest bucket the
  rows fit into, or ``fn(None)`` (meaning: the padded pass) when none does, through one
  ``lax.switch`` whose branches are whole computations: a caller that differentiates puts the
  ``value_and_grad`` inside ``fn``, so that each branch is its own forward and backward program
  (differentiating through a switch would make every branch's residuals outputs of the
  forward switch).
  """

  fractions: tuple[float, ...]
  bin_rows: int = 2

  def __post_init__(self):
    if not all(0 < f < 1 for f in self.fractions):
      raise ValueError(f"packing buckets must be fractions in (0, 1), got {self.fractions}")
    if not isinstance(self.bin_rows, int) or self.bin_rows < 1:
      raise ValueError(f"packing bin_rows must be an int >= 1, got {self.bin_rows!r}")

  def bins(self, num_rows: int) -> tuple[int, ...]:
    return bucket_rows(num_rows, self.fractions, self.bin_rows)

  def index(self, prompt_mask, completion_mask) -> jax.Array:
    """int32 scalar: the position in ``bins(R)`` of the smallest bucket that fits, or
    ``len(bins(R))`` (the padded pass)."""
    r, tp = prompt_mask.shape
    width = self.bin_rows * (tp + completion_mask.shape[1])
    used = plan(row_lengths(prompt_mask, completion_mask), width).bins_used
    return jnp.sum(used > jnp.asarray(self.bins(r), jnp.int32)).astype(jnp.int32)

  def run(self, fn: Callable[[int | None], Any], prompt_mask, completion_mask):
    bins = self.bins(prompt_mask.shape[0])
    if not bins:
      return fn(None)
    branches = [functools.partial(fn, p) for p in bins] + [functools.partial(fn, None)]
    return jax.lax.switch(self.index(prompt_mask, completion_mask), branches)

  def metrics(self, prompt_mask, completion_mask) -> dict:
    return metrics(prompt_mask, completion_mask, buckets=self.fractions, bin_rows=self.bin_rows)


def metrics(prompt_mask, completion_mask, *, buckets: Sequence[float],
            bin_rows: int = 2) -> dict:
  """(sum, denominator) pairs of one call's rows, as shares of the padded layout's R x W
  slots: ``real_tokens`` (slots holding a real token) and ``packed_slots`` (slots the decoder
  ran over: the bucket's P x bin_rows x W, or all of them for the padded pass)."""
  r, tp = prompt_mask.shape
  w = tp + completion_mask.shape[1]
  lengths = row_lengths(prompt_mask, completion_mask)
  bins = bucket_rows(r, buckets, bin_rows)
  slots = jnp.asarray([p * bin_rows * w for p in bins] + [r * w], jnp.float32)
  used = plan(lengths, bin_rows * w).bins_used
  computed = slots[jnp.sum(used > jnp.asarray(bins, jnp.int32))]
  return dict(real_tokens=LossParts(jnp.sum(lengths).astype(jnp.float32), jnp.float32(r * w)),
              packed_slots=LossParts(computed, jnp.float32(r * w)))
