"""The fault harness reuses the agent tests' real-process fixtures (a killable `gpufleet serve`)."""

from tests.agent.conftest import collector_process  # noqa: F401 - a fixture, used by name
