"""fairclip in your own Flower app: user-level DP with a fairclip clipping policy.

Two additions turn an existing Flower 1.41 app into a fairclip-private one::

    # server_app.py
    from fairclip.flower import DifferentialPrivacy
    strategy = DifferentialPrivacy(FedAvg(fraction_train=1.0), "bounded", {"lower_bound": 0.05},
                                   num_clients=100, sample_rate=0.5, noise_multiplier=1.0)

    # client_app.py
    from fairclip.flower import fairclip_mod
    app = ClientApp(mods=[fairclip_mod])

:class:`DifferentialPrivacy` (:mod:`fairclip.server.dp_strategy`) samples (Poisson, over the
population of ``num_clients``), checks replies,
noises with the sensitivity of the round, moves the bound and accounts ε; :func:`fairclip_mod`
(:mod:`fairclip.client.mod`) clips the app's update on the node and sends the policy's report
bits and nothing else. ``examples/flower-app`` is a complete app.
"""

from fairclip.client.mod import fairclip_mod
from fairclip.server.dp_strategy import DifferentialPrivacy

__all__ = ["DifferentialPrivacy", "fairclip_mod"]
