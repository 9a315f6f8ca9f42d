"""The validation harness of dcp_a2a (the product never imports it).

    cli, validate, report, recorder   ``dcp-a2a validate``: tiers, one summary, a report
    plugin, impl                      the pytest plugin and the implementation under test
    surfaces, verdicts, repro         what an implementation exposes and its envelope; how bad
                                      a failure is; a failure as a few lines of Python
    interpreter                       Triton's CPU interpreter rounding bf16 as a GPU does
    conformance/                      the shipped conformance suite (any implementation)
    mutants/, degraded                broken implementations and merges the suite must catch
    selfcheck, numerics_report        the suite's detection power; headroom vs the bound
    compare, tolerances               one comparison helper; bounds from tolerances.yaml
    data, exchange, tasks, rankpool   test inputs, N ranks in one process, ranks in processes
    accuracy, bench                   the torchrun accuracy job; kernel and collective benchmarks
    outpaths                          output paths checked before any work (the evals too)
"""

from .. import _env as _env  # TRITON_INTERPRET decided before any kernel is defined
from .interpreter import interpreting as _interpreting, round_bf16_like_gpu as _round_bf16

# Every harness process (pytest and its workers, the ranks, the jobs) judges a Triton kernel on
# the CPU by the bf16 values a GPU would store, whoever wrote the kernel (see .interpreter).
if _interpreting():
    _round_bf16()
