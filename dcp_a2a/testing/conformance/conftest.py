"""The conformance suite's fixtures (``--impl``, the implementation under test, devices, the
merge check, the pool of ranks): the suite's pytest plugin, so that
``pytest --pyargs dcp_a2a.testing.conformance --impl SPEC`` runs from any directory."""

pytest_plugins = ("dcp_a2a.testing.plugin",)
