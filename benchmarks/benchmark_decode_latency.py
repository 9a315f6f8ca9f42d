"""The decode target of issue 14 (B=1 H=128 D=512 N=8 bf16: pack + unpack <= 3.0 us under
graph replay), timed in interleaved rounds next to the straightforward kernels (the spread
between rounds is the noise the grid's single timing carries at the launch floor).

    python docs/perf_data/decode_target.py OUT.json [ROUNDS]   (on a GPU; PYTHONPATH=. from the checkout)
"""
import json, sys
import torch
from dcp_a2a.ops import pack_send, unpack_combine
from dcp_a2a.testing import straightforward as sf
from dcp_a2a.testing.bench import _inputs, timed_rounds

b, h, d, n, dt = 1, 128, 512, 8, "bfloat16"
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
dtype, es, p, hpr, out, lse, send = _inputs(b, h, d, n, dt)
nbytes = out.numel() * es + lse.numel() * 4 + send.numel() * es
pack_send(out, lse, send, n, hpr, d, p)
variants = {"pack": lambda: pack_send(out, lse, send, n, hpr, d, p),
            "pack_sf": lambda: sf.pack(out, lse, send),
            "unpack": lambda: unpack_combine(send, d, p, False, True),
            "unpack_sf": lambda: sf.unpack_combine(send, d)}
med, times, _ = timed_rounds(variants, nbytes, rounds)
res = dict(device=torch.cuda.get_device_name(), shape=[b, h, d, n, dt], median_us=med,
           rounds=times, pack_plus_unpack_us=med["pack"] + med["unpack"],
           worst_round_sum_us=max(a + c for a, c in zip(times["pack"], times["unpack"])))
json.dump(res, open(sys.argv[1], "w"), indent=1)
print(" ".join(f"{k} {v:.3f} [{min(times[k]):.3f}-{max(times[k]):.3f}]" for k, v in med.items()))
print(f"pack + unpack {res['pack_plus_unpack_us']:.3f} us (median of {rounds} rounds), "
      f"worst round {res['worst_round_sum_us']:.3f} us")
