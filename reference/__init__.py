"""Pure-PyTorch reference for dcp_a2a: the float64 oracle, the wire format in torch views, and
a second, independent implementation of the contract (:mod:`.contract`). Installed as
``dcp_a2a.reference``; independent of the Triton code on purpose: nothing here uses the kernels
or any other module of dcp_a2a."""

from .combine import (combine_magnitude, logsumexp_oracle, lse_weighted_combine, mean_shift,
                      sanitize_lse, small_weight_magnitude, weight_total)
from .wire import lse_pack_dim, pack_send, unpack_combine

__all__ = [
    "combine_magnitude",
    "logsumexp_oracle",
    "lse_pack_dim",
    "lse_weighted_combine",
    "mean_shift",
    "pack_send",
    "sanitize_lse",
    "small_weight_magnitude",
    "unpack_combine",
    "weight_total",
]
