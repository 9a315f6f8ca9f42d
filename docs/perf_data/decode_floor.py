"""The pack at decode sizes (every grid point of at most 1024 rows, B x H), in one run:
the straightforward kernel, the pack as landed before the sixth pass (a copy of that package,
imported under another name), and this checkout's pack with its table and with vector loads
at decode sizes. Rounds interleave the variants (the spread between rounds is the noise);
each variant's send buffer is checked bit for bit against the straightforward kernel's first.

    python docs/perf_data/decode_floor.py OUT.json HEAD_PACKAGE_PARENT   (on a GPU; PYTHONPATH=. from the checkout)
"""
import importlib, json, statistics, sys
import torch
sys.path.insert(0, sys.argv[2])
head = importlib.import_module("dcp_a2a_head")
from dcp_a2a.kernels import tuning
from dcp_a2a.ops import pack_send
from dcp_a2a.testing import straightforward as sf
from dcp_a2a.testing.bench import grid_points, timed_rounds
from _rounds import check_bytes, pack_point

VECTOR = {**tuning.TABLE, "pack": tuning.CANDIDATES["pack_fifth_pass"]["pack"]}
rows = []
for (b, h, n, d, dt) in grid_points():
    if b * h > 1024:
        continue
    p, hpr, out, lse, send, nbytes, ref = pack_point(b, h, n, d, dt)

    def table(fn=pack_send):
        fn(out, lse, send, n, hpr, d, p)

    def vector():
        tuning.ACTIVE = VECTOR
        try:
            pack_send(out, lse, send, n, hpr, d, p)
        finally:
            tuning.ACTIVE = tuning.TABLE

    variants = {"sf": lambda: sf.pack(out, lse, send), "head": lambda: table(head.pack_send),
                "table": table, "vector_loads": vector}
    check_bytes(variants, send, ref, (b, h, n, d, dt))
    us, times, _ = timed_rounds(variants, nbytes)
    r = dict(B=b, H=h, N=n, D=d, dtype=dt, us=us, rounds=times)
    r["ratio"] = {k: r["us"][k] / r["us"]["sf"] for k in variants if k != "sf"}
    rows.append(r)
    print(b, h, n, d, dt, " ".join(f"{k} {v:.3f}" for k, v in r["us"].items()),
          " ".join(f"{k}/sf {v:.3f}" for k, v in r["ratio"].items()), flush=True)
json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), open(sys.argv[1], "w"), indent=1)
for k in ("head", "table", "vector_loads"):
    rs = [r["ratio"][k] for r in rows]
    print(f"{k}: worst {max(rs):.3f} median {statistics.median(rs):.3f} "
          f"> 0.95: {sum(x > 0.95 for x in rs)} of {len(rs)}")
