"""A stored run configuration against today's: is a finished run, or a checkpoint, this run?

A sweep's ``--resume`` reuses a finished run, and a checkpoint continues one, only where it was
made with the same configuration (:func:`same_configuration`), resolved as today's code resolves it.
"""

from __future__ import annotations

from typing import Any

from fairclip.atomic import json_normalised
from fairclip.scenarios.config import RunConfig, canonical_raw, validate
from fairclip.scenarios.errors import ConfigError


def same_configuration(stored: dict[str, Any], config: RunConfig) -> bool:
    """Whether the stored configuration ``stored`` (a run's, as its summary or checkpoint keeps
    it) is ``config``: resolved as today's code resolves it, so that a key added to fairclip
    since (at its default) does not make it another, nor does a default that now depends on the
    machine, where it resolves here to the stored value (:func:`as_run_here`). A key fairclip no
    longer knows makes it another. ``training.eval_every`` is not compared: it decides which
    rows of ``rounds.csv`` are evaluated, never the training or the summary
    (``tests/test_eval_every.py``), so a run differs only in how densely its curve was sampled --
    except where its clients evaluate the model (``evaluation.clients``), whose evaluations are
    releases that ε counts.
    A configuration stored before ``[strategy]`` was renamed ``[policy]`` is read as ``[policy]``."""
    try:
        stored = canonical_raw(stored, quiet=True)
    except ConfigError:
        return False
    wanted = _without_evaluation_schedule(as_run_here(json_normalised(config.as_dict())))
    if _without_evaluation_schedule(stored) == wanted:
        return True
    try:
        resolved = as_run_here(json_normalised(validate(stored).as_dict()))
    except ConfigError:
        return False
    return _without_evaluation_schedule(resolved) == wanted


def _without_evaluation_schedule(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` without ``training.eval_every`` (see :func:`same_configuration`), unless its
    clients evaluate the model (``evaluation.clients``): then the schedule is how many noisy
    evaluations are released and accounted, and another one is another run."""
    training = config.get("training")
    evaluation = config.get("evaluation")
    if isinstance(evaluation, dict) and evaluation.get("clients"):
        return config
    if not isinstance(training, dict) or "eval_every" not in training:
        return config
    return {**config, "training": {k: v for k, v in training.items() if k != "eval_every"}}


def as_run_here(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (a normalised run configuration) with its machine-dependent defaults filled in
    as this machine would run it: an unset ``training.one_step_rows`` becomes 32 on the CPU and
    1,024 on a GPU (:func:`fairclip.scenarios.tasks.classification.rows_per_one_step_call`). A run stored
    with ``one_step_rows`` 32, from before that default depended on the device, is then the same
    configuration as an unset one on a CPU -- the same value, so the same run."""
    training = config.get("training")
    if not isinstance(training, dict) or training.get("one_step_rows") is not None:
        return config
    # torch: only for a stored configuration that needs the device's default
    from fairclip.scenarios.models import resolve_device
    from fairclip.scenarios.tasks.classification import rows_per_one_step_call

    rows = rows_per_one_step_call(resolve_device(training.get("device", "auto")))
    return {**config, "training": {**training, "one_step_rows": rows}}
