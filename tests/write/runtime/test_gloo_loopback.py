"""A spawned single-machine gloo job talks over loopback whatever the host name resolves to:
with the host name set to this machine's LAN address (in a UTS namespace of its own), every
TCP socket of both ranks is on 127.0.0.1, none on the LAN (gloo follows the host name
otherwise, and its pairs have no authentication)."""
from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.write.runtime.test_store_loopback import my_socket_inodes

ROOT = Path(__file__).resolve().parents[3]


def _lan_address() -> str | None:
    """This host's outgoing IPv4 address (a UDP connect sends nothing), None without one."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.254", 9))
        addr = s.getsockname()[0]
    except OSError:
        return None
    finally:
        s.close()
    return None if addr.startswith("127.") else addr


def tcp_local_addresses(ctx) -> list[str]:
    """Rank body: one all-reduce (every gloo pair connected), then the local address of every
    TCP socket this process holds, from the kernel's table."""
    import torch
    import torch.distributed as dist
    t = torch.ones(4)
    dist.all_reduce(t)
    mine = my_socket_inodes()
    out = []
    for line in Path("/proc/self/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[9] in mine:
            out.append(socket.inet_ntop(socket.AF_INET, bytes.fromhex(f[1].split(":")[0])[::-1]))
    for line in Path("/proc/self/net/tcp6").read_text().splitlines()[1:]:
        f = line.split()
        if f[9] in mine:  # each 32-bit word in host (little-endian) order
            raw = struct.pack(">4I", *struct.unpack("<4I", bytes.fromhex(f[1].split(":")[0])))
            v6 = ipaddress.IPv6Address(raw)
            out.append(str(v6.ipv4_mapped or v6))
    return sorted(set(out))


JOB = ("import json; from dpcore.write.runtime.launch import launch; "
       "from tests.write.runtime.test_gloo_loopback import tcp_local_addresses; "
       "print(json.dumps(launch(tcp_local_addresses, 2, backend='gloo', timeout_s=120)))")


def test_a_spawned_gloo_job_uses_loopback_when_the_host_name_is_a_lan_address():
    lan = _lan_address()
    if lan is None or shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs a LAN address and root for a UTS namespace (unshare -u)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GLOO_", "TP_"))}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(["unshare", "-u", "sh", "-c", 'hostname "$1" && exec "$2" -c "$3"', "sh",
                          lan, sys.executable, JOB], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    per_rank = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(per_rank) == 2 and all(per_rank), per_rank
    assert all(addrs == ["127.0.0.1"] for addrs in per_rank), per_rank
