"""fairclip: who pays for differentially private clipping in federated learning.

The component folders are subpackages of this namespace (docs/design.md, section 1):
``fairclip.strategies`` (clipping policies, noise, accounting; pure numpy),
``fairclip.client`` (local training and the client side of a policy),
``fairclip.server`` (aggregation and the server side of a round) and
``fairclip.sims`` (scenarios, engines, metrics and the command line).
"""

__version__ = "0.1.0"
