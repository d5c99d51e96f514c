"""Simulations: what only a simulation needs, in subpackages by job.

- :mod:`fairclip.sims.executors`: where a simulated run's clients train (in this process, in Ray
  actors), the round loop over a run's server, and the job runner of many runs;
- :mod:`fairclip.sims.compare`, :mod:`fairclip.sims.tune`, :mod:`fairclip.sims.reproduce`: the
  experiments, with what they share in :mod:`fairclip.sims.sweeps` (folders, statistics, plots,
  trackers, progress).

Deployments never pass through here: the server and client of a run live in
:mod:`fairclip.server` and :mod:`fairclip.client`, the scenarios they run in
:mod:`fairclip.scenarios`.
"""
