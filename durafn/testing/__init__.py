"""Testing scheduled work: a fake clock, deterministic runs, and a pytest plugin.

``FakeClock`` moves only when told to; ``finish_all`` and ``advance`` run what is due on
it; ``Harness`` adds the assertions tests of job systems are made of. The pytest plugin
(``durafn.pytest_plugin``, loaded by pytest wherever durafn is installed) hands a test
the fixtures ``fake_clock``, ``durafn_app`` and ``durafn`` (a ``Harness``). durafn's own
suite uses the same helpers.
"""

from __future__ import annotations

from .._executor import RunawayError
from .clock import FakeClock
from .harness import Harness
from .running import advance, all_rows, finish_all, states

__all__ = ["FakeClock", "Harness", "RunawayError", "advance", "all_rows", "finish_all", "states"]
