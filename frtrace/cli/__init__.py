"""The `frtrace` command: a thin click layer over the library.

Takes the command line; prints the report on stdout, notes on stderr, and exits with
0 healthy, 1 faults, 2 usage or input error, 3 inconclusive.
"""

from frtrace.cli.analyse import main

__all__ = ["main"]
