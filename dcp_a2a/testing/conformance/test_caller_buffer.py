"""Conformance: the merged result written into a buffer the caller owns, ``into=`` on
``unpack_combine`` and ``lse_reduce`` (vLLM's ``out=``: the attention layer's output, so no
copy follows the combine).

The contract: ``into`` is ``[B, H/N, D]`` (``[B, H/N, V]`` with the up-projection) of the
output dtype on the call's device, any strides; the call writes the result there, every
element of it and nothing outside it, and returns ``into`` (``(into, lse)`` with
``return_lse``): the same values it returns without ``into``. A buffer of another shape, dtype
or device, or one that overlaps what the call reads (the received wire, the partials, the LSE),
is refused with a ValueError/TypeError before any kernel or collective.
"""

from __future__ import annotations

import pytest
import torch

from dcp_a2a import Group
from dcp_a2a.testing.conformance._refusals import TripwireGroup, refused
from dcp_a2a.testing.data import DTYPES, bits_view, heads_of, partials
from dcp_a2a.testing.exchange import exchange, pack_all
from dcp_a2a.testing.replaygroup import run_ranks

pytestmark = [pytest.mark.kernel, pytest.mark.conformance, pytest.mark.clause("caller buffer")]

INTO_WORDS = r"\binto\b|\bout\b|shape|dtype|device|overlap|alias|stride"


def requires_into(impl, function: str) -> None:
    """Skip (not applicable) where ``function`` takes no ``into=``: the surface is exposed by
    either function, each test here judges the one it calls."""
    import inspect

    from dcp_a2a.testing.surfaces import NOT_APPLICABLE

    try:
        takes = "into" in inspect.signature(getattr(impl.obj, function)).parameters
    except (TypeError, ValueError, AttributeError):
        takes = False
    if not takes:
        pytest.skip(f"{NOT_APPLICABLE}caller buffer on {function} ({impl.spec}'s {function} "
                    "takes no into=)")


def _framed(shape, dtype, device, layout: str):
    """(into, frame): ``into`` of ``shape`` inside a larger NaN-poisoned ``frame``: "contiguous"
    (the middle of a flat buffer), "padded" (rows of a wider last dim: strided), "transposed"
    (a permuted view). Bytes of the frame outside ``into`` must stay NaN."""
    b, hh, d = shape
    if layout == "contiguous":
        frame = torch.full((b * hh * d + 64,), float("nan"), dtype=dtype, device=device)
        return frame[32:32 + b * hh * d].view(b, hh, d), frame
    if layout == "padded":
        frame = torch.full((b, hh, d + 3), float("nan"), dtype=dtype, device=device)
        return frame[..., 1:d + 1], frame
    frame = torch.full((hh, d, b), float("nan"), dtype=dtype, device=device)
    return frame.permute(2, 0, 1), frame


def _outside_untouched(into, frame):
    """Every frame element that is not into's still NaN."""
    mask = torch.ones(frame.numel(), dtype=torch.bool, device=frame.device)
    idx = torch.arange(frame.numel(), device=frame.device).view(frame.shape)
    inside = idx.as_strided(into.shape, into.stride(), into.storage_offset()
                            - frame.storage_offset())
    mask[inside.reshape(-1)] = False
    outside = frame.reshape(-1)[mask]
    assert bool(torch.isnan(outside).all()), \
        f"{int((~torch.isnan(outside)).sum())} elements outside into were written"


def _same_bits(a, b, what):
    assert torch.equal(bits_view(a.contiguous()), bits_view(b.contiguous())), \
        f"{what}: into holds other bits than the result the call returns without into"


@pytest.mark.parametrize("layout", ["contiguous", "padded", "transposed"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_unpack_combine_writes_into_the_callers_buffer(impl, device, merge_check, dtype, layout):
    requires_into(impl, "unpack_combine")
    n, b, h, d = 3, 4, 6, impl.envelope.fit_head_dim(10)
    outs, lses = partials(n, b, h, d, dtype, seed=3, device=device)
    p = impl.lse_pack_dim(dtype)
    recvs = exchange(pack_all(impl, outs, lses))
    for r in (0, n - 1):
        want, want_lse = impl.unpack_combine(recvs[r], d, p, True, True)
        into, frame = _framed((b, h // n, d), dtype, device, layout)
        got, got_lse = impl.unpack_combine(recvs[r], d, p, True, True, into=into)
        assert got is into, "unpack_combine(into=...) must return into itself"
        _outside_untouched(into, frame)
        _same_bits(into, want, f"rank {r}, {layout}")
        _same_bits(got_lse, want_lse, f"rank {r}'s LSE, {layout}")
        merge_check(into.cpu(), got_lse.cpu(), outs.cpu(), lses.cpu(), heads=heads_of(r, n, h))
        alone = impl.unpack_combine(recvs[r], d, p, False, True, into=torch.empty_like(into))
        assert isinstance(alone, torch.Tensor), "without return_lse: into alone, not a tuple"


@pytest.mark.surface("caller buffer", "exchange")
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_lse_reduce_writes_into_the_callers_buffer(impl, device, merge_check, dtype, n):
    """Every rank's lse_reduce(into=...) (a group of one, and 3 ranks of different partials):
    its heads' merge in the caller's buffer, returned, nothing around it written; the same bits
    as without into."""
    requires_into(impl, "lse_reduce")
    b, h, d = 3, 2 * n, impl.envelope.fit_head_dim(12)
    if n == 1:
        impl.envelope.require(world_size=1)
    outs, lses = partials(n, b, h, d, dtype, seed=n, device=device)
    frames = {}

    def call(group, with_into):
        r = group.rank_in_group
        if not with_into:
            return impl.lse_reduce(outs[r], lses[r], group, return_lse=True)
        into, frames[r] = _framed((b, h // n, d), dtype, device, "padded")
        res = impl.lse_reduce(outs[r], lses[r], group, return_lse=True, into=into)
        assert res[0] is into, f"rank {r}: lse_reduce(into=...) must return into itself"
        return res

    if n == 1:
        want = [call(Group(1, 0, None), False)]
        got = [call(Group(1, 0, None), True)]
    else:
        want, _ = run_ranks(n, lambda g: call(g, False))
        got, _ = run_ranks(n, lambda g: call(g, True))
    for r, ((o, lse), (wo, wl)) in enumerate(zip(got, want)):
        _outside_untouched(o, frames[r])
        _same_bits(o, wo, f"rank {r}")
        merge_check(o.cpu(), lse.cpu(), outs.cpu(), lses.cpu(), heads=heads_of(r, n, h))


@pytest.mark.surface("caller buffer", "up-projection")
def test_lse_reduce_up_projected_into_the_callers_buffer(impl, device):
    """With w_uv the caller's buffer is [B, H/N, V]: the projected merge, bit for bit what the
    call returns without into."""
    requires_into(impl, "lse_reduce")
    env = impl.envelope
    n, b, h, lat, v = 2, 3, 4, env.fit_head_dim(16), env.fit_head_dim(12)
    outs, lses = partials(n, b, h, lat, torch.bfloat16, seed=9, device=device)
    g = torch.Generator().manual_seed(9)
    w = (torch.randn(h, lat, v, generator=g) / 4).to(torch.bfloat16).to(device)
    want, _ = run_ranks(n, lambda gr: impl.lse_reduce(outs[gr.rank_in_group],
                                                      lses[gr.rank_in_group], gr, w_uv=w))
    frames = {}

    def call(gr):
        into, frames[gr.rank_in_group] = _framed((b, h // n, v), torch.bfloat16, device,
                                                  "transposed")
        res = impl.lse_reduce(outs[gr.rank_in_group], lses[gr.rank_in_group], gr, w_uv=w,
                              into=into)
        assert res is into, "lse_reduce(w_uv=..., into=...) must return into itself"
        return res

    got, _ = run_ranks(n, call)
    for r, (o, wo) in enumerate(zip(got, want)):
        _outside_untouched(o, frames[r])
        _same_bits(o, wo, f"rank {r}")


@pytest.mark.clause("bad input")
@pytest.mark.surface("caller buffer")
@pytest.mark.parametrize("case", ["rows", "heads", "dim", "dtype", "rank4", "list",
                                  "overlaps_recv", "broadcast"])
def test_unpack_combine_refuses_a_bad_into(impl, device, case):
    """A buffer of another shape or dtype, not a tensor, overlapping the received wire (the
    combine would overwrite rows it has yet to read), or with several elements at one address:
    a ValueError/TypeError before the kernel (the recv must come back unchanged)."""
    requires_into(impl, "unpack_combine")
    n, b, h, d = 2, 3, 4, impl.envelope.fit_head_dim(8)
    outs, lses = partials(n, b, h, d, torch.float16, seed=1, device=device)
    p = impl.lse_pack_dim(torch.float16)
    recv = exchange(pack_all(impl, outs, lses))[0]
    good = torch.empty(b, h // n, d, dtype=torch.float16, device=device)
    into = {"rows": good[:2], "heads": torch.empty(b, h, d, dtype=torch.float16, device=device),
            "dim": good[..., :d - 1], "dtype": good.float(), "rank4": good[None],
            "list": good.tolist(),
            # rows of recv's own memory, as a [B, H/N, D] view of the same dtype
            "overlaps_recv": recv.view(-1)[:b * (h // n) * d].view(b, h // n, d),
            "broadcast": good[:1].expand(b, -1, -1)}[case]
    before = recv.clone()
    with refused(INTO_WORDS, dtype_problem=True):
        impl.unpack_combine(recv, d, p, False, True, into=into)
    assert torch.equal(bits_view(recv), bits_view(before)), "recv changed by a refused call"


@pytest.mark.clause("bad input")
@pytest.mark.surface("caller buffer", "exchange")
@pytest.mark.parametrize("case", ["shape", "dtype", "overlaps_out", "overlaps_lse"])
def test_lse_reduce_refuses_a_bad_into_before_any_collective(impl, device, case):
    """The same refusals from lse_reduce, before any collective (a process group that fails the
    test if used); a buffer in the partial's or the LSE's memory among them."""
    requires_into(impl, "lse_reduce")
    n, b, h, d = 2, 3, 4, 8
    outs, lses = partials(n, b, h, d, torch.float32, seed=2, device=device)
    out, lse = outs[0].clone(), lses[0].clone()
    if case == "shape":
        into = torch.empty(b, h, d, device=device)
    elif case == "dtype":
        into = torch.empty(b, h // n, d, dtype=torch.float16, device=device)
    elif case == "overlaps_out":
        into = out[:, : h // n]
    else:  # the LSE's last rows and what follows them in one allocation, as [B, H/N, D]
        storage = torch.empty(b * h + b * (h // n) * d, device=device)
        lse = storage[: b * h].view(b, h)
        lse.copy_(lses[0])
        into = storage[b * h - 4: b * h - 4 + b * (h // n) * d].view(b, h // n, d)
    with refused(INTO_WORDS, dtype_problem=True):
        impl.lse_reduce(out, lse, Group(n, 0, TripwireGroup(n)), into=into)
