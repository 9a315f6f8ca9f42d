"""The project's test suite: the fixtures come from the suite's pytest plugin
(dcp_a2a/testing/plugin.py), which the shipped conformance suite uses too."""

pytest_plugins = ("dcp_a2a.testing.plugin",)
