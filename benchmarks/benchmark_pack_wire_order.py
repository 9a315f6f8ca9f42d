"""Pack in the wire's own order, at the grid's fp32
D=512 points from 16k to 131k rows (B <= 1024), three ways:

* ``pm{heads}x{warps}[_lane]``: the row kernel on a peer-major grid (peer, token, head block),
  so that programs dispatched one after another write one run of consecutive wire bytes (the
  table's head-major grid has them read consecutive bytes and write N runs, one a peer), at 1,
  2 or 4 heads a program x 1, 2 or 4 warps, vector or lane loads;
* ``flat{words}x{warps}[_v4]``: a program writes ``words`` consecutive words of the wire
  (aligned), each gathered from ``out`` or the LSE where it belongs. A warp's store is then 32
  consecutive words on a 128-byte boundary (four whole 32-byte sectors, as a copy's; a wire row
  of 513 words puts the row kernel's on no such boundary: five sectors, two in part), and its
  load 32 consecutive words of ``out`` shifted by a word a head, which L1 serves. ``_v4``: the
  compiler's own layout, 16-byte stores and four one-word loads a thread;
* ``gather{G}x{warps}``: a program takes G heads of one peer and
  token (G % 4 == 0, so their G (D + 1) wire words start on a 16-byte boundary): it loads their
  G D words of ``out`` as 16-byte vectors, and ``tl.gather`` (through shared memory) moves each
  into the lane of its wire word, shifted by a word a head, so the stores are 16-byte vectors
  too; the chunk's last G words (past the power-of-two tile) are loaded and stored alone.

Next to them the table, the straightforward kernel, ``copy_`` of the same bytes and the best plain
Triton copy of ``benchmark_copy_bandwidth.py`` (1024 words a program, 4 warps). Interleaved rounds; every pack's
wire bytes are checked against the straightforward kernel's, and the copies' against their
source, first.

    python benchmarks/benchmark_pack_wire_order.py OUT.json [--rounds 3] [--rows MIN MAX]
        [--families pm,flat,gather]   (on a GPU)
    python benchmarks/benchmark_pack_wire_order.py --check   (the kernels' bytes on small
        shapes, in Triton's interpreter on a CPU: seconds)
"""
import argparse
import statistics
import torch
import triton
import triton.language as tl
from dcp_a2a.kernels.pack import write_rows
from dcp_a2a.testing import straightforward as sf

import _run


@triton.jit
def _pack_peer_major_kernel(out_ptr, lse_ptr, send_ptr, B, HPR: tl.constexpr, D,
                            s_ob, s_oh, s_lb, s_lh, P: tl.constexpr, BLOCK_H: tl.constexpr,
                            BLOCK_D: tl.constexpr, LANE_LOADS: tl.constexpr):
    # program (head block, token, peer): dispatched first axis first, so in wire order
    j = tl.program_id(0).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)
    b = tl.program_id(1).to(tl.int64)
    n = tl.program_id(2).to(tl.int64)
    row = ((n * B + b) * HPR + j) * (D + P)
    write_rows(out_ptr, lse_ptr, send_ptr + row, out_ptr, out_ptr, b, n * HPR + j, j < HPR,
               D, 0, 0, s_ob, s_oh, 1, s_lb, s_lh, P, False, BLOCK_D, False, BLOCK_D >= D,
               LANE_LOADS)


def pack_peer_major(out, lse, send, heads, warps, lane_loads):
    """fp32 ``out[B, H, D]`` (unit lane stride), ``lse[B, H]`` -> ``send[N, B, H/N, D+1]``."""
    B, H, D = out.shape
    N, _, hpr, lanes = send.shape
    src, dst = out.view(torch.int32), send.view(torch.int32)
    grid = (triton.cdiv(hpr, heads), B, N)
    return lambda: _pack_peer_major_kernel[grid](
        src, lse, dst, B, hpr, D, src.stride(0), src.stride(1), lse.stride(0), lse.stride(1),
        P=lanes - D, BLOCK_H=heads, BLOCK_D=triton.next_power_of_2(D), LANE_LOADS=lane_loads,
        num_warps=warps)


@triton.jit
def _pack_flat_kernel(out_ptr, lse_ptr, send_ptr, B, total, s_ob, s_oh, s_lb, s_lh,
                      HPR: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
                      V4: tl.constexpr):
    w0 = tl.program_id(0) * BLOCK
    w = w0 + tl.arange(0, BLOCK)
    if not V4:
        # hide the run from the compiler: one word a thread, a warp's 32 on consecutive lanes
        w = tl.max_contiguous(tl.multiple_of(w, 1), 1)
    ok = w < total
    row = w // (D + 1)                 # wire row (peer, token, head of the peer)
    c = w - row * (D + 1)              # lane in it: D data lanes, then the LSE
    nb = row // HPR
    j = row - nb * HPR
    # token and peer of each word from the block's first (a block spans at most one token
    # more: BLOCK <= HPR * (D + 1)), so no run-time division by B a word
    nb0 = (w0 // (D + 1)) // HPR
    n0 = nb0 // B
    b = nb0 - n0 * B + (nb - nb0)
    wrap = b >= B
    b = tl.where(wrap, b - B, b)
    h = (n0 + wrap.to(tl.int32)) * HPR + j
    data = c < D
    x = tl.load(out_ptr + b * s_ob + h * s_oh + c, mask=ok & data)
    lse = tl.load(lse_ptr + b * s_lb + h * s_lh, mask=ok & (c == D))
    tl.store(send_ptr + w, tl.where(data, x, lse.to(tl.int32, bitcast=True)), mask=ok)


def pack_flat(out, lse, send, words, warps, v4):
    """As ``pack_peer_major``; every offset below 2^31 words."""
    B, H, D = out.shape
    N, _, hpr, lanes = send.shape
    if lanes != D + 1 or words > hpr * lanes or send.numel() >= 2 ** 31:
        raise ValueError("fp32 only, a block within a token's slab, int32 offsets")
    src, dst = out.view(torch.int32), send.view(torch.int32)
    total = send.numel()
    return lambda: _pack_flat_kernel[(triton.cdiv(total, words),)](
        src, lse, dst, B, total, src.stride(0), src.stride(1), lse.stride(0), lse.stride(1),
        HPR=hpr, D=D, BLOCK=words, V4=v4, num_warps=warps)


@triton.jit
def _pack_gather_kernel(out_ptr, lse_ptr, send_ptr, B, s_ob, s_oh, s_lb, s_lh,
                        HPR4: tl.constexpr, D: tl.constexpr, G4: tl.constexpr):
    # program (head chunk, token, peer), in wire order; G = 4 * G4 heads, HPR = 4 * HPR4
    G: tl.constexpr = 4 * G4
    IN: tl.constexpr = G * D                  # the chunk's data words (a power of two)
    g4 = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    n = tl.program_id(2).to(tl.int64)
    h0 = n * (4 * HPR4) + g4 * G
    # written as 4 * (...): the chunk starts on a 16-byte boundary, which the compiler then sees
    chunk = send_ptr + 4 * (((n * B + b) * HPR4 + g4 * G4) * (D + 1))
    src = out_ptr + b * s_ob + h0 * s_oh
    lse_row = lse_ptr + b * s_lb + h0 * s_lh
    i = tl.arange(0, IN)
    x = tl.load(src + (i // D) * s_oh + i % D)
    # wire word w of the chunk: head k = w // (D + 1), lane c; data lane c is stream word w - k
    k = i // (D + 1)
    c = i - k * (D + 1)
    y = tl.gather(x, tl.minimum(i - k, IN - 1), 0)
    lse = tl.load(lse_row + k * s_lh, mask=c == D)
    tl.store(chunk + i, tl.where(c == D, lse.to(tl.int32, bitcast=True), y))
    # the last G words: head G - 1's lanes D + 1 - G .. D
    t = tl.arange(0, G)
    ct = D + 1 - G + t
    xt = tl.load(src + (G - 1) * s_oh + ct, mask=ct < D)
    lt = tl.load(lse_row + (G - 1) * s_lh + t * 0, mask=ct == D)
    tl.store(chunk + IN + t, tl.where(ct == D, lt.to(tl.int32, bitcast=True), xt))


def pack_gather(out, lse, send, heads, warps):
    """As ``pack_peer_major``, for 4 | heads | H/N and a power-of-two D."""
    B, H, D = out.shape
    N, _, hpr, lanes = send.shape
    if lanes != D + 1 or heads % 4 or hpr % heads or D & (D - 1):
        raise ValueError("fp32, 4 | heads | H/N, a power-of-two D")
    src, dst = out.view(torch.int32), send.view(torch.int32)
    return lambda: _pack_gather_kernel[(hpr // heads, B, N)](
        src, lse, dst, B, src.stride(0), src.stride(1), lse.stride(0), lse.stride(1),
        HPR4=hpr // 4, D=D, G4=heads // 4, num_warps=warps)


FAMILIES = ("pm", "flat", "gather")


def variants(out, lse, send, families=FAMILIES):
    v = {}
    if "pm" in families:
        v.update({f"pm{heads}x{warps}" + "_lane" * lane: pack_peer_major(out, lse, send, heads,
                                                                         warps, lane)
                  for heads in (1, 2, 4) for warps in (1, 2, 4) for lane in (False, True)})
    hpr, d = send.shape[2], out.shape[2]
    if "flat" in families:
        v.update({f"flat{words}x{warps}" + "_v4" * v4: pack_flat(out, lse, send, words, warps,
                                                                 v4)
                  for words in (512, 1024, 2048) for warps in (1, 2, 4, 8)
                  for v4 in (False, True) if words <= hpr * send.shape[3] and words >= 32 * warps})
    if "gather" in families and hpr % 4 == 0 and d & (d - 1) == 0:
        v.update({f"gather{heads}x{warps}": pack_gather(out, lse, send, heads, warps)
                  for heads in (4, 8) for warps in (2, 4, 8, 16) if hpr % heads == 0})
    return v


def self_check():
    """Every variant's bytes against the straightforward pack's, on shapes the
    interpreter runs in seconds (fp32; D a power of two and not)."""
    from _rounds import check_bytes

    for b, h, n, d in ((3, 32, 2, 64), (2, 64, 4, 80), (1, 64, 2, 32), (5, 16, 2, 64),
                       (2, 16, 2, 8)):
        out = torch.randn(b, h, d)
        lse = torch.randn(b, h) * 4
        ref = torch.full((n, b, h // n, d + 1), float("nan"))
        sf.pack(out, lse, ref)
        send = torch.empty_like(ref)
        check_bytes(variants(out, lse, send), send, ref.view(torch.uint8), (b, h, n, d))
    print("peer-major, flat and gather packs: bytes equal to the straightforward kernel's")


def _families(value):
    names = tuple(value.split(","))
    if not names or not set(names) <= set(FAMILIES):
        raise argparse.ArgumentTypeError(f"expected some of {','.join(FAMILIES)}, "
                                              f"got {value!r}")
    return names


def parser():
    ap = _run.parser(__doc__, "benchmark_pack_wire_order.py")
    _run.add_out(ap, required=False)
    ap.add_argument("--rounds", type=_run.positive_int, default=3, help="interleaved rounds")
    ap.add_argument("--rows", nargs=2, type=_run.positive_int, default=(16384, 131072),
                    metavar=("MIN", "MAX"), help="grid points of MIN to MAX rows B x H")
    ap.add_argument("--families", type=_families, default=FAMILIES,
                    help="comma-separated: pm, flat, gather")
    ap.add_argument("--check", action="store_true",
                    help="only check every variant's bytes on small shapes (any machine)")
    return ap


def main(argv=None):
    ap = parser()
    args = ap.parse_args(argv)
    if args.check:
        return self_check()
    if args.out is None:
        ap.error("OUT.json is needed without --check")
    with _run.recorded(args.out, "pack_wire_order") as save:
        measure(save, args.rounds, *args.rows, args.families)


def measure(save, rounds, lo, hi, families):
    from benchmark_copy_bandwidth import triton_copy
    from _rounds import check_bytes, copy_pair, fp32_d512_points, packs, point_runs
    from dcp_a2a.testing.bench import copy_bandwidth, timed_rounds

    copy = copy_bandwidth(1 << 30)
    pts = [p for p in fp32_d512_points(lo) if p[0] * p[1] <= hi and p[0] <= 1024]
    rows = []
    for pt, (p, hpr, out, lse, send, nbytes, ref) in point_runs(pts, 0, float("inf")):
        v = {**packs(out, lse, send, hpr), **variants(out, lse, send, families)}
        check_bytes(v, send, ref, pt)
        c_src, c_dst = copy_pair(nbytes)
        copies = {"copy_": lambda: c_dst.copy_(c_src), "tl1024x4": triton_copy(c_src, c_dst, 1024, 4)}
        check_bytes(copies, c_dst, c_src.view(torch.uint8), pt)
        v.update(copies)
        med, times, method = timed_rounds(v, nbytes, rounds)
        best = min((k for k in med if k.startswith(FAMILIES)), key=med.get)
        rows.append(dict(point=list(pt), rows=pt[0] * pt[1], median_us=med, rounds=times,
                         method=method, best_variant=best))
        c = med["copy_"]
        print(f"{pt} rows {pt[0] * pt[1]}: sf {med['sf'] / c:.3f} table {med['table'] / c:.3f} "
              f"{best} {med[best] / c:.3f} tl1024x4 {med['tl1024x4'] / c:.3f} (x copy_ "
              f"{c:.2f} us) | table/sf {med['table'] / med['sf']:.3f} {best}/sf "
              f"{med[best] / med['sf']:.3f} target/copy_ {0.95 * med['sf'] / c:.3f}", flush=True)
        save(dict(device=torch.cuda.get_device_name(), copy_gbps=copy, rounds=rounds,
                  families=list(families), points=rows))
    names = [k for k in rows[0]["median_us"] if k != "sf"]
    q = {k: [r["median_us"][k] / r["median_us"]["sf"] for r in rows] for k in names}
    for k in sorted(names, key=lambda k: statistics.median(q[k])):
        print(f"{k:>12}: x sf median {statistics.median(q[k]):.3f} worst {max(q[k]):.3f}; "
              f"x table median {statistics.median(r['median_us'][k] / r['median_us']['table'] for r in rows):.3f}")


if __name__ == "__main__":
    main()
