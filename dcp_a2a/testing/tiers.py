"""The tiers of the suite and which of them a run of ``dcp-a2a validate`` includes.

The tiers are the pytest markers of the suite (see ``tests/``): unit, kernel, multiproc,
conformance, numerics (always), gpu (a CUDA device), multigpu (>= 2 CUDA devices), e2e (asked for
with ``--evals``).

How tests are attributed to tiers (also in docs/validate.md):

* A test belongs to every tier whose marker it carries, or to its ``tests/<tier>/`` directory
  when it carries none. Each selected test runs ONCE; a kernel + conformance test counts in both
  rows, so the rows' case counts may add up to more than the total line (which counts tests).
* Tiers are run together in one pytest session (one xdist start-up, no test re-run); only the
  multigpu tier gets its own session, without xdist, so NCCL jobs do not fight over the GPUs.
* A test carrying the marker of a tier that cannot run here (gpu on a CPU machine) or that was not
  asked for (e2e without --evals) is not run, whatever other tiers it is in; it is counted in that
  tier's "not run" column.
"""

from __future__ import annotations

from dataclasses import dataclass

TIERS = ("unit", "kernel", "multiproc", "conformance", "numerics", "gpu", "multigpu", "e2e")


CPU_TIERS = ("unit", "kernel", "multiproc", "conformance", "numerics")


# tiers whose tests need something this machine may lack; their tests never run elsewhere
GATED_TIERS = ("gpu", "multigpu", "e2e")


# the quick subset: unit, kernel and conformance; a test also marked multiproc (spawning ranks) or
# numerics (statistics, large batches, hypothesis) is left out; slow tests dropped; one case per
# test function of the project's own tests, every case of a conformance test (the recorder)
QUICK_TIERS = ("unit", "kernel", "conformance")


QUICK_OUT_REASON = "not in the quick subset"


# why a test is left out under a foreign --impl (the recorder's --dcp-impl-only)
OTHER_CODE = "other code: tests dcp_a2a's own code, not the implementation under test"



@dataclass
class TierPlan:
    name: str
    run: bool
    reason: str | None = None  # why it does not run


def tier_availability(machine: dict, evals: bool) -> dict[str, str | None]:
    """tier -> None if it can run here, else the reason it cannot."""
    n = machine["cuda_device_count"]
    dist = machine["distributed"]
    why: dict[str, str | None] = {t: None for t in TIERS}
    if not dist.get("available") or not (dist.get("gloo") or dist.get("nccl")):
        why["multiproc"] = "torch.distributed has no gloo/nccl backend in this torch build"
    if n == 0:
        cpu_build = machine["torch_cuda"] is None
        why["gpu"] = ("no CUDA GPU (torch %s is a CPU build)" % machine["torch"] if cpu_build
                      else "no CUDA GPU visible (torch.cuda.device_count() == 0)")
    if n < 2:
        why["multigpu"] = f"needs >= 2 CUDA GPUs, found {n}"
    if n and machine.get("triton_mode") == "interpreter":
        # the GPU tiers judge compiled kernels (rounding, contraction, timing): the
        # interpreter would pass them without compiling anything
        for t in ("gpu", "multigpu"):
            why[t] = why[t] or (f"TRITON_INTERPRET={machine.get('TRITON_INTERPRET')} runs "
                                "Triton's interpreter, not the compiled kernels this tier "
                                "checks (unset TRITON_INTERPRET)")
    if not evals:
        why["e2e"] = "not requested (pass --evals)"
    return why


def plan_tiers(machine: dict, requested: list[str] | None, evals: bool,
               quick: bool = False) -> list[TierPlan]:
    """Each tier, run or not and why. ``requested``: the tiers of ``--tiers`` (None: every tier
    this machine supports, or the quick subset); ``evals`` adds the e2e tier to either."""
    why = tier_availability(machine, evals)
    if requested is None:
        requested = list(QUICK_TIERS if quick else TIERS)
        if quick:
            for t in TIERS:
                if t not in requested and why[t] is None and t != "e2e":
                    why[t] = QUICK_OUT_REASON
            if evals:  # asked for by name: the quick subset does not leave it out
                requested.append("e2e")
    plans = []
    for t in TIERS:
        if t not in requested:
            plans.append(TierPlan(t, False, why[t] or "not selected (--tiers)"))
        else:
            plans.append(TierPlan(t, why[t] is None, why[t]))
    return plans


@dataclass
class RunSpec:
    """One pytest session."""
    name: str
    tiers: list[str]
    exclude: list[str]
    workers: str | int | None  # None: no xdist


def plan_runs(plans: list[TierPlan], workers: str | int | None) -> list[RunSpec]:
    run = [p.name for p in plans if p.run]
    # tests of these tiers never run in this job, whatever other tier they are also in
    blocked = [p.name for p in plans if not p.run and (
        p.name in GATED_TIERS or p.reason == QUICK_OUT_REASON)]
    runs = []
    main = [t for t in run if t != "multigpu"]
    if main:
        runs.append(RunSpec("main", main, sorted(set(blocked) | ({"multigpu"} & set(run))),
                            workers))
    if "multigpu" in run:
        runs.append(RunSpec("multigpu", ["multigpu"], sorted(set(blocked)), None))
    return runs

