"""fairclip: who pays for differentially private clipping in federated learning.

The component folders are subpackages of this namespace (docs/design.md, section 1):
``fairclip.strategies`` (clipping policies, noise, accounting; pure numpy),
``fairclip.client`` (local training and the client side of a policy),
``fairclip.server`` (aggregation and the server side of a round) and
``fairclip.sims`` (scenarios, engines, metrics and the command line).
"""

__version__ = "0.1.0"

__all__ = [
    "Comparison",
    "FederatedDataset",
    "Reproduction",
    "Scenario",
    "Simulation",
    "__version__",
    "compare",
    "reproduce",
    "simulate",
    "tune",
    "tune_curve",
]

_API = (
    "Comparison",
    "Reproduction",
    "Scenario",
    "Simulation",
    "compare",
    "reproduce",
    "simulate",
    "tune",
    "tune_curve",
)


def __getattr__(name: str):
    """The public API (:mod:`fairclip.api`, :class:`FederatedDataset`), imported on first use so
    that ``import fairclip`` (and the command line's start) stays free of torch."""
    if name in _API:
        from fairclip import api

        return getattr(api, name)
    if name == "FederatedDataset":
        from fairclip.sims.federated_dataset import FederatedDataset

        return FederatedDataset
    raise AttributeError(f"module 'fairclip' has no attribute {name!r}")
