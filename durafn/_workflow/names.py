"""The durable names of durafn's two workflow mutations, and their references on an app."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._models import Completion
from .._registry import MutationRef

if TYPE_CHECKING:
    from .._runtime import Runtime

TURN = "durafn:workflow_turn"
"""The durable name of durafn's mutation that runs a workflow's turn."""
STEP_DONE = "durafn:workflow_step_done"
"""The durable name of durafn's mutation that journals an action step's outcome."""


def turn_ref(rt: Runtime) -> MutationRef[Any, Any]:
    ref = rt.registry.get(TURN)
    assert isinstance(ref, MutationRef)
    return ref


def step_done_ref(rt: Runtime) -> MutationRef[[Completion], Any]:
    ref = rt.registry.get(STEP_DONE)
    assert isinstance(ref, MutationRef)
    return ref
