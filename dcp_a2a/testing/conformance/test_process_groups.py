"""Conformance on real process groups: ``lse_reduce`` across groups of 2 and 3 gloo ranks of a
4-rank world.

Each rank holds a different partial; every rank's result must be the oracle's merge of all
ranks' partials restricted to its own heads [r*H/N, (r+1)*H/N). This is where an exchange that
is skipped, goes to the wrong peers, or maps heads to the wrong rank shows — none of which a
single-process test can see. See _ranks.py for the scenarios.
"""

from __future__ import annotations

import hashlib
import os

import pytest
import torch
from filelock import FileLock

from dcp_a2a.testing.conformance._ranks import (BY_NAME, SCENARIOS, fitted, run_group,
                                                scenario_inputs)
from dcp_a2a.testing.conformance._refusals import (NOT_DIVISIBLE_WORDS, STRIDE_WORDS,
                                                   names_the_problem)
from dcp_a2a.testing.data import heads_of
from dcp_a2a.testing.surfaces import NOT_APPLICABLE
from dcp_a2a.testing.verdicts import IMPL_RAISED, Convention, Defect

pytestmark = [pytest.mark.conformance, pytest.mark.multiproc, pytest.mark.clause("exchange"),
              pytest.mark.needs("lse_reduce")]


@pytest.fixture(scope="session")
def group_results(impl, tmp_path_factory):
    """The ranks' results, computed once per session and shared by the xdist workers."""
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    root = tmp_path_factory.getbasetemp()
    if run_id:  # workers of one run share the parent of their base temp dirs
        root = root.parent
    key = hashlib.sha1(f"{run_id}:{impl.spec}".encode()).hexdigest()[:12]
    out_dir = root / f"conformance-ranks-{key}"
    with FileLock(str(out_dir) + ".lock"):
        done = out_dir / "results.pt"
        if done.exists():
            return torch.load(done, weights_only=False)
        res = run_group(impl.spec, out_dir)
        torch.save(res, done)
        return res


def _rank_record(group_results, sc, r):
    """What the process of group rank ``r`` (global rank ``sc.members[r]``) recorded."""
    ranks = group_results["ranks"]
    g = sc.members[r]
    rec = None if ranks[g] is None else ranks[g].get(sc.name)
    if rec is None:
        pytest.fail(f"rank {r} (global rank {g}) has no result for {sc.name}; "
                    + "; ".join(group_results["problems"] or ["no reason recorded"]))
    return rec


MERGES = [s.name for s in SCENARIOS if s.h % s.n == 0 and not s.backend]
BACKENDS = [s.name for s in SCENARIOS if s.backend]


def _scenario(impl, name):
    """The scenario ``name`` as the ranks ran it (inside the implementation's envelope)."""
    sc = BY_NAME[name]
    if sc.masked and not impl.exposes("masking"):
        pytest.skip(f"{NOT_APPLICABLE}masking (implementation {impl.spec} does not expose it)")
    impl.envelope.require(base_e=sc.base_e, world_size=sc.n)
    return fitted(sc, impl.envelope)


class RankRefused(RuntimeError):
    """A rank's lse_reduce raised on valid input (recorded in the rank's process)."""


@pytest.mark.parametrize("name", [n for n in MERGES if "lse_" not in n])
def test_every_rank_gets_the_merge_of_its_heads(impl, group_results, merge_check, name):
    _check_merges(group_results, merge_check, _scenario(impl, name))


@pytest.mark.parametrize("name", [n for n in MERGES if "lse_" in n])
def test_lse_of_another_layout_is_read_through_its_strides(impl, group_results, merge_check,
                                                           name):
    """An LSE that is a transposed [H, B] tensor's view, or one value a row expanded over the
    heads (stride 0), as engines pass them: every rank still gets the merge of its heads."""
    _check_merges(group_results, merge_check, _scenario(impl, name))


@pytest.mark.parametrize("name", BACKENDS)
def test_the_projects_other_exchanges_on_a_group_not_at_rank_0(impl, project_only,
                                                               group_results, merge_check,
                                                               name):
    """dcp_a2a's two_collective and ag_rs backends on global ranks {1, 2} of 3 (ag_rs weights
    this rank's output by its rank in the group, never the global one)."""
    _check_merges(group_results, merge_check, BY_NAME[name])


def _check_merges(group_results, merge_check, sc):
    outs, _, _, _, seen = scenario_inputs(sc)
    for r in range(sc.n):
        rec = _rank_record(group_results, sc, r)
        if not rec["ok"]:
            if rec.get("unsupported"):
                pytest.skip(f"{NOT_APPLICABLE}{rec['message']}")
            if sc.lse_layout != "contiguous" and rec["error"] in ("ValueError", "TypeError"):
                # a strided LSE may be refused naming it (the contract), never misread
                if not names_the_problem(rec["message"], STRIDE_WORDS):
                    raise Convention(f"rank {r}: refused the strided LSE in words that do not "
                                     f"name it: {rec['message']!r}")
                continue
            e = RankRefused(f"rank {r} raised {rec['error']}: {rec['message']}\n"
                            f"{rec['traceback']}")
            setattr(e, IMPL_RAISED, True)  # the implementation refused valid input
            raise e
        res = rec["result"]
        out, lse = res if sc.return_lse else (res, None)
        assert isinstance(out, torch.Tensor), f"rank {r} returned {type(out).__name__}"
        assert out.dtype == sc.dtype and tuple(out.shape) == (sc.b, sc.h // sc.n, sc.d), \
            f"rank {r}: got {out.dtype} {tuple(out.shape)}"
        if sc.b == 0:
            continue
        try:
            merge_check(out, lse, outs, seen, is_lse_base_on_e=sc.base_e,
                        heads=heads_of(r, sc.n, sc.h),
                        kind="ag_rs" if sc.backend == "ag_rs" else "a2a")  # its own bound
        except AssertionError as e:  # the same severity, naming the rank
            raise type(e)(f"rank {r} of {sc.n}: {e}") from None
        if rec["inputs_modified"]:
            raise Defect(f"rank {r}: lse_reduce modified the caller's "
                         f"{', '.join(rec['inputs_modified'])}")
        assert not rec["collective_overlaps"], \
            f"rank {r}: a collective received into memory it was sending from (a race on " \
            f"NCCL; gloo with CUDA tensors hides it): {'; '.join(rec['collective_overlaps'])}"


@pytest.mark.clause("bad input")  # overrides the module's clause
@pytest.mark.parametrize("name", [s.name for s in SCENARIOS if s.h % s.n])
def test_bad_input_raises_on_every_rank_without_hanging(impl, group_results, name):
    """A ValueError on every rank, before any rank enters a collective (otherwise the others
    would wait in it until the process-group timeout)."""
    sc = _scenario(impl, name)
    for r in range(sc.n):
        rec = _rank_record(group_results, sc, r)
        assert not rec["ok"], f"bad input accepted: rank {r} took H={sc.h} over N={sc.n} ranks"
        assert rec["seconds"] < 10, f"rank {r} took {rec['seconds']:.1f} s to raise"
        if rec["error"] != "ValueError":
            raise Convention(f"rank {r}: refused with {rec['error']}, not a ValueError: "
                             f"{rec['message'][:300]}")
        if not names_the_problem(rec["message"], NOT_DIVISIBLE_WORDS):
            raise Convention(f"rank {r}: the ValueError does not name the problem: "
                             f"{rec['message']!r}")
