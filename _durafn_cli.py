"""The ``durafn`` command's entry point (``python -m _durafn_cli`` is the same).

It lives outside the ``durafn`` package so that it runs before the package's imports
(about 0.9 s of SQLAlchemy, pydantic, and then the user's app): SIGTERM and SIGINT that
arrive meanwhile are recorded, not fatal. The command decides what they meant once it
runs (``durafn.cli.signals``): a worker stops cleanly, with status 0, before it claims
anything; every other command gets them as though they had just arrived. Standard library
only, for the same reason.
"""

from __future__ import annotations

import signal
from types import FrameType


class EarlySignals:
    """A signal handler that records what it receives (``received``) and does nothing else."""

    def __init__(self) -> None:
        self.received: list[int] = []

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)


def main() -> None:
    early = EarlySignals()
    signal.signal(signal.SIGTERM, early)
    signal.signal(signal.SIGINT, early)
    from durafn.cli import main as cli

    cli()


if __name__ == "__main__":
    main()
