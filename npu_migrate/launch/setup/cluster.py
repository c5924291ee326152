"""What the host says about the job: host lists, addresses, interfaces, cores.

Which scheduler started the launcher, and what its variables say, is :mod:`.schedulers`.

Usage::

    expand_hostlist("node[01-02]-ib,gpu7")          # ['node01-ib', 'node02-ib', 'gpu7']
    is_local_address("10.0.0.1")                    # is it an address of this host?
    interface_for("10.0.0.1")                       # ('eth0', '10.0.0.2'): the way out to node 0
    node_cores()                                    # cores this process may run on

Nothing here imports torch: the launcher refuses bad input before its fork server loads it.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import re
import shutil
import socket
import struct
import subprocess

from npu_migrate.registry import DEVICES, HOST_FAMILY, by_backend

_HOST = DEVICES[HOST_FAMILY]
SOCKET_IFNAME_VARS = tuple(dict.fromkeys(
    [*_HOST.interface_env, *(name for spec in DEVICES.values() for name in spec.interface_env)]))
"""Variables that choose the network interface of a backend (each family's ``interface_env``, gloo's
first); one set by the user wins over ours."""

_SIOCGIFADDR = 0x8915
_BRACKETS = re.compile(r"\[([^\[\]]*)\]")


def _expand_one(host: str) -> list[str]:
    """``n[01-02,5]-ib`` -> ``n01-ib n02-ib n5-ib``; several bracket groups multiply."""
    match = _BRACKETS.search(host)
    if match is None:
        return [host]
    head, tail = host[: match.start()], host[match.end():]
    out: list[str] = []
    for part in match.group(1).split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo):
                raise ValueError(f"bad range {part!r} in host list entry {host!r}")
            width = len(lo)  # zero padding is kept: [08-10] -> 08 09 10
            values = [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
        elif part:
            values = [part]
        else:
            raise ValueError(f"empty item in host list entry {host!r}")
        for value in values:
            out.extend(_expand_one(head + value + tail))
    return out


def expand_hostlist(nodelist: str, use_scontrol: bool = True) -> list[str]:
    """Every host of a Slurm host list, in order.

    Uses ``scontrol show hostnames`` where Slurm is installed (it knows every form Slurm
    writes); otherwise expands ranges, lists, suffixes and zero padding itself.

    Raises:
        ValueError: a list this function cannot read.
    """
    if use_scontrol and shutil.which("scontrol"):
        try:
            result = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                                    text=True, timeout=30, check=True)
            hosts = result.stdout.split()
            if hosts:
                return hosts
        except (OSError, subprocess.SubprocessError):
            pass
    entries: list[str] = []
    depth = 0
    current = ""
    for char in nodelist.strip():
        if char == "," and depth == 0:
            entries.append(current)
            current = ""
            continue
        depth += (char == "[") - (char == "]")
        if depth < 0:
            raise ValueError(f"unbalanced ']' in host list {nodelist!r}")
        current += char
    if depth != 0:
        raise ValueError(f"unbalanced '[' in host list {nodelist!r}")
    entries.append(current)
    hosts = [host for entry in entries if entry.strip() for host in _expand_one(entry.strip())]
    if not hosts:
        raise ValueError(f"empty host list {nodelist!r}")
    return hosts


def _addresses_of(host: str) -> list[tuple[int, str]]:
    infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    seen: list[tuple[int, str]] = []
    for family, _, _, _, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6) and (family, sockaddr[0]) not in seen:
            seen.append((family, str(sockaddr[0])))
    return seen


def is_local_address(addr: str) -> bool:
    """Whether ``addr`` (an IP or a host name) is an address of this host: we can bind to it."""
    try:
        addresses = _addresses_of(addr)
    except (socket.gaierror, UnicodeError):
        return False
    for family, ip in addresses:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((ip, 0))
            except OSError:
                continue
            return True
    return False


def _ipv4_of_interface(name: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def _ipv6_interfaces() -> dict[str, str]:
    """Address -> interface, from /proc/net/if_inet6."""
    found: dict[str, str] = {}
    try:
        with open("/proc/net/if_inet6", encoding="ascii") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) >= 6:
                    found[str(ipaddress.IPv6Address(int(fields[0], 16)))] = fields[5]
    except OSError:
        pass
    return found


def interface_for(addr: str) -> tuple[str, str] | None:
    """The interface (and this host's address on it) that traffic to ``addr`` leaves by.

    Asks the kernel's routing table by connecting a UDP socket (nothing is sent), then finds
    which interface holds the local address it chose. None where that cannot be told.
    """
    try:
        family, ip = _addresses_of(addr)[0]
    except (socket.gaierror, UnicodeError, IndexError):
        return None
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect((ip, 9))
            local = str(sock.getsockname()[0])
        except OSError:
            return None
    if family == socket.AF_INET6:
        name = _ipv6_interfaces().get(str(ipaddress.IPv6Address(local.split("%")[0])))
        return (name, local) if name else None
    for _, name in socket.if_nameindex():
        if _ipv4_of_interface(name) == local:
            return name, local
    return None


def network_env(addr: str, backend: str, environ: dict[str, str], multi_node: bool = True) -> tuple[dict[str, str], str]:
    """The interface variables the workers need to reach ``addr``, and a phrase for the start-up line.

    Where the user set any of :data:`SOCKET_IFNAME_VARS`, nothing is added: their choice wins.
    Otherwise gloo (used by every family for CPU groups) and, across nodes, the family's own
    backend get the interface that reaches ``addr``. Without it, a host whose name resolves to
    127.0.0.1 advertises loopback to the other nodes and the job dies connecting its ranks. On
    one node NCCL and HCCL keep their own choice (they talk over NVLink/HCCS there).
    """
    given = [name for name in SOCKET_IFNAME_VARS if environ.get(name)]
    if given:
        return {}, f"interface from {', '.join(f'{n}={environ[n]}' for n in given)}"
    found = interface_for(addr)
    if found is None:
        return {}, "interface chosen by the backend"
    name, local = found
    env = {_HOST.interface_env[0]: name}
    family = by_backend(backend)
    if multi_node and family is not None and family.interface_env:
        env.setdefault(family.interface_env[0], name)
    return env, f"interface {name} ({local})"


def node_cores() -> int:
    """Cores this process may run on (its CPU affinity, as a container or Slurm limits it)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1
