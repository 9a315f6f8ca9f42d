"""The conformance suite's fixtures (``--impl``, the implementation under test, devices, the
merge check, the pool of ranks) live in the suite's pytest plugin, :mod:`dcp_a2a.testing.plugin`.
It is loaded with ``-p`` (pytest must know ``--impl`` before it reads the command line):

    pytest -p dcp_a2a.testing.plugin --pyargs dcp_a2a.testing.conformance --impl SPEC

and, in a checkout, by pyproject.toml's ``addopts``. No ``pytest_plugins`` here: pytest refuses
it in a conftest below the root directory (a checkout run of ``pytest -m conformance``)."""
