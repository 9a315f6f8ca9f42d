"""A correct implementation that takes every freedom the contract leaves, all at once: the
self-check runs it beside the reference contract, and the conformance tier must pass it. It is
the guard against a suite that goes red on correct code (at a8d327e it failed 29 conformance
tests: refusals worded otherwise, the group validated first, masked rows zeroed; each of those
tests was fixed to judge what the contract says).

Where it differs from :class:`dcp_a2a.reference.contract.ReferenceContract`:

* refusals in other words: "cannot be split evenly", "head dim", "fp8", "double precision", and a
  ``TypeError`` for a dtype that is not floating point;
* a group of one returns its inputs themselves (without masks, for a float32 LSE);
* strided ``out``/``lse`` refused with a ValueError naming them; a float64 LSE converted by
  value (the reference refuses it);
* the group validated first: ``device_group`` must be a ``torch.distributed.ProcessGroup`` of the
  group's size in which this process has ``rank_in_group`` (a ``TypeError`` otherwise);
* masked rows sent with zeroed output lanes (the contract leaves them unspecified);
* the exchange with explicit (even) split sizes;
* the merge in float32 throughout: weights e^{s_n - max} left unnormalised, accumulated in
  reverse rank order with fused multiply-adds, the sum of the weights divided out last (the
  scope's second form in tolerances.yaml; its accumulator overflows before |y| could);
* results returned as non-contiguous views.

    dcp-a2a self-check --correct dcp_a2a.testing.freedoms --no-mutants
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..reference.combine import sanitize_lse
from ..reference.contract import ReferenceContract


class Freedoms(ReferenceContract):
    # ------------------------------------------------------------ refusals in other words
    def lse_pack_dim(self, dtype):
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"expected a torch.dtype, got {type(dtype).__name__}")
        if not dtype.is_floating_point:
            raise TypeError(f"the attention output must be floating point, not {dtype}")
        if dtype.itemsize == 1:
            raise ValueError(f"fp8 outputs ({dtype}) have no packed wire format")
        if dtype == torch.float64:
            raise ValueError(f"double precision outputs ({dtype}) are not supported")
        return super().lse_pack_dim(dtype)

    def check_heads(self, num_heads, world_size):
        if isinstance(world_size, int) and world_size > 0 and num_heads % world_size:
            raise ValueError(f"{num_heads} heads cannot be split evenly over {world_size} "
                             "ranks")
        return super().check_heads(num_heads, world_size)

    def pack_send(self, out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim,
                  seq_lens=None, query_start_loc=None):
        if (isinstance(out, torch.Tensor) and out.dim() == 3 and isinstance(head_dim, int)
                and head_dim != out.shape[2]):
            raise ValueError(f"head dim {head_dim} is not the output's last dim "
                             f"{out.shape[2]}")
        super().pack_send(out, lse, send, world_size, h_per_rank, head_dim, lse_pack_dim,
                          seq_lens, query_start_loc)

    # ------------------------------------------------------------ what it takes as input
    def check_out_lse(self, out, lse):
        """Strided out/lse refused (its kernels would index contiguous rows); a float64 LSE
        taken and converted by value (``lse_to_fp32``)."""
        if isinstance(out, torch.Tensor) and isinstance(lse, torch.Tensor):
            for name, t in (("out", out), ("lse", lse)):
                if not t.is_contiguous():
                    raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")
            if lse.dtype == torch.float64:
                lse = lse.to(torch.float32)
        return super().check_out_lse(out, lse)

    # ------------------------------------------------------------ the group, first
    def check_group(self, group):
        n, r = super().check_group(group)
        if n > 1:
            pg = group.device_group
            if not isinstance(pg, dist.ProcessGroup):
                raise TypeError("group.device_group must be a torch.distributed.ProcessGroup, "
                                f"got {type(pg).__name__}")
            if (pg.size(), pg.rank()) != (n, r):
                raise ValueError(f"device_group is rank {pg.rank()} of {pg.size()}, the group "
                                 f"says rank {r} of {n}")
        return n, r

    # ------------------------------------------------------------ a group of one: its inputs
    def lse_reduce(self, out, lse, group, *, return_lse=False, is_lse_base_on_e=True,
                   seq_lens=None, query_start_loc=None):
        n, _ = self.check_group(group)
        plain = seq_lens is None and query_start_loc is None
        if (n == 1 and plain and isinstance(lse, torch.Tensor) and lse.dtype == torch.float32
                and isinstance(return_lse, bool) and isinstance(is_lse_base_on_e, bool)):
            self.check_out_lse(out, lse)
            return (out, lse) if return_lse else out  # the very tensors, as engines pass them
        return super().lse_reduce(out, lse, group, return_lse=return_lse,
                                  is_lse_base_on_e=is_lse_base_on_e, seq_lens=seq_lens,
                                  query_start_loc=query_start_loc)

    # ------------------------------------------------------------ masked rows zeroed
    def _pack(self, out, lse, send, world_size, hpr, D, seq_lens, query_start_loc):
        super()._pack(out, lse, send, world_size, hpr, D, seq_lens, query_start_loc)
        empty = self.empty_rows(out.shape[0], seq_lens, query_start_loc, out.device)
        # masked_fill, not boolean indexing: no host sync, so it can be captured in a graph
        send[..., :D].masked_fill_(empty[None, :, None, None], 0)

    # ------------------------------------------------------------ explicit even splits
    def exchange(self, send, group):
        if group.world_size == 1:
            return send
        recv = torch.empty_like(send)
        split = [send.shape[0] // group.world_size] * group.world_size
        dist.all_to_all_single(recv, send, split, split, group=group.device_group)
        return recv

    # ------------------------------------------------------------ fp32, divided last, reversed
    def merge_weights(self, lses, is_lse_base_on_e):
        """Unnormalised float32 weights e^{fl(s_n - m)} and g = m + log(sum) in float32: the
        sum is divided out after the accumulation (``weighted_sum``)."""
        s = sanitize_lse(lses).to(torch.float32)
        m = s.amax(dim=0)
        m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        e = (torch.exp if is_lse_base_on_e else torch.exp2)(s - m_safe)
        total = e.sum(dim=0)
        ok = total > 0
        log = torch.log if is_lse_base_on_e else torch.log2
        g = torch.where(ok, m_safe + log(torch.where(ok, total, torch.ones_like(total))),
                        torch.full_like(m, float("-inf")))
        return e, g

    def weighted_sum(self, w, data):
        """sum_n e_n o_n in float32, ranks in reverse order with fused multiply-adds, then
        divided by sum_n e_n (the accumulator can overflow where |y| cannot: see tolerances.yaml,
        ``overflow``)."""
        x, w32 = data.to(torch.float32), w.to(torch.float32)
        acc = torch.zeros(x.shape[1:], dtype=torch.float32, device=x.device)
        for n in reversed(range(x.shape[0])):
            wn = w32[n][..., None].expand_as(x[n])
            term = torch.where(wn > 0, x[n], torch.zeros_like(x[n]))  # weight 0: nothing in
            acc = torch.addcmul(acc, wn, term)
        total = w32.sum(dim=0)[..., None]
        ok = total > 0
        y = torch.where(ok, acc / torch.where(ok, total, torch.ones_like(total)),
                        torch.zeros_like(acc))
        return y.to(torch.float64)

    # ------------------------------------------------------------ non-contiguous results
    def _combine(self, recv, head_dim, return_lse, is_lse_base_on_e):
        out, g = super()._combine(recv, head_dim, True, is_lse_base_on_e)
        out = out.transpose(0, 1).contiguous().transpose(0, 1)
        g = g.t().contiguous().t()
        return (out, g) if return_lse else out


IMPL = Freedoms()
lse_pack_dim, pack_send, unpack_combine, lse_reduce = IMPL.functions()
