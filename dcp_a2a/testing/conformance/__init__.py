"""The conformance suite: contract-level tests that validate ANY implementation of the packed
DCP all-to-all (the four contract functions; see docs/conformance.md).

    pip install 'dcp-a2a[test]'
    pytest -p dcp_a2a.testing.plugin --pyargs dcp_a2a.testing.conformance \
        --impl my_engine.dcp_adapter -n 2

Each test carries a ``conformance`` marker, its tier's marker (unit, kernel, multiproc, numerics,
gpu, multigpu) and a ``clause`` naming the part of the contract it checks (see
``CLAUSES`` in :mod:`dcp_a2a.testing.plugin`).
"""
