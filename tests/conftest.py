"""Fixtures that several test modules of tests/ share (the root conftest.py sets up every
test process)."""

import pytest

from cpbjax.data import parsing


@pytest.fixture
def csv_parses(monkeypatch):
    """The names of the kline CSVs parsed in this process since the test began (a parse in
    a worker process is not counted)."""
    parsed, parse = [], parsing.read_kline_csv

    def counted(data, name):
        parsed.append(name)
        return parse(data, name)

    monkeypatch.setattr(parsing, "read_kline_csv", counted)
    return parsed
