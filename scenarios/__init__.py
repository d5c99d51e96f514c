"""Scenarios: what a run learns -- its configuration, data, model and task.

A scenario is a TOML file (the built-in ones in ``builtin/``) validated into a
:class:`fairclip.scenarios.config.RunConfig`; its task (:mod:`fairclip.scenarios.tasks`) holds the
clients' data partitioned into cohorts (:mod:`fairclip.scenarios.data`), the model
(:mod:`fairclip.scenarios.models`), local training and the evaluation per cohort. The server of a
run (:mod:`fairclip.server`), fairclip's Flower apps and the simulations (:mod:`fairclip.sims`) all
run scenarios; this room imports only the policies (:mod:`fairclip.strategies`).
"""
