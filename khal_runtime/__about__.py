"""The version of khal-runtime (runtime/pyproject.toml says the same; tests/test_distributions.py checks)."""

__version__ = "0.2.0"
