"""Moving the trainer's weights into SGLang servers: disk, tensor buckets, process group.

Three ways, all ending with the server's radix (prefix) cache flushed and its
``weight_version`` set to the policy's version:

* ``disk``: the trainer writes a Hugging Face directory (into a temporary folder,
  renamed into place only when complete, so a server never reads a half-written
  checkpoint) and each server reloads it (``/update_weights_from_disk``). Works
  everywhere, also for servers on other machines with a shared file system; a
  server restarted after a crash starts from the newest directory.
* ``tensor``: named tensors in buckets of ``bucket_mb`` through
  ``/update_weights_from_tensor``, inside ``/begin_weight_update`` ...
  ``/end_weight_update``. CUDA tensors travel as CUDA IPC handles (colocated
  servers on the same GPUs, zero copy); CPU tensors travel as pickled bytes in the
  HTTP body.
* ``distributed``: one process group (NCCL / HCCL on accelerators, gloo on CPU)
  with the trainer as rank 0 and every server's tensor-parallel ranks after it;
  ``/update_weights_from_distributed`` announces names, dtypes and shapes of a
  bucket and the trainer broadcasts the tensors. For servers on other GPUs or nodes.
"""

from __future__ import annotations

import base64
import io
import pickle
from collections.abc import Iterable, Iterator
from datetime import timedelta

import torch

WEIGHT_SYNC_MODES = ("disk", "tensor", "distributed")


# -- buckets ----------------------------------------------------------------------
def buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group ``(name, tensor)`` pairs, in order, into lists of at most ``bucket_bytes``.

    A tensor larger than ``bucket_bytes`` forms a bucket of its own.
    """
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def serialize_bucket(bucket: list[tuple[str, torch.Tensor]]) -> str:
    """Base64 text of a bucket in the form ``/update_weights_from_tensor`` unpickles.

    CUDA tensors are pickled with ``ForkingPickler`` (CUDA IPC handles: the
    server maps the trainer's memory, so the trainer must keep the tensors alive
    until the request returns). CPU tensors are pickled by value, so no shared
    memory outlives the call.
    """
    if any(t.is_cuda for _, t in bucket):
        from multiprocessing.reduction import ForkingPickler

        buf = io.BytesIO()
        ForkingPickler(buf).dump([(n, t.detach()) for n, t in bucket])
        raw = buf.getvalue()
    else:
        raw = pickle.dumps([(n, t.detach().contiguous()) for n, t in bucket])
    return base64.b64encode(raw).decode("ascii")


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (what SGLang's distributed update expects)."""
    return str(dtype).removeprefix("torch.")


# -- process group ---------------------------------------------------------------
class TrainerProcessGroup:
    """The trainer's end (rank 0) of a weight-broadcast group shared with SGLang servers.

    It is a separate group, independent of the trainer's own default group, joined
    through a TCP rendezvous at ``master_address:master_port`` under the name
    ``group_name`` (each server joins through ``/init_weights_update_group`` with
    the same address, name and backend).

    Args:
        master_address: address of this (trainer) host, reachable from the servers.
        master_port: free TCP port on that host.
        world_size: 1 + the servers' tensor-parallel ranks in total.
        group_name: SGLang's group name (also the rendezvous key prefix).
        backend: ``nccl`` | ``hccl`` | ``gloo`` (CPU).
        timeout_s: rendezvous and collective timeout.
    """

    def __init__(
        self,
        master_address: str,
        master_port: int,
        world_size: int,
        group_name: str,
        backend: str,
        timeout_s: float = 600.0,
    ) -> None:
        from torch.distributed import distributed_c10d as c10d

        timeout = timedelta(seconds=timeout_s)
        store, rank, _ = next(
            c10d.rendezvous(f"tcp://{master_address}:{master_port}", 0, world_size, timeout=timeout)
        )
        store.set_timeout(timeout)
        # Same store layout as the servers' side: keys prefixed by the group name.
        prefixed = c10d.PrefixStore(group_name, store)
        self.group, _ = c10d._new_process_group_helper(
            world_size,
            rank,
            [],
            c10d.Backend(backend),
            prefixed,
            group_name=group_name,
            backend_options=None,
            timeout=timeout,
        )
        c10d._world.pg_group_ranks[self.group] = {i: i for i in range(world_size)}
        self.group_name = group_name
        self.backend = backend

    def broadcast(self, tensors: list[torch.Tensor]) -> None:
        """Send ``tensors`` (in order) from rank 0 to every server rank."""
        handles = [
            torch.distributed.broadcast(t, src=0, group=self.group, async_op=True) for t in tensors
        ]
        for h in handles:
            h.wait()

    def close(self) -> None:
        """Destroy the group (the servers destroy theirs via ``/destroy_weights_update_group``)."""
        if self.group is not None:
            torch.distributed.destroy_process_group(self.group)
            self.group = None
