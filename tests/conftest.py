"""Shared fixtures: the live servers of tests/server_harness.py, built once per pytest run."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _stop_servers_at_session_end():
    yield
    from tests import server_harness as h
    h.stop_all()


@pytest.fixture(scope="session")
def spec():
    """A live speculative server (tiny target + drafter fitted to it)."""
    from tests import server_harness as h
    return h.spec_server()


@pytest.fixture(scope="session")
def plain(spec):
    """A live server on the same target without speculation."""
    from tests import server_harness as h
    return h.plain_server()
