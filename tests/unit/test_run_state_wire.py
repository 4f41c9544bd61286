"""GetStatus sends the run's state as the v1 enum value of the same name, for every state."""

from powertrip.services.aggregator.run_status import WIRE_STATE, RunState
from powertrip.v1 import aggregator_pb2


def test_every_run_state_goes_on_the_wire_under_its_own_name() -> None:
    assert set(WIRE_STATE) == set(RunState)
    for state, wire in WIRE_STATE.items():
        assert aggregator_pb2.RunState.Name(wire) == f"RUN_STATE_{state.name}"
        assert wire == state.value  # the numbers agree too: old clients compare them
