"""fairclip: who pays for differentially private clipping in federated learning.

The component folders are subpackages of this namespace (docs/design.md, section 1):
``fairclip.strategies`` (clipping policies, noise, accounting; pure numpy),
``fairclip.scenarios`` (configuration, data, models and tasks),
``fairclip.client`` (the client side of a policy and the Flower ClientApp),
``fairclip.server`` (a run's server: rounds, privacy, outputs and the Flower ServerApp) and
``fairclip.sims`` (executors and experiments). The public API is :mod:`fairclip.api`, its errors
:mod:`fairclip.errors`; the command line (:mod:`fairclip.cli`) sits on top of both.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _installed_version

try:  # one source, pyproject.toml's [project] version (Flower's app checks need it there, static)
    __version__ = _installed_version("fairclip")
except PackageNotFoundError:  # a copy that was never installed
    __version__ = "0+unknown"

__all__ = [
    "Comparison",
    "ConfigError",
    "DataError",
    "FairclipError",
    "FederatedDataset",
    "FederationError",
    "IdentityError",
    "ModError",
    "NotFiniteError",
    "PluginError",
    "PolicyConfigError",
    "PolicyError",
    "ReplyError",
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

_ERRORS = (
    "ConfigError",
    "DataError",
    "FairclipError",
    "FederationError",
    "IdentityError",
    "ModError",
    "NotFiniteError",
    "PluginError",
    "PolicyConfigError",
    "PolicyError",
    "ReplyError",
)
"""Every error fairclip raises for its user (:mod:`fairclip.errors`)."""

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
    """The public API (:mod:`fairclip.api`, :class:`FederatedDataset`, the errors), imported on
    first use so that ``import fairclip`` stays free of numpy, pandas and torch."""
    if name in _API:
        from fairclip import api  # on first use: pandas, numpy

        return getattr(api, name)
    if name in _ERRORS:
        import fairclip.errors  # on first use: the rooms' error modules import numpy

        return getattr(fairclip.errors, name)
    if name == "FederatedDataset":
        from fairclip.scenarios.data.federated_dataset import FederatedDataset  # on first use: numpy

        return FederatedDataset
    raise AttributeError(f"module 'fairclip' has no attribute {name!r}")
