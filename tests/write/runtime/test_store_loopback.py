"""The launcher's rendezvous store listens on loopback only (issue 25, item 3): a c10d store has
no authentication, and one listening on every interface lets anyone on the network read, write
or stall a job. Checked on a real 2-rank gloo job, from the kernel's own socket table."""
from __future__ import annotations

import os
import socket
import struct
import threading
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from dpcore.write.runtime import launch as launch_mod
from dpcore.write.runtime.launch import launch
from tests import workers

LISTEN = "0A"  # TCP state LISTEN in /proc/net/tcp*


def my_socket_inodes() -> set[str]:
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[8:-1])
    return out


def _address(hex_addr: str) -> str:
    """/proc/net/tcp's little-endian hex address as text (IPv4 or IPv6)."""
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = struct.unpack("<4I", raw)  # each 32-bit word is in host (little-endian) order
    return socket.inet_ntop(socket.AF_INET6, struct.pack(">4I", *words))


def listening_addresses() -> list[tuple[str, int]]:
    """(address, port) of every TCP socket this process listens on."""
    mine, out = my_socket_inodes(), []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == LISTEN and f[9] in mine:
                addr, port = f[1].split(":")
                out.append((_address(addr), int(port, 16)))
    return out


def test_listening_addresses_reads_the_kernel_table() -> None:
    """The checker itself, on sockets with known answers (so the real test can fail)."""
    anyv4 = socket.socket()
    anyv4.bind(("0.0.0.0", 0))
    anyv4.listen()
    lo = socket.socket()
    lo.bind(("127.0.0.1", 0))
    lo.listen()
    try:
        got = listening_addresses()
        assert ("0.0.0.0", anyv4.getsockname()[1]) in got
        assert ("127.0.0.1", lo.getsockname()[1]) in got
    finally:
        anyv4.close()
        lo.close()


def test_the_job_store_listens_on_loopback_only(tmp_path: Path) -> None:
    before = set(listening_addresses())
    result: dict = {}

    def run() -> None:
        try:
            result["out"] = launch(workers.wait_for_go, 2, args=(str(tmp_path),), timeout_s=60)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            result["error"] = exc
    t = threading.Thread(target=run)
    t.start()
    try:
        end = time.monotonic() + 60  # a generous bound for 2 ranks to start on a loaded machine
        while not (tmp_path / "ready").exists() and time.monotonic() < end and t.is_alive():
            time.sleep(0.05)
        assert (tmp_path / "ready").exists(), result
        during = set(listening_addresses()) - before
    finally:
        (tmp_path / "go").write_text("1")
        t.join(90)
    assert result.get("out") == [0, 1], result
    assert during, "the launcher's store was not found among this process's listening sockets"
    assert {addr for addr, _port in during} == {"127.0.0.1"}, during


def test_loopback_store_falls_back_to_the_legacy_server(monkeypatch) -> None:
    """torch 2.4's default (libuv) store server refuses a listening socket with
    NotImplementedError; the launcher then serves the same socket with the legacy server, and
    every later store of the process goes there directly (one refusal, not one per job).
    Simulated here on the installed torch by a TCPStore that refuses as 2.4's does."""
    real, calls = dist.TCPStore, []

    def old_store(*args, **kwargs):
        calls.append(kwargs.get("use_libuv", True))
        if kwargs.get("master_listen_fd") is not None and kwargs.get("use_libuv", True):
            raise NotImplementedError("The libuv TCPStore backend does not support initialization "
                                      "with an listen fd.")
        return real(*args, **kwargs)

    monkeypatch.setattr(dist, "TCPStore", old_store)
    monkeypatch.setattr(launch_mod, "_LIBUV_TAKES_LISTEN_FD", True)
    first = launch_mod.loopback_store(1, 30.0)
    first.set("k", "v")
    assert first.get("k") == b"v"
    second = launch_mod.loopback_store(1, 30.0)
    second.set("k", "w")
    assert second.get("k") == b"w" and first.get("k") == b"v"  # two stores, two sockets
    assert calls == [True, False, False]


def test_loopback_store_passes_other_refusals_on(monkeypatch) -> None:
    """Only the libuv server's refusal of the socket is retried: a legacy server that refuses
    too is the caller's error, not a loop."""
    def refusing(*args, **kwargs):
        raise NotImplementedError("no store here")

    monkeypatch.setattr(dist, "TCPStore", refusing)
    monkeypatch.setattr(launch_mod, "_LIBUV_TAKES_LISTEN_FD", True)
    with pytest.raises(NotImplementedError, match="no store here"):
        launch_mod.loopback_store(1, 30.0)
