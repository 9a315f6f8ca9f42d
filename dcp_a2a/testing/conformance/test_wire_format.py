"""Conformance: pack_send writes exactly the wire format of the spec, bit for bit.

The expected buffer is assembled from the spec by _spec.py, never by an
implementation, so a pack and an unpack that agree with each other but not with the wire
format (the peer of another engine would misread them) fail here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dcp_a2a.testing.data import (DTYPES, assert_unmodified, guarded, large_batch, partials,
                                  poison_like, snapshot)
from dcp_a2a.testing.conformance._refusals import STRIDE_WORDS, refused_instead
from dcp_a2a.testing.conformance._spec import expected_send, pack_dim, raw_bits
from dcp_a2a.testing.verdicts import GARBAGE

pytestmark = [pytest.mark.conformance, pytest.mark.clause("wire format")]


def _pack(impl, out, lse, n, **mask):
    """The implementation's send buffer (poisoned first); the caller's out and lse (and
    seq_lens/query_start_loc) must come back unchanged, bit for bit (the engine owns them)."""
    b, h, d = out.shape
    p = impl.lse_pack_dim(out.dtype)
    send = poison_like(torch.empty((n, b, h // n, d + p), dtype=out.dtype, device=out.device))
    before = snapshot(out=out, lse=lse, **mask)
    impl.pack_send(out, lse, send, n, h // n, d, p, **mask)
    assert_unmodified(before, "pack_send")
    return send


def _assert_wire_equal(send, expected, masked_rows=None):
    """Every wire word as the spec says; for ``masked_rows`` (bool [B]) only the LSE lanes: a
    masked row goes out with LSE -inf, which every receiver weighs 0, so its output lanes are
    not specified (the partial, zeros or anything else)."""
    got = raw_bits(send)
    if masked_rows is not None:
        rows = np.asarray(masked_rows, dtype=bool)
        d = send.shape[-1] - pack_dim(send.dtype)
        expected = expected.copy()
        expected[:, rows, :, :d] = got[:, rows, :, :d]
    if not np.array_equal(got, expected):
        bad = np.argwhere(got != expected)
        first = tuple(int(i) for i in bad[0])
        d_plus_p = send.shape[-1]
        lane = "LSE lane" if first[-1] >= d_plus_p - pack_dim(send.dtype) else "output lane"
        raise AssertionError(
            f"{len(bad)} of {got.size} wire words differ from the spec; first at "
            f"[peer, row, head, lane] = {first} ({lane}): got {got[first]:#x}, "
            f"expected {expected[first]:#x}")


@pytest.mark.parametrize("n,d", [(2, 80), (4, 24)], ids=["N2-D80", "N4-D24"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_send_buffer_matches_spec(impl, device, dtype, n, d):
    """Peer-major slices of contiguous head blocks, the output bit for bit, the float32 LSE in
    the trailing lanes (low half first) — and the inputs left untouched."""
    d = impl.envelope.fit_head_dim(d)
    outs, lses = partials(1, 3, 2 * n, d, dtype, seed=31 * n + d, device=device)
    send = _pack(impl, outs[0], lses[0], n)  # which also checks the inputs' bits
    _assert_wire_equal(send, expected_send(outs[0], lses[0], n))


def test_send_buffer_of_a_large_batch_matches_spec(impl, device):
    """Every row of a batch past any row cap (``testing.data.large_batch``) goes out as the
    spec says: the send buffer is poisoned first, so rows past a cap come back as NaN words."""
    outs, lses = partials(1, large_batch(device), 2, 8, torch.bfloat16, seed=17, device=device)
    send = _pack(impl, outs[0], lses[0], 2)
    _assert_wire_equal(send, expected_send(outs[0], lses[0], 2))


@pytest.mark.parametrize("lse_dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_16bit_lse_is_widened_not_reinterpreted(impl, device, dtype, lse_dtype):
    """An LSE handed over in bf16/fp16 is converted to float32 by value (exact), never by
    reinterpreting its 16 bits as part of a float32."""
    impl.envelope.require(lse_dtype=lse_dtype)
    n, b, h, d = 2, 3, 4, impl.envelope.fit_head_dim(12)
    outs, lses = partials(1, b, h, d, dtype, seed=5, device=device)
    lse = lses[0].to(lse_dtype)
    send = _pack(impl, outs[0], lse, n)
    _assert_wire_equal(send, expected_send(outs[0], lse, n))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_lse_special_values_carried_exactly(impl, device, dtype):
    """Every float32 LSE bit pattern that the merge gives meaning to goes over the wire as is:
    -inf, +inf, -0.0, the largest finite, subnormals, values the output dtype cannot hold."""
    n, b, h, d = 2, 2, 8, 4
    specials = torch.tensor([-math.inf, math.inf, -0.0, 3.4028234663852886e38,
                             1e-45, -2.5e-40, 12345.678, -70000.5], dtype=torch.float32)
    outs, _ = partials(1, b, h, d, dtype, seed=1, device=device)
    lse = torch.stack([specials, specials.flip(0)]).to(device)
    send = _pack(impl, outs[0], lse, n)
    _assert_wire_equal(send, expected_send(outs[0], lse, n))


@pytest.mark.clause("masking")  # overrides the module's clause
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_masked_rows_go_out_as_minus_inf(impl, device, dtype):
    """seq_lens/query_start_loc: rows of requests with no local KV, and padding rows at or
    beyond query_start_loc[-1], carry LSE -inf (their output lanes are not specified); every
    lane of the other rows is unchanged."""
    n, b, h, d = 2, 7, 4, impl.envelope.fit_head_dim(10)
    outs, lses = partials(1, b, h, d, dtype, seed=9, device=device)
    qsl = torch.tensor([0, 2, 3, 5], dtype=torch.int32, device=device)  # rows 5, 6: padding
    seq_lens = torch.tensor([7, 0, 3], dtype=torch.int32, device=device)  # request 1: row 2
    send = _pack(impl, outs[0], lses[0], n, seq_lens=seq_lens, query_start_loc=qsl)
    empty = [False, False, True, False, False, True, True]
    _assert_wire_equal(send, expected_send(outs[0], lses[0], n, empty_rows=empty),
                       masked_rows=empty)


def _rows_by_request(query_lens, seq_lens, padding):
    """(query_start_loc, masked rows) of a batch, the mask read off the spec's words row by
    row: row b belongs to the request i with qsl[i] <= b < qsl[i+1]; it is masked when that
    request's seq_len is 0 or when no request holds it (padding)."""
    qsl = [0]
    for q in query_lens:
        qsl.append(qsl[-1] + q)
    masked = []
    for b in range(qsl[-1] + padding):
        owner = [i for i in range(len(query_lens)) if qsl[i] <= b < qsl[i + 1]]
        masked.append(not owner or seq_lens[owner[0]] == 0)
    return qsl, masked


# (query rows per request, local seq_len per request, padding rows). A row of a request with
# ONE local KV token is not empty; a batch of one request, or of none, is a batch; many
# requests (some with no rows) make a row's request a search of several steps.
BATCHES = {
    "one_request": ([3], [1], 2),
    "no_request": ([], [], 3),
    "single_tokens": ([1, 1, 1, 1, 1], [1, 0, 2, 1, 0], 1),
    "many_requests": ([2, 0, 1, 3, 1, 0, 2, 1, 1, 4, 1, 2, 1, 1, 3, 1, 1],
                      [9, 4, 0, 1, 3, 0, 7, 0, 1, 2, 0, 5, 1, 0, 6, 2, 1], 3),
}


@pytest.mark.clause("masking")  # overrides the module's clause
@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_masking_follows_every_row_to_its_request(impl, device, dtype, batch):
    """Rows map to requests through query_start_loc for any batch layout: one request, none,
    one row each, and 17 requests of 0-4 rows (a request search that stops a step early, a
    mask of seq_len <= 1, or a batch of one treated as padding all mark the wrong rows)."""
    query_lens, lens, padding = BATCHES[batch]
    qsl, masked = _rows_by_request(query_lens, lens, padding)
    n, h, d = 2, 2, impl.envelope.fit_head_dim(3)
    outs, lses = partials(1, len(masked), h, d, dtype, seed=len(masked), device=device)
    mask = dict(seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
                query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device))
    send = _pack(impl, outs[0], lses[0], n, **mask)
    _assert_wire_equal(send, expected_send(outs[0], lses[0], n, empty_rows=masked),
                       masked_rows=masked)


@pytest.mark.clause("masking")  # overrides the module's clause
@pytest.mark.parametrize("batch", ["single_tokens", "many_requests"])
def test_strided_index_tensors(impl, device, batch):
    """seq_lens and query_start_loc as views with strides: a rank's column of a [requests, N]
    table of local KV lengths (how a DCP engine holds them) and every other entry of a longer
    tensor. They are read through their strides, or refused with an error naming them -- never
    read as if contiguous (the neighbouring ranks' lengths would then mask the rows: an
    evaluation shipped with that, sharding every position of a prompt)."""
    query_lens, lens, padding = BATCHES[batch]
    qsl, masked = _rows_by_request(query_lens, lens, padding)
    n, h, d = 2, 2, impl.envelope.fit_head_dim(3)
    outs, lses = partials(1, len(masked), h, d, torch.bfloat16, seed=len(masked) + 1,
                          device=device)
    table = torch.tensor([[7, s, 0] for s in lens], dtype=torch.int32, device=device)
    spread = torch.tensor([v for q in qsl for v in (q, -1)], dtype=torch.int32, device=device)
    mask = dict(seq_lens=table[:, 1], query_start_loc=spread[::2])
    assert not mask["seq_lens"].is_contiguous() and not mask["query_start_loc"].is_contiguous()
    sent = []
    if refused_instead(lambda: sent.append(_pack(impl, outs[0], lses[0], n, **mask)),
                       r"seq_lens|query_start_loc|contiguous|strided|strides?\b"):
        return
    sent.append(_pack(impl, outs[0], lses[0], n, **mask))  # a repeated call (kept launches)
    for send in sent:
        _assert_wire_equal(send, expected_send(outs[0], lses[0], n, empty_rows=masked),
                           masked_rows=masked)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_non_contiguous_inputs(impl, device, dtype):
    """Strided out/lse (a head slice of a larger tensor, a transposed LSE) are read through
    their strides, or refused with an error naming them (never read as if contiguous)."""
    n, b, h, d = 2, 3, 4, 16
    outs, lses = partials(1, b, 2 * h, d + 5, dtype, seed=13, device=device)
    out = outs[0][:, ::2, 3:3 + d]
    lse = lses[0].t().contiguous().t()[:, 1::2]
    assert not out.is_contiguous() and not lse.is_contiguous()
    sent = []
    if refused_instead(lambda: sent.append(_pack(impl, out, lse, n)), STRIDE_WORDS):
        return
    _assert_wire_equal(sent[0], expected_send(out, lse, n))


@pytest.mark.surface("wire", "masking")
@pytest.mark.parametrize("layout", ["transposed", "broadcast"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_lse_layouts_on_the_wire(impl, device, dtype, layout):
    """An LSE that is not a contiguous [B, H]: the view of an [H, B] tensor (attention kernels
    that write head-major), or one value a row broadcast over the heads (stride 0, the storage
    beyond it garbage). Its values go out as the spec says, or it is refused naming it."""
    n, b, h, d = 2, 5, 4, impl.envelope.fit_head_dim(6)
    outs, lses = partials(1, b, h, d, dtype, seed=29, device=device)
    if layout == "transposed":
        lse = lses[0].t().contiguous().t()
    else:
        store = torch.full((b * h + 1,), 1e4, dtype=torch.float32, device=device)
        store[:b] = lses[0][:, 0]
        lse = store[:b].view(b, 1).expand(b, h)
    sent = []
    if refused_instead(lambda: sent.append(_pack(impl, outs[0], lse, n)), STRIDE_WORDS):
        return
    _assert_wire_equal(sent[0], expected_send(outs[0], lse.contiguous(), n))


@pytest.mark.parametrize("n,d", [(2, 80), (4, 24)], ids=["N2-D80", "N4-D24"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_pack_writes_nothing_outside_its_send_buffer(impl, device, dtype, n, d):
    """Engines carve the send buffer from a workspace, next to live data (the attention output
    itself, in a shipped bug): the pack may write its [N, B, H/N, D+P] words and nothing else.
    The buffer is carved from the middle of a workspace of random bytes, and every byte before
    and after it must come back unchanged: a kernel that stores a power-of-two block of lanes
    (D+P = 82 or 26 rounded up), a row or a peer slice too many, or anything at a negative
    offset, corrupts them. Masked rows included (the mask path stores too)."""
    b, h = 5, 2 * n
    d = impl.envelope.fit_head_dim(d)
    outs, lses = partials(1, b, h, d, dtype, seed=7 * n + d, device=device)
    qsl = torch.tensor([0, 2, 3, 4], dtype=torch.int32, device=device)  # row 4: padding
    seq_lens = torch.tensor([6, 0, 2], dtype=torch.int32, device=device)  # request 1: row 2
    p = impl.lse_pack_dim(dtype)
    send, outside = guarded((n, b, h // n, d + p), dtype, device, seed=5)
    mask = {"seq_lens": seq_lens, "query_start_loc": qsl}
    snap = snapshot(out=outs[0], lse=lses[0], **mask)
    impl.pack_send(outs[0], lses[0], send, n, h // n, d, p, **mask)
    assert_unmodified(snap, "pack_send")
    wrote = outside()
    assert wrote is None, f"pack_send wrote {wrote} (send)"
    empty = [False, False, True, False, True]
    _assert_wire_equal(send, expected_send(outs[0], lses[0], n, empty_rows=empty),
                       masked_rows=empty)


# Where the send buffer lies relative to the tensors it packs, in bytes of one workspace (every
# offset a multiple of 16: the layouts differ in overlap only, not in alignment).
OVERLAPS = {
    "send_at_out": "send and out start together",
    "send_before_out": "out starts 48 bytes into send",
    "send_inside_out": "send starts halfway through out (carved from its tail)",
    "send_over_lse": "lse lies inside send",
}


def _carve(ws, start, shape, dtype):
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    return ws[start:start + nbytes].view(dtype).view(shape)


@pytest.mark.clause("bad input")  # overrides the module's clause
@pytest.mark.surface("wire")
@pytest.mark.parametrize("layout", list(OVERLAPS))
@pytest.mark.parametrize("b", [4, 8192], ids=["one_wave", "many_waves"])
def test_staging_buffer_overlapping_its_inputs(impl, device, b, layout):
    """A send buffer carved from the same memory as the attention output or the LSE it packs
    (a shipped bug: the pack overwrote its own input). Every way the spans can overlap (see
    OVERLAPS): the implementation must refuse it with a ValueError before writing, or else
    produce exactly the right bytes; silently corrupted bytes fail.

    ``many_waves``: on a GPU the few programs of a small launch run at once, each loading its
    rows before any stores, so an unchecked in-place pack can come out right by timing (it
    did: the self-check's mutant survived there). Thousands of tokens are dispatched in waves,
    and the programs of the first write peer 1's slice over the rows, half the buffer on,
    that a later wave reads. (Refusing costs nothing at any size. The Triton interpreter runs
    programs one after another, here of 256 tokens each: there too many_waves (32 programs)
    shows the bug and one_wave (one program) does not.)"""
    n, h, d = 2, 4, 8
    dtype = torch.float16
    outs, lses = partials(1, b, h, d, dtype, seed=21, device=device)
    p = pack_dim(dtype)
    send_shape, out_bytes = (n, b, h // n, d + p), b * h * d * 2
    send_bytes = math.prod(send_shape) * 2
    at = {"send_at_out": (0, 0, None), "send_before_out": (0, 48, None),
          "send_inside_out": (out_bytes // 32 * 16, 0, None),
          "send_over_lse": (0, send_bytes + 64, 64)}[layout]  # (send, out, lse) byte offsets
    ws = torch.zeros(send_bytes + out_bytes + b * h * 4 + 256, dtype=torch.uint8, device=device)
    send = _carve(ws, at[0], send_shape, dtype)
    out = _carve(ws, at[1], (b, h, d), dtype)
    out.copy_(outs[0])
    lse = lses[0].clone() if at[2] is None else _carve(ws, at[2], (b, h), torch.float32)
    lse.copy_(lses[0])
    before = snapshot(out=out, lse=lse)
    if refused_instead(lambda: impl.pack_send(out, lse, send, n, h // n, d, p),
                       r"overlap|alias|send|\bout\b|\blse\b|memory|in.place"):
        assert_unmodified(before, "pack_send, before it raised,")
        return
    try:
        _assert_wire_equal(send, expected_send(before["out"][1], before["lse"][1], n))
    except AssertionError as e:
        raise AssertionError(f"{GARBAGE} (a send buffer over its own inputs, {OVERLAPS[layout]}),"
                             f" and packed wrong: {e}") from None
