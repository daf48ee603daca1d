"""Set-up of every test process, before any test module imports jax: the tests of the
package (tests/) and those beside the scripts they test (benchmarks/, experiments/).
Being at the repository root, this file also puts the root on sys.path, so every test
imports `tests.helpers`, `benchmarks.*` and `experiments.*` alike.

In-process programs compile at XLA optimisation level 0, as the driver subprocesses
already do (tests/helpers.py `driver_env`): it about halves CPU compile time, which
is most of the suite's time, and what the tests check (equalities between programs,
against plain references, within float tolerances) does not depend on code generation.
A test that needs other flags runs its own subprocess with its own XLA_FLAGS.

Every test gets its own $XDG_CACHE_HOME (`_own_xdg_cache`).
"""

import os

import pytest

_O0 = "--xla_backend_optimization_level=0"
if _O0 not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_O0}".strip()


@pytest.fixture(autouse=True)
def _own_xdg_cache(tmp_path_factory, monkeypatch):
    """Each test its own $XDG_CACHE_HOME (subprocesses inherit it): data.parsed_cache's
    default folder never lands in the real home, nor carries entries from test to test."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
