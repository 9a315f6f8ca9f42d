"""Adapters that map another engine's functions onto the dcp_a2a contract, so the conformance
suite can validate that engine as it is installed (``--impl vllm``). An adapter holds no copy of
the engine's code: it only calls it."""
