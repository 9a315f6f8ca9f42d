"""Conformance: the envelope an implementation declares is where it refuses loudly.

An adapter may declare that its engine takes only some inputs (power-of-two head dims, float32
LSEs, base-2 LSEs, groups of two or more: ``dcp_a2a.testing.surfaces.Envelope``); the suite then
runs every other clause inside that envelope, so a limit never stops a test before what it
checks. The declaration is checked here, once per limit, with one case just outside it:

* the engine refuses it (an exception): the limit is reported once, with what the engine said;
* it returns the right result: the limit is reported as declared but not observed (the envelope
  is narrower than the engine);
* it returns a wrong result: a defect. An envelope is drawn from what an engine refuses loudly,
  never from where it gives wrong numbers.
"""

from __future__ import annotations

import os

import pytest
import torch

from dcp_a2a.collective import Group
from dcp_a2a.testing.compare import check_merge
from dcp_a2a.testing.data import heads_of, partials
from dcp_a2a.testing.exchange import merge_all
from dcp_a2a.testing.impl import ENV_VAR, MissingFunction, load_impl
from dcp_a2a.testing.surfaces import ENVELOPE_LIMIT, NOT_APPLICABLE

pytestmark = [pytest.mark.kernel, pytest.mark.conformance, pytest.mark.clause("envelope")]


def pytest_generate_tests(metafunc):
    if "limit" not in metafunc.fixturenames:
        return
    try:
        limits = load_impl(os.environ[ENV_VAR]).envelope.limits()
    except (KeyError, ValueError):
        limits = []
    metafunc.parametrize("limit,case", limits or [("none", {})],
                         ids=[f"{name}-{next(iter(c.values()), '')}" for name, c in limits]
                         or ["none"])


def _outside_case(impl, case, device):
    """(rank 0's merged heads or the exception the implementation raised, the partials, the
    base) of one merge of the case outside the envelope: through its merge (unpack_combine on
    the wire, or merge), else through lse_reduce on a group whose ranks all hold the same
    partials (a MirrorGroup: one process, the merge known exactly)."""
    from dcp_a2a.testing.mirror import MirrorGroup

    d = case.get("head_dim", impl.envelope.fit_head_dim(8))
    n = case.get("world_size", 2)
    base_e = case.get("base_e", impl.envelope.base_e)
    outs, lses = partials(n, 3, 2 * n, d, torch.bfloat16, seed=5 + d + n, device=device)
    if "lse_dtype" in case:  # values the narrower dtype holds exactly
        lses = lses.to(getattr(torch, case["lse_dtype"])).to(torch.float32)
        passed = lses.to(getattr(torch, case["lse_dtype"]))
    else:
        passed = lses
    if impl.exposes("merge"):
        call = lambda: merge_all(impl, outs, passed, return_lse=True,  # noqa: E731
                                 base_e=base_e, ranks={0})[0]
    elif impl.exposes("exchange"):
        outs, lses = outs[:1].expand(outs.shape).contiguous(), lses[:1].expand(
            lses.shape).contiguous()
        passed = passed[:1].expand(passed.shape).contiguous()
        group = (Group(1, 0, None) if n == 1 else Group(n, 0, MirrorGroup(n, 0)))
        call = lambda: impl.lse_reduce(outs[0], passed[0], group,  # noqa: E731
                                       return_lse=True, is_lse_base_on_e=base_e)
    else:
        pytest.skip(f"{NOT_APPLICABLE}merge, exchange (no surface to run the case through)")
    try:
        got = call()
    except MissingFunction:
        raise
    except Exception as e:  # the refusal the envelope declares
        return e, outs, lses, base_e
    return got, outs, lses, base_e


def test_declared_limits_are_refused_loudly(impl, device, limit, case):
    """One case just outside each declared limit: refused (reported once as the envelope's
    limit), or merged right (declared, not observed); never merged into wrong numbers."""
    if limit == "none":
        pytest.skip(f"{ENVELOPE_LIMIT}none declared (the implementation takes the whole "
                    "contract)")
    env = impl.envelope
    got, outs, lses, base_e = _outside_case(impl, case, device)
    said = env.said.get(limit, "")
    what = env.outside(**case)
    if isinstance(got, Exception):
        pytest.skip(f"{ENVELOPE_LIMIT}{what}: refused ({type(got).__name__}: "
                    f"{str(got).splitlines()[0][:160] if str(got) else ''})"
                    + (f"; the adapter says: {said}" if said else ""))
    out, lse = got
    n, _, h, _ = outs.shape
    rep = check_merge(out.cpu(), lse.cpu(), outs.cpu(), lses.cpu(), is_lse_base_on_e=base_e,
                      heads=heads_of(0, n, h))
    assert rep.ok, (f"declared outside the envelope ({what}), yet the implementation returned "
                    f"a result, and a wrong one:\n{rep.describe()}")
    pytest.skip(f"{ENVELOPE_LIMIT}{what}: declared, but this case merged right (the envelope "
                "is narrower than the engine)")
