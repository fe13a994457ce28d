"""frtrace: diagnose hung PyTorch distributed jobs from Flight Recorder dumps.

The Python API (`frtrace.api`, documented in docs/api.md), importable from here:

    import frtrace
    analysis = frtrace.analyze("dumps/")        # a str, a Path, or a list of them
    diagnosis = frtrace.diagnose(analysis)
    print(diagnosis.status, diagnosis.suspect_ranks)
    print(diagnosis.to_text())

Layers, each importing only those below it: cli > api > export > report > diagnosis >
match > load > table > wording > model > util > errors (see ARCHITECTURE.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from frtrace._version import __version__

if TYPE_CHECKING:
    from frtrace.api import (
        Analysis,
        Diagnosis,
        Diff,
        Finding,
        FrtraceError,
        InputError,
        JobMismatch,
        OutputError,
        analyze,
        diagnose,
        diff,
        on_cluster,
    )

# Imported on first use: `import frtrace` (and every loader worker that imports a
# submodule) does not pay for the whole library.
API_NAMES = ("Analysis", "Diagnosis", "Diff", "Finding", "FrtraceError", "InputError", "JobMismatch", "OutputError",
             "analyze", "diagnose", "diff", "on_cluster")
__all__ = ["__version__", *API_NAMES]


def __getattr__(name: str) -> Any:
    if name in API_NAMES:
        from frtrace import api

        return getattr(api, name)
    raise AttributeError(f"module 'frtrace' has no attribute {name!r}")
