"""``bounded``: lower-bounded adaptive clipping (Zhao et al., seed 000), fairclip's main method.

Client side and noise exactly as ``adaptive``; the bound update keeps a floor C_LB > 0::

    C_{t+1} = max(C_LB, C_t · exp(η_C · (b̃ − γ)))      with C_LB > 0 required

Without the floor, a majority of small updates can drive the bound so low that a minority's
larger updates are cut to almost nothing (seed 000, Figure 1); C_LB keeps them in play.
"""

from __future__ import annotations

from pydantic import model_validator

from fairclip.strategies.adaptive import AdaptiveClipping
from fairclip.strategies.params import PositiveFinite, lower_bound_within


class BoundedAdaptiveClipping(AdaptiveClipping):
    """Adaptive clipping whose bound never falls below ``lower_bound``.

    Defaults equal ``adaptive``'s (C_0 = 1, γ = 0.5, τ = 2.5, η_C = 0.2) so that a comparison
    differs only in C_LB.
    """

    name = "bounded"

    class Params(AdaptiveClipping.Params):
        lower_bound: PositiveFinite
        """C_LB > 0, required, at most C_0."""

        @model_validator(mode="after")
        def _floor_within_start(self) -> BoundedAdaptiveClipping.Params:
            lower_bound_within(self.lower_bound, self.initial_bound)
            return self
