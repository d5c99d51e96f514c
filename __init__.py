"""fairclip: who pays for differentially private clipping in federated learning.

The component folders are subpackages of this namespace (docs/design.md, section 1):
``fairclip.strategies`` (clipping policies, noise, accounting; pure numpy),
``fairclip.client`` (local training and the client side of a policy),
``fairclip.server`` (aggregation and the server side of a round) and
``fairclip.sims`` (scenarios, engines, metrics and the command line).
"""

__version__ = "0.1.0"

__all__ = ["Simulation", "__version__", "simulate"]

_API = ("Simulation", "simulate")


def __getattr__(name: str):
    """``fairclip.simulate`` and ``fairclip.Simulation`` (:mod:`fairclip.api`), imported on first
    use so that ``import fairclip`` (and the command line's start) stays free of torch."""
    if name in _API:
        from fairclip import api

        return getattr(api, name)
    raise AttributeError(f"module 'fairclip' has no attribute {name!r}")
