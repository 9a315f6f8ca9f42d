"""Silent truncation: the pack checks only the send buffer's last dim and writes the rows and peer slices that out has, so a send buffer sized for another batch or group goes out with rows nobody wrote (or, in a kernel, is overrun)."""

from dcp_a2a.reference.contract import ReferenceContract


class Mutant(ReferenceContract):
    def check_wire(self, name, buf, head_dim, lse_pack_dim, dtype=None, shape=None):
        return super().check_wire(name, buf, head_dim, lse_pack_dim, dtype=dtype)

    def _pack(self, out, lse, send, world_size, hpr, D, seq_lens, query_start_loc):
        B = out.shape[0]
        super()._pack(out, lse, send[:world_size, :B, :hpr], world_size, hpr, D, seq_lens,
                      query_start_loc)


lse_pack_dim, pack_send, unpack_combine, lse_reduce = Mutant().functions()
