"""Slow steps done once (a model fetched, exported or calibrated), announced before they start.

The library only logs: ``logger.info("exporting ...", extra=ONE_TIME)``. The command line shows these records even
when it shows no other INFO line (:class:`Shown`), so a first search that exports a model for half a minute says
so first instead of hanging silently.
"""

from __future__ import annotations

import logging

ONE_TIME = {"one_time": True}


class Shown(logging.Filter):
    """A handler filter: records at ``level`` or above, and every one-time announcement."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level or bool(getattr(record, "one_time", False))
