"""DAREL (Data Reduction with Losses): reference reproduction.

Algorithms live in importable, I/O-free modules (selection, budget, sampler,
models, metrics); ``stages/`` holds the thin command-line entry points that read
inputs, call these functions and write outputs.
"""

__version__ = "0.1.0"
