"""Test and benchmark support: a synthetic NCCL-shaped job generator (`synth`).

Never imported by the CLI or the analysis: it writes dumps, it does not read them.
"""
