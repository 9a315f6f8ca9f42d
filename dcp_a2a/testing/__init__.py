"""The validation harness of dcp_a2a (the product never imports it).

    cli, validate, report, recorder   ``dcp-a2a validate``: tiers, one summary, a report
    plugin, impl                      the pytest plugin and the implementation under test
    conformance/                      the shipped conformance suite (any implementation)
    mutants/, degraded                broken implementations and merges the suite must catch
    selfcheck, numerics_report        the suite's detection power; headroom vs the bound
    compare, tolerances               one comparison helper; bounds from tolerances.yaml
    data, exchange, tasks, rankpool   test inputs, N ranks in one process, ranks in processes
    accuracy, bench                   the torchrun accuracy job; kernel and collective benchmarks
    outpaths                          output paths checked before any work (the evals too)
"""
