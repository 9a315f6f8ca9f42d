"""Why does the quick benchmark read the B=8192 H=64 N=4 bf16 unpack 6-11 % slower than the
grid (docs/perf.md, "How it is measured")? Both, in one process, in alternation: the quick
benchmark's timing of the shape (``bench_shape``: the pack timed first with events, then the
unpack as graph replays) and the grid's (``grid_point``: the unpack in rounds next to the
straightforward kernel and a copy), then the unpack timed alone after a pause, and the SM and
memory clocks read around each (nvidia-smi). Run in the twelfth pass (docs/perf_history.md): before
``bench.time_us`` warmed up, ``unpack_quick_vs_grid_h200.json``; after, ``..._warm_h200.json``.

    python docs/perf_data/unpack_quick_vs_grid.py OUT.json [REPEATS]   (on a GPU; PYTHONPATH=. from the checkout)
"""
import json, sys, time
import torch
from dcp_a2a.ops import pack_send, unpack_combine
from _rounds import clocks
from dcp_a2a.testing.bench import bench_shape, copy_bandwidth, grid_point, time_us, _inputs


b, h, d, n, dt = 8192, 64, 512, 4, "bfloat16"
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
copy = copy_bandwidth()
rows = []
for i in range(repeats):
    quick = {r.op: r.us for r in bench_shape(b, h, d, n, dt, copy)}
    rows.append({"how": "bench_shape", "unpack_us": quick["unpack_combine"],
                 "pack_us": quick["pack"], "clocks_after": clocks()})
    g = grid_point(b, h, n, d, dt, copy, rounds=3)
    rows.append({"how": "grid_point", "unpack_us": g["unpack_us"], "pack_us": g["pack_us"],
                 "clocks_after": clocks()})
    time.sleep(2)  # an idle GPU, then the unpack alone, timed as bench_shape times it
    dtype, es, p, hpr, out, lse, send = _inputs(b, h, d, n, dt)
    pack_send(out, lse, send, n, hpr, d, p)
    us, _ = time_us(lambda: unpack_combine(send, d, p, False, True),
                    send.numel() * es + b * hpr * d * es)
    rows.append({"how": "alone after 2 s", "unpack_us": us, "clocks_after": clocks()})
    for r in rows[-3:]:
        print(r, flush=True)
json.dump({"device": torch.cuda.get_device_name(), "copy_gbps": copy, "rows": rows},
          open(sys.argv[1], "w"), indent=1)
