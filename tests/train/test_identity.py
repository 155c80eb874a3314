"""``rlpost.train.identity``: file digests are remembered per (path, size, mtime, inode), so a
launch that reads a run's identity twice hashes the weights once, and a changed file is hashed
again."""

import hashlib
import os

from rlpost.train import identity


def test_a_file_is_hashed_once_until_it_changes(tmp_path):
  path = tmp_path / "model.safetensors"
  path.write_bytes(b"a" * 4096)
  old = 1_600_000_000
  os.utime(path, (old, old))
  identity._file_digest.cache_clear()
  first = identity.digest_path(str(path))
  assert first == hashlib.sha256(b"a" * 4096).hexdigest()
  assert identity.digest_path(str(path)) == first
  info = identity._file_digest.cache_info()
  assert (info.misses, info.hits) == (1, 1)
  # The same size, rewritten in place: its modification time moves, so it is hashed afresh.
  path.write_bytes(b"b" * 4096)
  os.utime(path, (old + 1, old + 1))
  assert identity.digest_path(str(path)) == hashlib.sha256(b"b" * 4096).hexdigest()
  # A file modified within RECENT_NS is never served from the cache (a clock tick can hide a
  # second write of the same size).
  path.write_bytes(b"c" * 4096)
  misses = identity._file_digest.cache_info().misses
  assert identity.digest_path(str(path)) == hashlib.sha256(b"c" * 4096).hexdigest()
  assert identity._file_digest.cache_info().misses == misses
