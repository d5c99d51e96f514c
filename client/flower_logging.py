"""One line per log record in fairclip's Flower apps.

Opacus' ``opacus.utils.module_utils`` calls ``logging.basicConfig`` when it is imported, which
gives the root logger a handler on standard error. Flower's logger (``flwr``) has its own console
handler and propagates to the root logger, so in a ServerApp or ClientApp that imports Opacus
every line was printed twice (once as ``INFO : ...``, once as ``11/24/2026 21:03:06:INFO:...``).
:func:`drop_opacus_root_handler` removes exactly the handler Opacus added and nothing else.
"""

from __future__ import annotations

import logging

OPACUS_FORMAT = "%(asctime)s:%(levelname)s:%(message)s"
"""The format Opacus passes to ``logging.basicConfig``."""


def drop_opacus_root_handler() -> None:
    """Import Opacus' module (so its ``basicConfig`` has run) and remove the root handler it added."""
    import opacus.utils.module_utils  # noqa: F401  (its logging.basicConfig runs at import)

    root = logging.getLogger()
    for handler in list(root.handlers):
        formatter = handler.formatter
        if formatter is not None and formatter._fmt == OPACUS_FORMAT:
            root.removeHandler(handler)
