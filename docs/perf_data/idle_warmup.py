"""Is the quick benchmark's slow B=8192 unpack (docs/perf.md, "How it is measured") a GPU
that has just been idle? ``unpack_quick_vs_grid.py`` found the unpack timed alone after 2 s of
idle at 181-184 us, and at 167-168 us inside the grid's rounds and after a warm pack. Here,
after 2 s of idle each, ``time_us`` with 0, 5, 25 and 100 ms of untimed warm-up replays
(``warmup_ms``), twice in a row (the second finds a busy GPU), and once after 50 ms of an
unrelated copy (a device-wide state, or these buffers'?), at three shapes; interleaved,
REPEATS times.

    python docs/perf_data/idle_warmup.py OUT.json [REPEATS]   (on a GPU; PYTHONPATH=. from the checkout)
"""
import json, sys, time
import torch
from dcp_a2a.ops import pack_send, unpack_combine
from _rounds import clocks
from dcp_a2a.testing.bench import _inputs, time_us


def case(b, h, d, n, dt, op):
    dtype, es, p, hpr, out, lse, send = _inputs(b, h, d, n, dt)
    pack_send(out, lse, send, n, hpr, d, p)
    if op == "pack":
        return (lambda: pack_send(out, lse, send, n, hpr, d, p),
                b * h * d * es + b * h * 4 + send.numel() * es)
    return (lambda: unpack_combine(send, d, p, False, True),
            send.numel() * es + b * hpr * d * es)


cases = {"unpack 8192x64x512 N=4 bf16": case(8192, 64, 512, 4, "bfloat16", "unpack"),
         "unpack 128x128x512 N=8 bf16": case(128, 128, 512, 8, "bfloat16", "unpack"),
         "pack 1x128x512 N=8 bf16": case(1, 128, 512, 8, "bfloat16", "pack")}
side = torch.empty(1 << 29, dtype=torch.uint8, device="cuda")
side2 = torch.empty_like(side)
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
rows = []
for i in range(repeats):
    for name, (fn, nbytes) in cases.items():
        for w in (0, 5, 25, 100):
            time.sleep(2)
            first, _ = time_us(fn, nbytes, warmup_ms=w)
            second, _ = time_us(fn, nbytes, warmup_ms=w)
            rows.append({"case": name, "warmup_ms": w, "first_us": first, "second_us": second,
                         "clocks_after": clocks()})
            print(rows[-1], flush=True)
        time.sleep(2)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.05:
            side2.copy_(side)
        torch.cuda.synchronize()
        us, _ = time_us(fn, nbytes, warmup_ms=0)
        rows.append({"case": name, "warmup_ms": "50 ms unrelated copy, then 0", "first_us": us})
        print(rows[-1], flush=True)
json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, open(sys.argv[1], "w"),
          indent=1)
