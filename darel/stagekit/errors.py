"""The one-line stop every stage and the stage kit use (below ``cli`` and ``watchdog``, which
both call it)."""

from __future__ import annotations

import logging


def fail(logger: logging.Logger, message: str) -> None:
    """Stop a stage with a message meant for the user: logged, printed, no traceback (and
    no password: darel.tracking.scrub)."""
    from darel.tracking import scrub

    message = scrub(message)
    logger.error(message)
    raise SystemExit(message)
