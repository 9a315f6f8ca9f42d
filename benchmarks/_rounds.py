"""What the pack benchmarks here share besides the bench's timers: one grid point's pack inputs
and reference bytes, and a check of every variant's wire bytes before timing them
(``dcp_a2a.testing.bench.timed_rounds`` then times them in interleaved rounds); the GPU's
clocks as nvidia-smi reports them."""
import statistics, subprocess, time
import torch
from dcp_a2a.kernels import tuning
from dcp_a2a.kernels.pack import pack
from dcp_a2a.testing import straightforward as sf
from dcp_a2a.testing.bench import _inputs, copy_bandwidth, grid_point, grid_points


def pack_point(b, h, n, d, dt):
    """(P, H/N, out, lse, send, bytes the pack moves, the straightforward pack's wire bytes)
    at one grid point, on the GPU."""
    dtype, es, p, hpr, out, lse, send = _inputs(b, h, d, n, dt)
    nbytes = out.numel() * es + lse.numel() * 4 + send.numel() * es
    sf.pack(out, lse, send)
    return p, hpr, out, lse, send, nbytes, send.view(torch.uint8).clone()


def check_bytes(variants, send, ref, where):
    """Run each of ``variants`` (name: callable writing ``send``) on a poisoned buffer and ask
    for ``ref``'s bytes."""
    for name, fn in variants.items():
        send.view(torch.uint8).fill_(0xFF)
        fn()
        assert torch.equal(send.view(torch.uint8), ref), (name, *where)


def fp32_d512_points(min_rows):
    """The grid's fp32 D=512 points of at least ``min_rows`` rows, fewest rows first."""
    return sorted((p for p in grid_points() if p[3] == 512 and p[4] == "float32"
                   and p[0] * p[1] >= min_rows), key=lambda p: p[0] * p[1])


def point_runs(points, t0, budget):
    """(point, ``pack_point(*point)``) for ``points``, while less than ``budget`` seconds
    have passed since ``t0``."""
    for pt in points:
        if time.time() - t0 > budget:
            return
        yield pt, pack_point(*pt)


def copy_pair(nbytes, row=None):
    """A random int32 source of ``nbytes`` / 2 bytes (a pack's bytes one way) and an empty
    destination, flat or in rows of ``row`` words."""
    n = nbytes // 8
    shape = (n,) if row is None else (n // row, row)
    src = torch.randint(-2 ** 31, 2 ** 31 - 1, shape, dtype=torch.int32, device="cuda")
    return src, torch.empty_like(src)


def packs(out, lse, send, hpr):
    """The two packs every script times: the straightforward kernel and the table's."""
    return {"sf": lambda: sf.pack(out, lse, send), "table": lambda: pack(out, lse, send, hpr)}


def under_launch(kind, cfg, fn):
    """``fn`` with the launch ``cfg`` in place of the table's for kernel ``kind``
    (``tuning.OVERRIDES``); the callable returns what ``fn`` does."""
    def run():
        tuning.OVERRIDES[kind] = cfg
        try:
            return fn()
        finally:
            tuning.OVERRIDES.clear()
    return run


def pack_variants(out, lse, send, hpr, row_heads=(1, 2, 4, 8)):
    """``packs`` and the launches the sweeps time around them: the row kernel at ``row_heads``
    heads a program x 1, 2, 4 or 8 warps, vector or lane loads ("row{heads}x{warps}[_lane]"),
    and the slab kernel at 4, 8 or 16 heads x 1, 2, 4 or 8 warps ("slab{heads}x{warps}"; the
    row kernel where the slab kernel does not fit). The head's tile is its whole width."""
    v = packs(out, lse, send, hpr)
    for heads in row_heads:
        for warps in (1, 2, 4, 8):
            for lane in (False, True):
                cfg = tuning.Launch(heads, 1024, warps, lane_loads=lane)
                v[f"row{heads}x{warps}" + "_lane" * lane] = pack_under(cfg, out, lse, send, hpr)
    for heads in (4, 8, 16):
        for warps in (1, 2, 4, 8):
            cfg = tuning.Launch(heads, 1024, warps, slab=True)
            v[f"slab{heads}x{warps}"] = pack_under(cfg, out, lse, send, hpr)
    return v


def pack_under(cfg, out, lse, send, hpr):
    """A pack with the launch ``cfg`` in place of the table's."""
    return under_launch("pack", cfg, lambda: pack(out, lse, send, hpr))


def check_tables(save, pts, old, rounds, settle_rounds=0):
    """The table against the candidate table ``old`` (``tuning.CANDIDATES``) at ``pts`` by
    ``bench.grid_point`` (bytes checked; the straightforward kernel and a copy timed alike;
    each table's verdict); a line a point, the rows to ``save``, and the table's time over
    ``old``'s: median and range."""
    copy, rows = copy_bandwidth(1 << 30), []
    for pt in pts:
        r = grid_point(*pt, copy, tables=("table", old), rounds=rounds,
                       settle_rounds=settle_rounds)
        rows.append(r)
        new, was = (r["tables"][t] for t in ("table", old))
        print(f"{pt}: table {new['pack_us']:.3f} ({new['pack_verdict']}) {old} "
              f"{was['pack_us']:.3f} ({was['pack_verdict']}) sf "
              f"{r['pack_straightforward_us']:.3f} | table/{old} "
              f"{new['pack_us'] / was['pack_us']:.3f} table/sf {r['pack_ratio']:.3f} "
              f"[{r['pack_ratio_ci'][0]:.3f}, {r['pack_ratio_ci'][1]:.3f}]", flush=True)
    save(dict(device=torch.cuda.get_device_name(), copy_gbps=copy, rows=rows))
    q = [r["tables"]["table"]["pack_us"] / r["tables"][old]["pack_us"] for r in rows]
    print(f"table / {old}: median {statistics.median(q):.3f} min {min(q):.3f} max "
          f"{max(q):.3f}; table / sf worst {max(r['pack_ratio'] for r in rows):.3f}")


def clocks() -> str:
    """nvidia-smi's SM clock, memory clock (MHz), power draw (W) and temperature (C), now."""
    q = "clocks.sm,clocks.mem,power.draw,temperature.gpu"
    r = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True)
    return r.stdout.strip()
