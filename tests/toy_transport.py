"""A transport that is not torch.distributed's point-to-point: tensors travel as bytes through the
process group's key-value store. It exists to show the runtime's transport seam (one new file, one
registry line: see tests/test_plugins.py); it is slow and for tests only."""

from __future__ import annotations

import datetime
from collections import Counter

import torch
import torch.distributed as dist

from schedc.runtime.comm import Pending, TransferFailed, Transport


class StoreTransport(Transport):
    def __init__(self, group, timeout, stopped, *, threaded, release_on_caller=False):
        self.store = dist.distributed_c10d._get_default_store()
        self.rank, self.timeout = dist.get_rank(group), timeout
        self.sent, self.received = Counter(), Counter()  # per peer: messages so far (their order matches)
        self.sends = 0

    def send(self, tensor: torch.Tensor, peer: int, tag) -> None:
        key = f"toy/{self.rank}->{peer}/{self.sent[peer]}"
        self.sent[peer] += 1
        self.store.set(key, tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        self.sends += 1

    def recv(self, buffer: torch.Tensor, peer: int, tag) -> Pending:
        key = f"toy/{peer}->{self.rank}/{self.received[peer]}"
        self.received[peer] += 1
        return Pending((buffer, key), peer)

    def wait(self, pending: Pending, tag) -> None:
        if not isinstance(pending.work, tuple):  # a collective's work (the gradient-norm all-reduce)
            pending.work.wait(datetime.timedelta(seconds=self.timeout))
            return
        buffer, key = pending.work
        try:
            self.store.wait([key], datetime.timedelta(seconds=self.timeout))
        except RuntimeError as e:
            raise TransferFailed(tag, pending.peer, str(e)) from None
        data = torch.frombuffer(bytearray(self.store.get(key)), dtype=torch.uint8)
        buffer.copy_(data.view(buffer.dtype).view(buffer.shape))
        self.store.delete_key(key)

    def flush(self) -> None:
        pass  # a send is done when store.set returns
