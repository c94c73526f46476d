"""Moved to tests/fakes.py (`FakeNodeTable`); kept as an alias for the tests that still import it from
here (test_allocation_agent.py, test_supervisor_stragglers.py), until they are updated."""

from tests.fakes import FakeNodeTable

__all__ = ["FakeNodeTable"]
