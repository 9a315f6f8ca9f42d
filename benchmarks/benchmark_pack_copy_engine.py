"""The fp32 D=512 pack from 16k rows up by the GPU's copy engines instead of a kernel, next to
the table, the straightforward kernel and ``copy_`` of the same bytes, in interleaved rounds.

Why: there every kernel tried runs at a Triton copy's speed and ``copy_`` (the driver's
device-to-device memcpy) is 2-5 % faster still. If ``copy_`` is a copy-engine transfer, the
pack's data rows can be one too: for each peer n, a 3-D memcpy whose rows are a head's 2048
bytes (x), the peer's H/N heads (y: 2048 bytes apart in ``out``, 2052 in the wire) and the
tokens (z: H heads apart in ``out``, H/N wire rows apart), by the driver API
(``cuMemcpy3DAsync``; torch has no strided memcpy). The wire's LSE word of each row then needs
one small strided copy of its own.

  ce_rows: the N 3-D copies alone (the LSE words unwritten: bytes not checked; its time is the
    engine's part of the two below)
  ce:      ce_rows, then the LSE words by torch's strided copy on the same stream
  ce_par:  the LSE words on a second stream, joined before the end (both in flight at once)
  copy_:   torch's copy of as many contiguous bytes (one memcpy)
The first point also lists what the profiler sees for ``copy_`` and ``ce_rows`` (a kernel or a
memcpy). Every checked variant's bytes are compared with the straightforward kernel's first.

    python benchmarks/benchmark_pack_copy_engine.py OUT.json [--budget SECONDS]   (on a GPU)
"""
import ctypes, statistics, time
import torch
from dcp_a2a.testing.bench import copy_bandwidth, timed_rounds
from _rounds import check_bytes, copy_pair, fp32_d512_points, point_runs, packs
import _run


class _Memcpy3D(ctypes.Structure):
    # CUDA_MEMCPY3D of cuda.h, field for field
    _side = [("XInBytes", ctypes.c_size_t), ("Y", ctypes.c_size_t), ("Z", ctypes.c_size_t),
             ("LOD", ctypes.c_size_t), ("MemoryType", ctypes.c_int), ("Host", ctypes.c_void_p),
             ("Device", ctypes.c_uint64), ("Array", ctypes.c_void_p), ("reserved", ctypes.c_void_p),
             ("Pitch", ctypes.c_size_t), ("Height", ctypes.c_size_t)]
    _fields_ = ([("src" + k, t) for k, t in _side] + [("dst" + k, t) for k, t in _side]
                + [("WidthInBytes", ctypes.c_size_t), ("Height", ctypes.c_size_t),
                   ("Depth", ctypes.c_size_t)])


_DEVICE = 2  # CU_MEMORYTYPE_DEVICE


def _driver():
    """The CUDA driver's 3-D memcpy (loaded on first use: ``--help`` needs no GPU)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuMemcpy3DAsync_v2.argtypes = [ctypes.POINTER(_Memcpy3D), ctypes.c_void_p]
    cuda.cuMemcpy3DAsync_v2.restype = ctypes.c_int
    return cuda


def _peer_copies(out, send):
    """One CUDA_MEMCPY3D a peer: out[:, n*H/N:(n+1)*H/N, :] -> send[n, :, :, :D]."""
    b, h, d = out.shape
    n, _, hpr, row = send.shape
    es = out.element_size()
    descs = []
    for peer in range(n):
        c = _Memcpy3D()
        c.srcMemoryType = c.dstMemoryType = _DEVICE
        c.srcDevice = out.data_ptr() + peer * hpr * d * es
        c.srcPitch, c.srcHeight = d * es, h
        c.dstDevice = send.data_ptr() + peer * b * hpr * row * es
        c.dstPitch, c.dstHeight = row * es, hpr
        c.WidthInBytes, c.Height, c.Depth = d * es, hpr, b
        descs.append(c)
    return descs


def ce_rows(out, send):
    descs = _peer_copies(out, send)
    cuda = _driver()

    def run():
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        for c in descs:
            rc = cuda.cuMemcpy3DAsync_v2(ctypes.byref(c), stream)
            if rc:
                raise RuntimeError(f"cuMemcpy3DAsync: CUresult {rc}")
    return run


def lse_words(out, lse, send):
    b, h, d = out.shape
    n, _, hpr, _ = send.shape
    src, dst = lse.view(b, n, hpr).permute(1, 0, 2), send[..., d]
    return lambda: dst.copy_(src)


def ce_par(rows, words):
    side = torch.cuda.Stream()

    def run():
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            words()
        rows()
        main.wait_stream(side)
    return run


def profile_names(fns):
    from torch.profiler import ProfilerActivity, profile
    names = {}
    for name, fn in fns.items():
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        names[name] = sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})
    return names


def parser():
    ap = _run.parser(__doc__, "benchmark_pack_copy_engine.py")
    _run.add_out(ap)
    ap.add_argument("--budget", type=_run.positive_float, default=300.0,
                    help="seconds of points (the rest are skipped)")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    with _run.recorded(args.out, "pack_copy_engine") as save:
        measure(save, args.budget)


def measure(save, budget):
    t0 = time.time()
    copy = copy_bandwidth(1 << 30)
    rows, names = [], None
    for (b, h, n, d, dt), (p, hpr, out, lse, send, nbytes, ref) in point_runs(
            fp32_d512_points(16384), t0, budget):
        rows_fn, words_fn = ce_rows(out, send), lse_words(out, lse, send)
        checked = packs(out, lse, send, hpr)
        checked.update(ce=lambda: (rows_fn(), words_fn()), ce_par=ce_par(rows_fn, words_fn))
        check_bytes(checked, send, ref, (b, h, n, d, dt))
        c_src, c_dst = copy_pair(nbytes)
        copy_fn = lambda: c_dst.copy_(c_src)
        check_bytes({"copy_": copy_fn}, c_dst, c_src.view(torch.uint8), (b, h, n, d, dt))
        if names is None:
            names = profile_names({"copy_": copy_fn, "ce_rows": rows_fn, "lse_words": words_fn})
            print(names, flush=True)
        variants = dict(checked, ce_rows=rows_fn, copy_=copy_fn)
        us, times, method = timed_rounds(variants, nbytes)
        r = dict(B=b, H=h, N=n, D=d, dtype=dt, method=method, us=us, rounds=times,
                 **{f"{k}_over_sf": us[k] / us["sf"] for k in variants if k != "sf"})
        rows.append(r)
        print(f"{b} {h} {n} rows {b * h}: " + " ".join(f"{k} {v:.2f}" for k, v in us.items())
              + " | /sf " + " ".join(f"{k} {us[k] / us['sf']:.3f}" for k in variants if k != "sf"),
              flush=True)
        save(dict(device=torch.cuda.get_device_name(), copy_gbps=copy, profiler=names,
                  rows=rows))
    for k in [k for k in rows[0] if k.endswith("_over_sf")]:
        rs = [r[k] for r in rows]
        print(f"{k}: median {statistics.median(rs):.3f} min {min(rs):.3f} max {max(rs):.3f}")


if __name__ == "__main__":
    main()
