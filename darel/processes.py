"""Whether a process still runs (torch-free, so the workflow's start-up code can use it)."""

from __future__ import annotations

import os
from pathlib import Path


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs (an exited process that nobody reaped yet counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
