"""One line per log record in fairclip's Flower apps.

Opacus' ``opacus.utils.module_utils`` calls ``logging.basicConfig`` when it is imported, which
gives the root logger a handler on standard error. Flower's logger (``flwr``) has its own console
handler and propagates to the root logger, so in a ServerApp or ClientApp that imports Opacus
every line was printed twice (once as ``INFO : ...``, once as ``11/24/2026 21:03:06:INFO:...``).
:func:`drop_opacus_root_handler` removes exactly the handler Opacus added and nothing else.

It does not import Opacus itself: a ClientApp never uses it, and Flower starts a new ClientApp
process for every message of a deployment (a round of secure aggregation sends each node eight),
where importing Opacus and the SciPy it brings cost 3 of the 7 seconds of each start.
"""

from __future__ import annotations

import logging
import sys

OPACUS_FORMAT = "%(asctime)s:%(levelname)s:%(message)s"
"""The format Opacus passes to ``logging.basicConfig``."""


OPACUS_LOGGING_MODULE = "opacus.utils.module_utils"
"""The Opacus module whose import calls ``logging.basicConfig``."""


def drop_opacus_root_handler() -> None:
    """Remove the root handler that Opacus' import added, where this process has imported Opacus.

    Call it after the imports that bring Opacus (a ServerApp's accountants); where Opacus was not
    imported there is no such handler and nothing is done.
    """
    if OPACUS_LOGGING_MODULE not in sys.modules:
        return
    root = logging.getLogger()
    for handler in list(root.handlers):
        formatter = handler.formatter
        if formatter is not None and formatter._fmt == OPACUS_FORMAT:
            root.removeHandler(handler)
