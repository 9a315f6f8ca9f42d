"""Does where the wire buffer lies decide the B=8192 unpack's speed? ``idle_warmup.py`` found
no idle effect (166-170 us after 2 s of idle, with or without warm-up), while
``unpack_quick_vs_grid.py`` read 180-184 us for the same kernel on buffers allocated after
other benchmarks had freed theirs. Here one wire's bytes are copied into buffers placed four
ways, and the unpack timed on each in interleaved rounds:
  fresh: a cudaMalloc of its own;
  carved0: carved at offset 0 from the caching allocator's freed 4 GiB segment (the first
    thing ``copy_bandwidth`` leaves behind);
  carved1g: the same segment, 1 GiB in;
  after_copy: carved from the freed buffers of ``copy_bandwidth`` itself (2 x 4 GiB, copied).
The pack (B=8192 H=64 D=512 N=4 bf16) is timed the same way, its input ``out`` placed alike.

    python docs/perf_data/alloc_placement.py OUT.json [ROUNDS]   (on a GPU; PYTHONPATH=. from the checkout)
"""
import json, sys
import torch
from dcp_a2a.ops import pack_send, unpack_combine
from dcp_a2a.testing.bench import _inputs, copy_bandwidth, time_us

b, h, d, n, dt = 8192, 64, 512, 4, "bfloat16"
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
dtype, es, p, hpr, out0, lse, send0 = _inputs(b, h, d, n, dt)
pack_send(out0, lse, send0, n, hpr, d, p)


def placed():
    """(wire, out) copies of send0 and out0, one pair a placement."""
    pl = {"fresh": (send0.clone(), out0.clone())}
    big = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    del big
    pl["carved0"] = (send0.clone(), out0.clone())
    big = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    del big
    pad = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    pl["carved1g"] = (send0.clone(), out0.clone(), pad)
    copy = copy_bandwidth()
    pl["after_copy"] = (send0.clone(), out0.clone())
    return pl, copy


pl, copy = placed()
for k, v in pl.items():
    print(k, hex(v[0].data_ptr()), hex(v[1].data_ptr()), flush=True)
wire_b = send0.numel() * es
times = {f"{op} {k}": [] for op in ("unpack", "pack") for k in pl}
for r in range(rounds):
    for k, v in pl.items():
        s, o = v[0], v[1]
        times[f"unpack {k}"].append(time_us(lambda: unpack_combine(s, d, p, False, True),
                                            wire_b + b * hpr * d * es)[0])
        times[f"pack {k}"].append(time_us(lambda: pack_send(o, lse, s, n, hpr, d, p),
                                          b * h * d * es + b * h * 4 + wire_b)[0])
    print({k: round(v[-1], 1) for k, v in times.items()}, flush=True)
json.dump({"device": torch.cuda.get_device_name(), "copy_gbps": copy, "times_us": times,
           "ptrs": {k: [hex(v[0].data_ptr()), hex(v[1].data_ptr())] for k, v in pl.items()}},
          open(sys.argv[1], "w"), indent=1)
