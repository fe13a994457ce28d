"""Test and benchmark support: a synthetic NCCL-shaped job generator (`synth`), and the
fast paths' plain twins swapped in on demand (`twins`).

Never imported by the CLI or the analysis: it writes dumps, it does not read them.
"""
