"""The benchmarks run against both implementations, like the tests."""

from tests.conftest import hw, hw_module  # noqa: F401  (fixtures)
