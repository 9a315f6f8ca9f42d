"""The numerics tier of the conformance suite: error bound, extremes, metamorphic relations,
statistics, determinism."""
