"""frtrace: diagnose hung PyTorch distributed jobs from Flight Recorder dumps.

Pipeline (one module per stage): loader -> builder -> matcher -> diagnosis ->
report / rawview / database / outputs; `pipeline.analyze` runs the first three and
`cli` wires everything to the `frtrace` command.
"""

from frtrace._version import __version__

__all__ = ["__version__"]
