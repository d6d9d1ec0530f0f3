"""Data-parallel ranks of one job: which share of each step a rank trains, and the collectives
that make the k-rank step equal the 1-process one.

Every rank builds the same components and draws the same global prompt batch; it keeps a
contiguous slice of whole groups (:meth:`Ranks.share`). What crosses ranks: the step's loss
normalisers and metric sums (:meth:`Ranks.sum`), the gradients (:meth:`Ranks.sum_gradients`),
the per-row statistics metrics are computed from (:meth:`Ranks.gather_rows`), so no metric
is ever a mean of per-rank means; with ``drop_zero_std_groups``, also the chosen groups' rows,
moved to the rank that trains them (:meth:`Ranks.exchange_objects`). With one rank every method
is the identity and nothing touches ``torch.distributed``.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist


def in_process_group() -> bool:
    """Whether this process is a rank the launcher started (a process group exists), even the
    only one; a plain process is not."""
    return dist.is_available() and dist.is_initialized()


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world_size: int = 1
    # Where collectives run: CPU for gloo, the rank's own GPU for NCCL.
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    # Ranks on each host, in host order, when they span hosts (global ranks follow host order);
    # empty when they all run on one machine.
    node_sizes: tuple[int, ...] = ()

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes records, samples, events and checkpoints."""
        return self.rank == 0

    def share(self, count: int) -> slice:
        """This rank's contiguous slice of ``count`` items (the spec makes it divide evenly)."""
        size = count // self.world_size
        return slice(self.rank * size, (self.rank + 1) * size)

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over ranks, in float64 so token counts stay exact."""
        return self._reduce(values, dist.ReduceOp.SUM)

    def max(self, values: list[float]) -> list[float]:
        return self._reduce(values, dist.ReduceOp.MAX)

    def any(self, flag: bool) -> bool:
        return bool(self.max([float(flag)])[0])

    def barrier(self) -> None:
        """Wait until every rank gets here (a one-number reduction, on the collectives' device)."""
        self.sum([0.0])

    def _reduce(self, values: list[float], op: dist.ReduceOp) -> list[float]:
        if self.world_size == 1:
            return [float(v) for v in values]
        buffer = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        dist.all_reduce(buffer, op=op)
        return buffer.tolist()

    def gather_rows(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's ``tensor`` (same shape on each) concatenated along dim 0 in rank order,
        i.e. in the row order of the 1-process batch."""
        if self.world_size == 1:
            return tensor
        local = tensor.detach().to(self.device).contiguous()
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(parts, local)
        return torch.cat(parts).to(tensor.device)

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's picklable ``obj``, in rank order."""
        if self.world_size == 1:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def exchange_objects(self, outgoing: list[Any]) -> list[Any]:
        """Personalised all-to-all: ``outgoing[r]`` (picklable, CPU tensors only) goes to rank
        ``r``; returns what each rank sent to this one, in rank order. Unlike
        :meth:`gather_objects`, a rank receives only what is meant for it."""
        if self.world_size == 1:
            return list(outgoing)
        payloads = [torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8) for obj in outgoing]
        sizes = torch.tensor([p.numel() for p in payloads], dtype=torch.long, device=self.device)
        incoming = torch.empty_like(sizes)
        dist.all_to_all_single(incoming, sizes)  # how many bytes each rank will send here
        received = torch.empty(int(incoming.sum()), dtype=torch.uint8, device=self.device)
        dist.all_to_all_single(
            received,
            torch.cat(payloads).to(self.device),
            output_split_sizes=incoming.tolist(),
            input_split_sizes=sizes.tolist(),
        )
        return [pickle.loads(part.cpu().numpy().tobytes()) for part in received.split(incoming.tolist())]

    def sum_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """All-reduce (sum) the gradients in one flat buffer: each rank's loss is already its share
        of the whole step's loss, so the sum is the 1-process gradient."""
        grads = [p.grad for p in params if p.grad is not None]
        if self.world_size == 1 or not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads]).to(self.device)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat = flat.to(grads[0].device)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()


SINGLE = Ranks()
