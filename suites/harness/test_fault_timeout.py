"""How long a bad-input case's load may wait is one rule (options.fault_timeout_for), the
same for the CLI, ``run_cases`` and the plugin: a quarter of the run's timeout, at least
30 s, never more than the timeout itself."""
from __future__ import annotations

from fsdp_conformance.options import RunOptions, fault_timeout_for


def test_a_quarter_of_the_timeout_at_least_30_s_never_more_than_the_timeout():
    assert fault_timeout_for(120.0) == 30.0
    assert fault_timeout_for(600.0) == 150.0
    assert fault_timeout_for(10.0) == 10.0  # was 30 s on the CLI and in run_cases
    assert RunOptions(timeout=10.0).fault_timeout == 10.0
    assert RunOptions.for_user(timeout=10.0).fault_timeout == 10.0
    assert RunOptions(timeout=600.0).fault_timeout == 150.0
    assert RunOptions(timeout=600.0, fault_timeout=20.0).fault_timeout == 20.0  # as given
