"""run_local's key-value store and the ranks' own listeners are on the loopback interface only."""

import gc
import os
import socket
import sys
from pathlib import Path

import pytest

from schedc.runtime.launch import loopback_store, run_local


def listening(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp{,6} write them) listening on ``port``."""
    found = set()
    for name in ("tcp", "tcp6"):
        path = Path("/proc/net") / name
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].rsplit(":", 1)
            if int(hex_port, 16) == port and fields[3] == "0A":  # 0A: LISTEN
                found.add(address)
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/net")
def test_the_store_listens_on_the_loopback_only():
    store, listener = loopback_store(1)
    with listener:
        store.set("k", "v")
        assert store.get("k") == b"v"
        assert listening(store.port) == {"0100007F"}  # 127.0.0.1, and no wildcard address


def test_a_store_that_outlives_its_socket_closes_no_other_descriptor():
    """The TCPStore closes the descriptor it was given when it is destroyed; a caught RankFailed
    keeps run_local's store alive past its socket, whose number the next run's socket may reuse:
    destroying the store then must not close that socket (it did: the next run failed closing it,
    "Bad file descriptor", on the ranks' successful end)."""
    store, listener = loopback_store(1)
    number = listener.fileno()
    listener.close()
    other = socket.socket()
    try:
        assert other.fileno() == number  # the lowest free number: the one the store was given
        del store
        gc.collect()
        os.fstat(other.fileno())  # still open
    finally:
        other.close()


def _own_listeners(rank: int, world: int) -> list[str]:
    """In a rank: the local addresses of every socket this process listens on (gloo's own)."""
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(1))  # the pairs between ranks are up
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for name in ("tcp", "tcp6"):
        for line in (Path("/proc/net") / name).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                found.append(fields[1].rsplit(":", 1)[0])
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_ranks_own_listeners_are_on_the_loopback_only():
    loopback = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1
    for listeners in run_local(_own_listeners, 2, timeout=120):
        assert listeners, "gloo listens for its peers; the probe found no listening socket"
        assert set(listeners) <= loopback, listeners
