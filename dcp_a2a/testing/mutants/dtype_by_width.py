"""Dtype acceptance: lse_pack_dim keys on element width, so float8 and float64 outputs silently get the fp32 (P=1) layout instead of a ValueError."""

import torch

from dcp_a2a.reference.contract import ReferenceContract


class Mutant(ReferenceContract):
    def lse_pack_dim(self, dtype):
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"lse_pack_dim expects a torch.dtype, got {type(dtype).__name__}")
        return 2 if dtype.itemsize == 2 else 1


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
