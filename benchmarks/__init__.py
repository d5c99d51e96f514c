"""fairclip's benchmark suite (issue #6): fairclip against Flower, Opacus, pfl-research and the
compute floor.

``fairclip bench [w1 w2 w3 w4 w5 w6] [--quick] [--json FILE] [--device cuda]`` (or
``python -m fairclip.benchmarks``; ``--device cuda`` runs W2 on the GPU)
runs the workloads, prints one table and writes the JSON report. Every contender runs in a fresh
subprocess of its own, so its wall time, peak memory, torch thread settings and Ray cluster do not
leak into the next one.

The entry point is :func:`fairclip.benchmarks.run.run_bench`; the command line lives with the
others in :mod:`fairclip.cli`.
"""

from __future__ import annotations

from .run import WORKLOADS, failed_contenders, run_bench, targets

__all__ = ["WORKLOADS", "failed_contenders", "run_bench", "targets"]
