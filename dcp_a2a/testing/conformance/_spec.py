"""The wire format built straight from its specification, for contract tests.

Deliberately independent of every implementation (the project's kernels, ``reference``): the
expected send buffer is assembled element by element with numpy from the words of the spec, so
an implementation whose pack and unpack agree with each other but not with the spec (swapped
LSE halves, interleaved heads) still fails.

    buf[N, B, H/N, D + P]  in the output dtype
      slice r, row b, local head j  <-  global head r*H/N + j of out[b]
      lanes [0, D)    the partial output, bit for bit
      lanes [D, D+P)  the float32 LSE: P=1 its 32 bits; P=2 low 16 bits, then high 16 bits
      a row masked by seq_lens/query_start_loc: LSE -inf; its output lanes are not specified
      (every receiver weighs the row 0), so the tests compare only its LSE lanes
"""

from __future__ import annotations

import numpy as np
import torch

UINT = {2: np.uint16, 4: np.uint32}


def pack_dim(dtype: torch.dtype) -> int:
    return 2 if dtype in (torch.float16, torch.bfloat16) else 1


def raw_bits(t: torch.Tensor) -> np.ndarray:
    """The element bits of a float tensor as unsigned integers (numpy), layout-independent."""
    it = {2: torch.int16, 4: torch.int32}[t.element_size()]
    return t.detach().cpu().contiguous().view(it).numpy().view(UINT[t.element_size()])


def lse_words(lse32_bits: np.ndarray, p: int) -> list[np.ndarray]:
    """The P lane words of float32 LSE bits (uint32 array)."""
    if p == 1:
        return [lse32_bits]
    return [(lse32_bits & 0xFFFF).astype(np.uint16), (lse32_bits >> 16).astype(np.uint16)]


def expected_send(out: torch.Tensor, lse: torch.Tensor, n: int,
                  empty_rows=None) -> np.ndarray:
    """Unsigned-integer image of the send buffer a rank holding ``out[B, H, D]``,
    ``lse[B, H]`` must write for a group of ``n``; ``empty_rows`` (bool [B]) go out as -inf."""
    b, h, d = out.shape
    hpr, p = h // n, pack_dim(out.dtype)
    ob = raw_bits(out)                                   # [B, H, D]
    lse32 = lse.detach().cpu().to(torch.float32).clone()  # widening is exact for bf16/fp16
    if empty_rows is not None:
        lse32[torch.as_tensor(empty_rows, dtype=torch.bool)] = float("-inf")
    lb = raw_bits(lse32)                                 # [B, H] uint32
    words = lse_words(lb, p)
    buf = np.zeros((n, b, hpr, d + p), dtype=UINT[out.element_size()])
    for r in range(n):
        for j in range(hpr):
            head = r * hpr + j
            buf[r, :, j, :d] = ob[:, head, :]
            for k in range(p):
                buf[r, :, j, d + k] = words[k][:, head]
    return buf


def build_recv(outs: torch.Tensor, lses: torch.Tensor, rank: int) -> torch.Tensor:
    """The receive buffer of ``rank`` when every rank n holds ``outs[n]``, ``lses[n]`` (float32
    LSEs): recv[src] = send_of_src[rank]. Built from the spec, not by any implementation."""
    n = outs.shape[0]
    bufs = [expected_send(outs[s], lses[s], n)[rank] for s in range(n)]
    arr = np.ascontiguousarray(np.stack(bufs))
    it = {2: torch.int16, 4: torch.int32}[outs.element_size()]
    t = torch.from_numpy(arr.view({2: np.int16, 4: np.int32}[outs.element_size()]).copy())
    return t.view(it).view(outs.dtype).to(outs.device)
