"""``bounded``: lower-bounded adaptive clipping (Zhao et al., seed 000), fairclip's main method.

Client side and noise exactly as ``adaptive``; the bound update keeps a floor C_LB > 0::

    C_{t+1} = max(C_LB, C_t · exp(η_C · (b̃ − γ)))      with C_LB > 0 required

Without the floor, a majority of small updates can drive the bound so low that a minority's
larger updates are cut to almost nothing (seed 000, Figure 1); C_LB keeps them in play.
"""

from __future__ import annotations

from fairclip.strategies import checks
from fairclip.strategies.adaptive import AdaptiveClipping
from fairclip.strategies.errors import PolicyConfigError


class BoundedAdaptiveClipping(AdaptiveClipping):
    """Adaptive clipping whose bound never falls below ``lower_bound``.

    Defaults equal ``adaptive``'s (C_0 = 1, γ = 0.5, τ = 2.5, η_C = 0.2) so that a comparison
    differs only in C_LB.
    """

    name = "bounded"

    def __init__(
        self,
        *,
        lower_bound: float | None = None,
        initial_bound: float = 1.0,
        target_quantile: float = 0.5,
        threshold_multiplier: float = 2.5,
        bound_lr: float = 0.2,
        num_cohorts: int = 1,
        normalize: bool = False,
    ):
        super().__init__(
            initial_bound=initial_bound,
            target_quantile=target_quantile,
            threshold_multiplier=threshold_multiplier,
            bound_lr=bound_lr,
            num_cohorts=num_cohorts,
            normalize=normalize,
        )
        if lower_bound is None:
            raise PolicyConfigError("policy 'bounded' needs lower_bound (C_LB > 0)")
        self.lower_bound = checks.positive("lower_bound", lower_bound)
        checks.lower_bound_within(self.lower_bound, self.initial_bound)
