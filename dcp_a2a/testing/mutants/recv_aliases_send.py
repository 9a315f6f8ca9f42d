"""Aliasing: the all_to_all receives into its own send buffer (one staging buffer where two are needed), so a rank's slices are overwritten by its peers' while the collective still reads them."""

import torch.distributed as dist

from dcp_a2a.reference.contract import ReferenceContract


class Mutant(ReferenceContract):
    def exchange(self, send, group):
        if group.world_size == 1:
            return send
        dist.all_to_all_single(send, send, group=group.device_group)  # recv is send
        return send


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
