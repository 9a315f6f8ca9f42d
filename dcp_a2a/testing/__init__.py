"""The validation harness of dcp_a2a (the product never imports it).

    cli, args                         ``dcp-a2a``: one command line, one set of flag rules
    validate, tiers, machine,         ``dcp-a2a validate``: the plan, the pytest sessions, the
      sessions, evaljobs, tally,      tally, one summary, a report
      progress, report, recorder
    plugin, impl                      the pytest plugin and the implementation under test
    surfaces, verdicts, repro         what an implementation exposes and its envelope; how bad
                                      a failure is; a failure as a few lines of Python
    interpreter                       Triton's CPU interpreter rounding bf16 as a GPU does
    conformance/                      the shipped conformance suite (any implementation)
    mutants/, degraded                broken implementations and merges the suite must catch
    selfcheck, conformance_run        the suite's detection power (``dcp-a2a self-check``)
    numerics_report                   headroom vs the bound
    compare, tolerances               one comparison helper; bounds from tolerances.yaml
    data, exchange, tasks, rankpool,  test inputs, N ranks in one process, ranks in processes,
      devices                         where a rank computes
    accuracy, accuracy_cases,         ``dcp-a2a accuracy``: lse_reduce on a process group vs the
      accuracy_report                 oracle
    bench, bench_grid,                ``dcp-a2a bench``: kernel timings, the grid against the
      bench_collective, timing        baselines, the exchange end to end; how a kernel is timed
    gpucheck, engines                 ``dcp-a2a gpu-check``, ``dcp-a2a engines``
    outpaths, childenv                output paths checked before any work (the evals too); the
                                      environment of a process the harness starts
"""

from .. import _env as _env  # TRITON_INTERPRET decided before any kernel is defined
from .interpreter import interpreting as _interpreting, round_bf16_like_gpu as _round_bf16

# Every harness process (pytest and its workers, the ranks, the jobs) judges a Triton kernel on
# the CPU by the bf16 values a GPU would store, whoever wrote the kernel (see .interpreter).
if _interpreting():
    _round_bf16()
