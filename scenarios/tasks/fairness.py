"""Group fairness of the released model on the server's own test data, with Fairlearn.

For a binary task whose cohorts partition the test set (a protected attribute: ``adult``,
``dutch``, the synthetic demo), per cohort k with predictions ŷ and labels y:

    TPR_k = P(ŷ = 1 | y = 1, k)        FPR_k = P(ŷ = 1 | y = 0, k)        selection_k = P(ŷ = 1 | k)

and across cohorts (Fairlearn's definitions):

    demographic-parity difference = max_k selection_k − min_k selection_k
    equalized-odds difference     = max(max_k TPR_k − min_k TPR_k,  max_k FPR_k − min_k FPR_k)

Computed with ``fairlearn.metrics.MetricFrame`` (a maintained implementation of exactly these),
never by hand. The test set is the server's own data, so these are public evaluations of the
released model, like its accuracy. A cohort given as a class mix (``skewed-mnist``'s minority)
weighs every test row instead of owning some of them: there is no partition to compare, and none
of these are reported.
"""

from __future__ import annotations

import numpy as np


def partition(cohort_weights: dict[str, np.ndarray]) -> np.ndarray | None:
    """Each test row's cohort index where every row belongs to exactly one cohort (weight 1 in
    it, 0 in the others); ``None`` otherwise."""
    if not cohort_weights:
        return None
    matrix = np.stack([np.asarray(w, dtype=np.float64) for w in cohort_weights.values()], axis=1)
    if not (np.isin(matrix, (0.0, 1.0)).all() and (matrix.sum(axis=1) == 1).all()):
        return None
    return matrix.argmax(axis=1)


def group_fairness(
    labels: np.ndarray, predictions: np.ndarray, cohorts: np.ndarray, names: list[str]
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """(differences across cohorts, TPR/FPR/selection rate per cohort) of binary predictions;
    ``cohorts`` holds each row's index into ``names``. A cohort with no positive (negative) test
    row has TPR (FPR) NaN."""
    from fairlearn.metrics import MetricFrame, false_positive_rate, selection_rate, true_positive_rate

    groups = np.asarray(names, dtype=object)[np.asarray(cohorts)]
    frame = MetricFrame(
        metrics={"tpr": true_positive_rate, "fpr": false_positive_rate, "selection_rate": selection_rate},
        y_true=labels,
        y_pred=predictions,
        sensitive_features=groups,
    )
    by_group = frame.by_group
    per_cohort = {
        name: {metric: float(by_group.loc[name, metric]) for metric in ("tpr", "fpr", "selection_rate")}
        for name in names
        if name in by_group.index
    }
    # one frame for all three (each of Fairlearn's difference functions builds its own, and a
    # frame costs about 0.1 s): the same between-groups differences those functions return
    spread = frame.difference(method="between_groups")
    overall = {
        "demographic_parity_difference": float(spread["selection_rate"]),
        "equalized_odds_difference": float(max(spread["tpr"], spread["fpr"])),
    }
    return overall, per_cohort
