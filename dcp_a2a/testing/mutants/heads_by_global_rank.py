"""Group contract: an all-gather exchange picks this rank's heads by its global rank (torch.distributed.get_rank()) instead of its rank in the DCP group, right only for groups made of global ranks 0..n-1."""

import torch
import torch.distributed as dist

from dcp_a2a.reference.contract import ReferenceContract


class Mutant(ReferenceContract):
    def exchange(self, send, group):
        if group.world_size == 1:
            return send
        # every rank's whole send buffer, then the slices addressed to "me"
        gathered = [torch.empty_like(send) for _ in range(group.world_size)]
        dist.all_gather(gathered, send, group=group.device_group)
        # the bug: the global rank (engines always have a default group; a simulated group may not)
        me = dist.get_rank() if dist.is_initialized() else group.rank_in_group
        me = min(me, group.world_size - 1)
        return torch.stack([g[me] for g in gathered])


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
