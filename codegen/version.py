"""opgen's version, stated once: it keys every cached cubin and tuning record,
and pyproject.toml reads it (tool.setuptools.dynamic)."""
__version__ = "0.1.0"
