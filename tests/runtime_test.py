"""Tests for cpbjax/runtime.py's fast_threefry: the faster-compiling lowering of the
threefry hash draws the same bits."""

import jax
import jax.extend.random
import numpy as np
import pytest

from cpbjax import runtime
from tests import references

# Random123's known answers for threefry2x32-20: (key, counter) -> output.
KNOWN = [
    ((0x0, 0x0), (0x0, 0x0), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
]


@pytest.mark.parametrize(("key", "count", "expected"), KNOWN)
def test_the_numpy_reference_gives_the_known_answers(key, count, expected):
    out = references.threefry2x32(np.array(key, np.uint32), *np.array(count, np.uint32))
    assert [int(o) for o in out] == list(expected)


@pytest.mark.parametrize("shape", [(2, 3, 2), (2, 3, 8, 5, 7)], ids=["key", "mask"])
def test_the_fast_lowering_hashes_as_the_reference(shape):
    """A key-sized hash (rolled) and a mask-sized one (unrolled: no while loop to compile)."""
    runtime.fast_threefry()
    rng = np.random.default_rng(0)
    key_2 = rng.integers(0, 2**32, 2, dtype=np.uint32)
    x1, x2 = rng.integers(0, 2**32, (2, *shape), dtype=np.uint32)
    counts = np.stack([x1, x2]).ravel()  # threefry_2x32 hashes its halves as the pairs
    hash_fn = jax.jit(jax.extend.random.threefry_2x32)
    if jax.default_backend() == "cpu":
        unrolled = x1.size >= runtime.UNROLLED_THREEFRY_WORDS
        assert ("while" not in hash_fn.lower(key_2, counts).as_text()) == unrolled
    hashed = hash_fn(key_2, counts)
    expected = references.threefry2x32(key_2, x1, x2)
    np.testing.assert_array_equal(np.asarray(hashed), np.concatenate([e.ravel() for e in expected]))


def test_the_compilation_cache_sits_beside_the_parsed_arrays_unless_told_otherwise(monkeypatch):
    """$XDG_CACHE_HOME/cpbjax/xla (as data/parsed_cache.py's parsed/), ~/.cache without it;
    a user's JAX_COMPILATION_CACHE_DIR is kept; CPBJAX_COMPILATION_CACHE wins, empty = none."""
    for name in ("CPBJAX_COMPILATION_CACHE", "JAX_COMPILATION_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/x/cache")
    assert runtime.compilation_cache() == "/x/cache/cpbjax/xla"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    monkeypatch.setenv("HOME", "/home/u")
    assert runtime.compilation_cache() == "/home/u/.cache/cpbjax/xla"
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/jax/own")
    assert runtime.compilation_cache() == "/jax/own"
    monkeypatch.setenv("CPBJAX_COMPILATION_CACHE", "~/cold")
    assert runtime.compilation_cache() == "/home/u/cold"
    monkeypatch.setenv("CPBJAX_COMPILATION_CACHE", "")
    assert runtime.compilation_cache() == ""
