"""run_local's key-value store listens on the loopback interface only."""

import sys
from pathlib import Path

import pytest

from schedc.runtime.launch import loopback_store


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
