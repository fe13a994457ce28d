"""The `frtrace` command: a thin click layer over the Python API (`frtrace.api`).

Takes the command line; prints the report on stdout, notes and progress on stderr, and
exits with 0 healthy, 1 faults, 2 usage or input error, 3 inconclusive. One module per
command (`analyse`, the default; `raw` for -j; `diff`), shared options in `options`,
renderers registered by format in `render`, the group and entry point in `main`.
"""

from frtrace.cli.main import cli, main

__all__ = ["cli", "main"]
