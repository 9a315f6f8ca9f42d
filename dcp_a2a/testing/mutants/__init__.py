"""The mutant corpus: deliberately broken implementations of the dcp_a2a contract.

Each module here is one realistic bug, loadable as an implementation under test
(``pytest -m conformance --impl dcp_a2a.testing.mutants.<name>``); its docstring's first line names the
class of failure it stands for. ``dcp-a2a self-check`` runs the conformance tier
against every one of them and fails if any survives: the suite's detection power, measured.

Most mutants override one step of :class:`dcp_a2a.reference.contract.ReferenceContract` (so the rest
of the implementation is correct); a few wrap the project's own Triton implementation. Modules
whose name starts with ``_`` are helpers, not mutants.
"""
