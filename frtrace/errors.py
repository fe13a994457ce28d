"""The errors frtrace raises on purpose, for callers of the Python API to catch.

Takes nothing; defines `FrtraceError` and its kinds. Each message is one line for a
person (it names the file or option at fault); the command line prints it after
`frtrace: error:` and exits 2. Anything else that escapes is a bug of frtrace's.
"""

from __future__ import annotations


class FrtraceError(Exception):
    """Every error frtrace raises on purpose: the inputs, the outputs or the options
    cannot do what was asked."""


class InputError(FrtraceError):
    """The inputs as a whole cannot be analysed: no such path, no dump among them,
    none readable, or an option that does not fit them."""


class OutputError(FrtraceError):
    """An output cannot be written; the message names the path and the reason."""


class JobMismatch(InputError):
    """The two dump sets given to `diff` are not two dumps of one run."""
