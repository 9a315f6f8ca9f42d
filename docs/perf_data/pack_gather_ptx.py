"""The gather pack's memory instructions (docs/perf_history.md, fourteenth pass): compile
``pack_wire_order._pack_gather_kernel`` at 256x128x8 fp32 D=512, 4 heads a program, 4 and 8
warps, and count the PTX's global and shared loads and stores (16-byte vectors or single
words) and barriers.

    PYTHONPATH=. python docs/perf_data/pack_gather_ptx.py   (on a GPU, from the checkout)
"""
import re, sys
import torch

sys.path.insert(0, "docs/perf_data")
import pack_wire_order as m

B, H, N, D = 256, 128, 8, 512
out = torch.randn(B, H, D, device="cuda")
lse = torch.randn(B, H, device="cuda")
send = torch.empty(N, B, H // N, D + 1, device="cuda")
src, dst = out.view(torch.int32), send.view(torch.int32)
OPS = ("st.global.v4", "st.global.b32", "ld.global.v4", "ld.global.b32", "st.shared",
       "ld.shared", "bar.sync")
for warps in (4, 8):
    k = m._pack_gather_kernel[(H // N // 4, B, N)](
        src, lse, dst, B, src.stride(0), src.stride(1), lse.stride(0), lse.stride(1),
        HPR4=H // N // 4, D=D, G4=1, num_warps=warps)
    ptx = k.asm["ptx"]
    print(f"gather4x{warps}", {op: len(re.findall(re.escape(op), ptx)) for op in OPS})
