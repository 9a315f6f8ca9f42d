"""The Triton kernels and their launchers (private: they trust their input).

    pack.py        partial + LSE -> wire buffer (and the masked LSE for the unpacked paths)
    combine.py     wire buffer -> merged heads; the AG+RS weighting step
    merge_math.py  device-side math every kernel shares: row masks, the LSE merge, bf16 bits
    tuning.py      the launch table (block sizes, warps) per problem shape

The public entry points (:func:`dcp_a2a.pack_send`, :func:`dcp_a2a.unpack_combine`,
:func:`dcp_a2a.lse_reduce`) check their arguments once and call these.
"""
