"""Reproduce vLLM 0.34.0's two defects of ``_dcp_a2a_pack_send`` through the adapter, each in a
process of its own (one of them kills the process)::

    python -m dcp_a2a.testing.adapters.vllm_defects --impl vllm=vllm-0.34.0-...whl [--json]

``empty_seq_lens``
    ``seq_lens`` of length 0 (``torch.empty(0)``: data pointer 0, the CUDA-graph warm-up of a
    rank without local requests) with ``query_start_loc = [0]``: every row is padding and must
    go out as -inf. vLLM's kernel clamps the request index to ``num_seqs - 1 = -1`` and loads
    ``seq_lens[-1]`` through the null pointer: SIGSEGV on the CPU, an illegal memory access on
    a GPU.
``strided_index_tensors``
    ``seq_lens`` and ``query_start_loc`` as strided views (columns of a table, as an engine
    slices them), the kernel given no strides reads them as contiguous: the rows it masks are
    not the rows of empty shards and padding (the reference's mask, which is vLLM's own eager
    mask ``mask_dcp_empty_shards_``).

Each case prints one line (or, with ``--json``, one JSON object): what the pack did against
the reference (``dcp_a2a.reference.contract``), or how its process died. Exit status 0 when
every case ran to a verdict, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys

import torch

CASES = ("empty_seq_lens", "strided_index_tensors")
N, H, D, DTYPE = 2, 4, 64, torch.bfloat16


def _inputs(case: str, device):
    """(B, seq_lens, query_start_loc) of ``case``."""
    if case == "empty_seq_lens":
        return 4, torch.empty(0, dtype=torch.int32, device=device), \
            torch.zeros(1, dtype=torch.int32, device=device)
    # 4 requests over rows 0..6, row 7 padding; requests 1 and 3 have no KV on this rank
    table = torch.tensor([[5, 9], [0, 9], [3, 9], [0, 9]], dtype=torch.int32, device=device)
    starts = torch.tensor([0, 1, 3, 5, 7], dtype=torch.int32, device=device)
    wide = torch.stack([starts, torch.full_like(starts, 1 << 20)], dim=1)
    return 8, table[:, 0], wide[:, 0]


def _masked_rows(send: torch.Tensor) -> list[int]:
    """Rows whose LSE went out as -inf (in every peer slice and head)."""
    from dcp_a2a.reference.contract import IMPL

    lse = IMPL.lanes_to_lse(send.view(torch.int16)[..., D:])  # [N, B, H/N]
    return [b for b in range(send.shape[1]) if bool(torch.isneginf(lse[:, b]).all())]


def run_case(spec: str, case: str, device: str) -> dict:
    """Pack ``case``'s inputs with the implementation ``spec`` and with the reference."""
    from dcp_a2a.reference import contract
    from dcp_a2a.testing.impl import load_impl

    impl = load_impl(spec)
    b, seq_lens, qsl = _inputs(case, device)
    gen = torch.Generator().manual_seed(0)
    out = torch.randn(b, H, D, generator=gen).to(DTYPE).to(device)
    lse = torch.randn(b, H, generator=gen).to(device)
    p = impl.lse_pack_dim(DTYPE)
    want = torch.empty(N, b, H // N, D + p, dtype=DTYPE)
    contract.pack_send(out.cpu(), lse.cpu(), want, N, H // N, D, p,
                       seq_lens=seq_lens.contiguous().cpu(), query_start_loc=qsl.contiguous().cpu())
    got = torch.full_like(want, float("nan")).to(device)
    impl.pack_send(out, lse, got, N, H // N, D, p, seq_lens=seq_lens, query_start_loc=qsl)
    if got.is_cuda:
        torch.cuda.synchronize()
    got = got.cpu()
    differ = int((got.view(torch.int16) != want.view(torch.int16)).sum())
    return {"case": case, "engine": impl.engine, "masked": _masked_rows(got),
            "expected_masked": _masked_rows(want), "lanes_differ": differ,
            "lanes": want.numel(), "defect": differ > 0}


def _verdict(case: str, proc: subprocess.CompletedProcess) -> dict:
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        return {"case": case, "defect": True,
                "died": f"the process died of {name} (signal {-proc.returncode})"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        unsafe = "illegal memory access" in proc.stderr.lower()
        return {"case": case, "defect": unsafe, "died": f"exit {proc.returncode}: {tail}"}
    return json.loads(lines[-1])


def describe(v: dict) -> str:
    if "died" in v:
        return f"{v['case']}: {'DEFECT' if v['defect'] else 'error'}: {v['died']}"
    if not v["defect"]:
        return f"{v['case']}: as the reference (rows masked {v['masked']})"
    return (f"{v['case']}: DEFECT: rows masked {v['masked']}, the reference masks "
            f"{v['expected_masked']}; {v['lanes_differ']} of {v['lanes']} wire lanes differ")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dcp_a2a.testing.adapters.vllm_defects",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--impl", required=True, help="the implementation, e.g. vllm=WHEEL")
    ap.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # one case, in-process
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="where the pack runs (default: cuda if there is one, else the CPU "
                         "through Triton's interpreter)")
    ap.add_argument("--json", action="store_true", help="one JSON object a case")
    args = ap.parse_args(argv)
    if args.case:
        print(json.dumps(run_case(args.impl, args.case, args.device)), flush=True)
        return 0
    for case in CASES:
        proc = subprocess.run([sys.executable, "-m", "dcp_a2a.testing.adapters.vllm_defects",
                               "--impl", args.impl, "--case", case, "--device", args.device],
                              capture_output=True, text=True, timeout=600)
        v = _verdict(case, proc)
        print(json.dumps(v) if args.json else describe(v), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
