"""frtrace: diagnose hung PyTorch distributed jobs from Flight Recorder dumps.

Pipeline (one module per stage): loader -> builder -> matcher -> diagnosis ->
report / rawview / database / outputs; `pipeline.analyze` runs the first three and
`cli` wires everything to the `frtrace` command.
"""

__version__ = "0.1.0"
