"""Caller buffer ignored: into= is accepted and checked, but the merged result goes to a fresh tensor, which is returned; the caller's buffer (the attention layer's output) is never written."""

import dcp_a2a

lse_pack_dim, pack_send = dcp_a2a.lse_pack_dim, dcp_a2a.pack_send


def unpack_combine(recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e, into=None):
    if into is not None:  # the checks of a real into, then the bug: a fresh result
        dcp_a2a.wire.check_into(into, (recv.shape[1], recv.shape[2], head_dim), recv.dtype,
                                recv.device)
    return dcp_a2a.unpack_combine(recv, head_dim, lse_pack_dim, return_lse, is_lse_base_on_e)


def lse_reduce(out, lse, group, *, into=None, **kw):
    return dcp_a2a.lse_reduce(out, lse, group, **kw)
