"""The fp32 D=512 pack from 16k rows up with 16-byte wire stores, two ways, next to the table,
the straightforward kernel and copies of the same bytes, in interleaved rounds.

Why: there a wire row is 513 words, so it starts on no 16-byte boundary and the row kernel
stores single words; the slab kernel stores 16-byte vectors but loads two aligned source
vectors for each and shifts the words into place with selects. Four wire rows of one (peer,
token) are 2052 words (8208 bytes), so chunks of 4k heads start on 16 bytes.

Part "gather": the slab kernel's chunks with each vector's four words loaded one lane each
from where they are (a word of head k = w // 513, lane w % 513 of the chunk's word w; the
loads are single lanes, consecutive across threads), then stored as one 16-byte vector:
``gather{heads}x{warps}`` on a token-major grid, ``_hm`` head-major.

Part "tma": stores by the tensor memory accelerator (TMA; Hopper's bulk copy engine), which
takes a box from shared memory to a coordinate of a tensor whose base and strides are 16-byte
multiples: the wire viewed as [B*H/4, 2052]; wire row 4g+k, lanes c*256 .. c*256+255, is the
box [g, k*513 + c*256] of it.
  tma{BR}x{warps}: BR groups of 4 rows a program; the 8 boxes [BR, 256] of out's rows (vector
    loads) stored by TMA at unaligned coordinates; the 4 LSE words by plain stores. On an
    H200 these stop on an illegal instruction (``--check`` shows it), so they run only when
    asked for.
  tmaal{BR}x{warps}: boxes at aligned coordinates (c*256 words of the group): the words
    gathered from out and the LSE lane by lane (single-word loads), stored by TMA.
  tmacopy{BR}: a TMA-in, TMA-out copy of as many bytes (does the engine beat copy_?).
Every variant's bytes are checked against the straightforward kernel's first (copies against
their source).

    python benchmarks/benchmark_pack_aligned_stores.py --check   (the unaligned boxes, small
        problems, on the GPU)
    python benchmarks/benchmark_pack_aligned_stores.py OUT.json gather|tma [--budget SECONDS]
        (on an sm90 GPU; PACK_TMA_UNALIGNED=1 adds the unaligned boxes)
"""
import os, statistics, time
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor
from dcp_a2a.testing.bench import copy_bandwidth, timed_rounds
from _rounds import check_bytes, copy_pair, fp32_d512_points, point_runs, pack_point, packs
from benchmark_copy_bandwidth import triton_copy
import _run

ROW = tl.constexpr(513)      # wire words a row (512 data + the LSE)
GROUP = tl.constexpr(4 * 513)
BOX = tl.constexpr(256)      # words a TMA box row (the engine's limit is 256 elements a dimension)


@triton.jit
def _group_src(g, B, HPR: tl.constexpr, s_ob, s_oh, s_lb, s_lh):
    """out and lse offsets of the first row of groups g (4 wire rows of one peer and token)."""
    w = 4 * g
    j = w % HPR
    rb = w // HPR
    b = rb % B
    h = (rb // B) * HPR + j
    return b * s_ob + h * s_oh, b * s_lb + h * s_lh


@triton.jit
def _row_tma(out_ptr, lse_ptr, wire_ptr, desc, g, g0, ok, src, lsrc, k: tl.constexpr,
             s_oh, s_lh):
    lanes = tl.arange(0, BOX)[None, :]
    x0 = tl.load(out_ptr + (src + k * s_oh)[:, None] + lanes, mask=ok[:, None])
    x1 = tl.load(out_ptr + (src + k * s_oh + BOX)[:, None] + lanes, mask=ok[:, None])
    lse = tl.load(lse_ptr + lsrc + k * s_lh, mask=ok)
    desc.store([g0, k * ROW], x0)
    desc.store([g0, k * ROW + BOX], x1)
    tl.store(wire_ptr + g.to(tl.int64) * GROUP + k * ROW + 512, lse.to(tl.int32, bitcast=True),
             mask=ok)


@triton.jit
def _pack_tma_kernel(out_ptr, lse_ptr, wire_ptr, desc, B, n_groups, HPR: tl.constexpr,
                     s_ob, s_oh, s_lb, s_lh, BR: tl.constexpr, ALIGNED: tl.constexpr):
    """Groups g0 .. g0+BR-1 of 4 wire rows: ``ALIGNED``, boxes of the group's words at
    16-byte coordinates, gathered lane by lane; else each row's two boxes of 256 data words at
    the row's own coordinate, and its LSE word by a plain store."""
    g0 = tl.program_id(0) * BR
    g = g0 + tl.arange(0, BR)
    ok = g < n_groups
    src, lsrc = _group_src(g, B, HPR, s_ob, s_oh, s_lb, s_lh)
    if ALIGNED:
        for c in tl.static_range(GROUP // BOX):
            w = c * BOX + tl.arange(0, BOX)[None, :]
            k = w // ROW
            lane = w - k * ROW
            data = tl.load(out_ptr + src[:, None] + k * s_oh + lane,
                           mask=ok[:, None] & (lane < 512))
            lse = tl.load(lse_ptr + lsrc[:, None] + k * s_lh, mask=ok[:, None] & (lane == 512))
            desc.store([g0, c * BOX], tl.where(lane == 512, lse.to(tl.int32, bitcast=True), data))
        # the group's last 4 words: row 3's lanes 509..511 and its LSE
        t = GROUP - 4 + tl.arange(0, 4)[None, :]
        lane = t - 3 * ROW
        data = tl.load(out_ptr + src[:, None] + 3 * s_oh + lane, mask=ok[:, None] & (lane < 512))
        lse = tl.load(lse_ptr + lsrc[:, None] + 3 * s_lh, mask=ok[:, None] & (lane == 512))
        tl.store(wire_ptr + g.to(tl.int64)[:, None] * GROUP + t,
                 tl.where(lane == 512, lse.to(tl.int32, bitcast=True), data), mask=ok[:, None])
    else:
        for k in tl.static_range(4):
            _row_tma(out_ptr, lse_ptr, wire_ptr, desc, g, g0, ok, src, lsrc, k, s_oh, s_lh)


@triton.jit
def _pack_gather_kernel(out_ptr, lse_ptr, wire_ptr, B, HPR: tl.constexpr, s_ob, s_oh, s_lb, s_lh,
                        G: tl.constexpr, VT: tl.constexpr, TT: tl.constexpr,
                        HEAD_MAJOR: tl.constexpr):
    """Program (token b, chunk c): heads c*G .. c*G+G-1 (one peer's) to the wire chunk of
    G * 513 words, as G * 513 / 4 vectors in two tiles (VT and TT vectors)."""
    b = tl.program_id(1 if HEAD_MAJOR else 0)
    h0 = tl.program_id(0 if HEAD_MAJOR else 1) * G
    r = h0 // HPR
    chunk = wire_ptr + 4 * (((r * B + b) * HPR + (h0 - r * HPR)) * ROW // 4)
    src = out_ptr + b * s_ob + h0 * s_oh
    lrow = lse_ptr + b * s_lb + h0 * s_lh
    NV: tl.constexpr = G * ROW // 4
    # every load of both tiles before the first store
    main, wm = _gathered(src, lrow, 0, NV, s_oh, s_lh, VT)
    tail, wt = _gathered(src, lrow, VT, NV, s_oh, s_lh, TT)
    tl.store(chunk + wm, main, mask=wm < 4 * NV)
    tl.store(chunk + wt, tail, mask=wt < 4 * NV)


@triton.jit
def _gathered(src, lrow, v0, NV: tl.constexpr, s_oh, s_lh, VT: tl.constexpr):
    """Words of chunk vectors v0 .. v0+VT-1, [VT, 4], and their word indices."""
    w = 4 * (v0 + tl.arange(0, VT))[:, None] + tl.arange(0, 4)[None, :]
    ok = w < 4 * NV
    k = w // ROW
    lane = w - k * ROW
    data = tl.load(src + k * s_oh + lane, mask=ok & (lane < 512))
    lse = tl.load(lrow + k * s_lh, mask=ok & (lane == 512))
    return tl.where(lane == 512, lse.to(tl.int32, bitcast=True), data), w


def gather_pack(out, lse, send, hpr, g, warps, head_major):
    b, h, d = out.shape
    nv = g * ROW.value // 4
    vt = triton.next_power_of_2(nv) // 2
    tt = triton.next_power_of_2(nv - vt)
    o = out.view(torch.int32)
    wire = send.view(torch.int32)
    grid = (h // g, b) if head_major else (b, h // g)
    return lambda: _pack_gather_kernel[grid](
        o, lse, wire, b, hpr, o.stride(0), o.stride(1), lse.stride(0), lse.stride(1),
        G=g, VT=vt, TT=tt, HEAD_MAJOR=head_major, num_warps=warps)


@triton.jit
def _tma_copy_kernel(src_desc, dst_desc, BR: tl.constexpr):
    r = tl.program_id(0) * BR
    for c in tl.static_range(4):
        dst_desc.store([r, c * BOX], src_desc.load([r, c * BOX]))


def tma_pack(out, lse, send, hpr, br, warps, aligned):
    b, h, d = out.shape
    n_groups = b * h // 4
    wire = send.view(torch.int32).view(n_groups, GROUP.value)
    desc = TensorDescriptor(wire, [n_groups, GROUP.value], [GROUP.value, 1], [br, BOX.value])
    o = out.view(torch.int32)
    grid = (triton.cdiv(n_groups, br),)
    return lambda: _pack_tma_kernel[grid](o, lse, wire, desc, b, n_groups, hpr, o.stride(0),
                                          o.stride(1), lse.stride(0), lse.stride(1), BR=br,
                                          ALIGNED=aligned, num_warps=warps)


def tma_copy(src, dst, br):
    rows = src.shape[0]
    sd = TensorDescriptor(src, list(src.shape), [1024, 1], [br, BOX.value])
    dd = TensorDescriptor(dst, list(dst.shape), [1024, 1], [br, BOX.value])
    return lambda: _tma_copy_kernel[(triton.cdiv(rows, br),)](sd, dd, BR=br, num_warps=4)


def check_small():
    """The unaligned boxes on a few small problems (a process of its own: an engine that
    refused them would fault the context)."""
    for b, h, n in ((3, 16, 4), (5, 32, 4), (7, 8, 1)):
        p, hpr, out, lse, send, nbytes, ref = pack_point(b, h, n, 512, "float32")
        check_bytes({f"tma{br}x{w}": tma_pack(out, lse, send, hpr, br, w, False)
                     for br, w in ((1, 4), (2, 8), (4, 8))}, send, ref, (b, h, n))
    torch.cuda.synchronize()
    print("unaligned TMA boxes: bytes equal the straightforward kernel's")


# off unless asked for: on an H200 (Triton 3.6) they stop the process on an illegal instruction
UNALIGNED = os.environ.get("PACK_TMA_UNALIGNED") == "1"


GATHER = ((4, 1), (4, 2), (4, 4), (8, 2), (8, 4), (16, 4), (16, 8))


def parser():
    ap = _run.parser(__doc__, "benchmark_pack_aligned_stores.py")
    _run.add_out(ap, required=False)
    ap.add_argument("part", nargs="?", choices=("gather", "tma"))
    ap.add_argument("--budget", type=_run.positive_float, default=300.0,
                    help="seconds of points (the rest are skipped)")
    ap.add_argument("--check", action="store_true",
                    help="only check the unaligned boxes' bytes on small problems")
    return ap


def main(argv=None):
    ap = parser()
    args = ap.parse_args(argv)
    if args.check:
        return check_small()
    if args.out is None or args.part is None:
        ap.error("OUT.json and a part (gather or tma) are needed without --check")
    with _run.recorded(args.out, "pack_aligned_stores") as save:
        measure(save, args.budget, args.part)


def measure(save, budget, part):
    t0 = time.time()
    copy = copy_bandwidth(1 << 30)
    pts = fp32_d512_points(16384)
    rows = []
    for (b, h, n, d, dt), (p, hpr, out, lse, send, nbytes, ref) in point_runs(pts, t0, budget):
        variants = packs(out, lse, send, hpr)
        if part == "tma":
            for br, w in ((1, 4), (2, 4), (2, 8), (4, 8)) if UNALIGNED else ():
                variants[f"tma{br}x{w}"] = tma_pack(out, lse, send, hpr, br, w, False)
            for br, w in ((1, 4), (2, 8)):
                variants[f"tmaal{br}x{w}"] = tma_pack(out, lse, send, hpr, br, w, True)
        else:
            for g, w in GATHER:
                for hm in (False, True):
                    if hpr % g == 0:
                        variants[f"gather{g}x{w}" + ("_hm" if hm else "")] = gather_pack(
                            out, lse, send, hpr, g, w, hm)
        check_bytes(variants, send, ref, (b, h, n, d, dt))
        if not rows:  # how the compiler emitted the wire stores: 16-byte vectors or words
            for k, fn in variants.items():
                ptx = getattr(fn(), "asm", {}).get("ptx", "")
                if ptx:
                    print(k, "stores:", {w: ptx.count(f"st.global{w}") for w in
                                         (".v4.b32", ".v2.b32", ".b32")}, flush=True)
        c_src, c_dst = copy_pair(nbytes, 1024)
        copies = {"copy_": lambda: c_dst.copy_(c_src)}
        if part == "tma":
            copies.update({f"tmacopy{br}": tma_copy(c_src, c_dst, br) for br in (1, 4)})
        else:
            copies["tl1024x4"] = triton_copy(c_src.view(-1), c_dst.view(-1), 1024, 4)
        check_bytes(copies, c_dst, c_src.view(torch.uint8), (b, h, n, d, dt))
        variants.update(copies)
        us, times, _ = timed_rounds(variants, nbytes)
        r = dict(B=b, H=h, N=n, D=d, dtype=dt, us=us, rounds=times,
                 over_sf={k: v / us["sf"] for k, v in us.items()})
        rows.append(r)
        best = min((k for k in us if k.startswith(("tma", "gather")) and "copy" not in k),
                   key=us.get)
        print(f"{b} {h} {n} rows {b * h}: sf {us['sf']:.2f} table/sf {us['table'] / us['sf']:.3f} "
              f"copy_/sf {us['copy_'] / us['sf']:.3f} best {best}/sf {us[best] / us['sf']:.3f} | "
              + " ".join(f"{k} {v:.2f}" for k, v in us.items()), flush=True)
        save(dict(device=torch.cuda.get_device_name(), copy_gbps=copy, rows=rows))
    for k in dict.fromkeys(k for r in rows for k in r["us"]):  # some run at some points only
        rs = [r["over_sf"][k] for r in rows if k in r["over_sf"]]
        print(f"{k:12s} / sf: median {statistics.median(rs):.3f} max {max(rs):.3f} "
              f"> 0.95 at {sum(x > 0.95 for x in rs)} of {len(rs)}")
    print(f"{len(rows)} of {len(pts)} points in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
