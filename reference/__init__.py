"""Pure-PyTorch reference for dcp_a2a: a float64 oracle and a second implementation of the
wire format. Independent of the Triton code on purpose: nothing here imports ``dcp_a2a``."""

from .combine import combine_magnitude, lse_weighted_combine, logsumexp_oracle, sanitize_lse
from .simulate import simulate_lse_reduce
from .wire import lse_pack_dim, pack_send, unpack_combine

__all__ = [
    "combine_magnitude",
    "logsumexp_oracle",
    "lse_pack_dim",
    "lse_weighted_combine",
    "pack_send",
    "sanitize_lse",
    "simulate_lse_reduce",
    "unpack_combine",
]
