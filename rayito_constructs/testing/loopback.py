"""Loopback addresses and ports for the MicroVMs one machine hosts (``vm_host.py``).

Each emulated VM gets an address of its own in ``127.0.0.0/8`` (Linux routes the whole block to
``lo``: nothing to configure), so that every VM answers on the same ports, as every real VM's
endpoint answers on 443: the product's client dials ``<endpoint>:443`` (TLS) or
``<endpoint>:<TransportSettings.port>`` (plaintext, its documented test path), never a port
embedded in the endpoint (``normalize_endpoint`` would keep it and break the target).

* Addresses are never handed out twice by one process (a terminated VM's endpoint is still
  returned by GetMicrovm for 20 minutes: it must not reach a newer VM). Each process starts at
  an offset of its own in ``127.1.0.0``-``127.254.255.255`` and a taken address (another
  emulator, another xdist worker) is skipped: the sockets are bound here, and an address whose
  port is in use is left for the next one.
* Ports for the processes a VM runs (the agent host, its app) are chosen below the kernel's
  ephemeral range, where ``bind(0)`` never lands, and checked free by binding them once. The
  product's agent host binds the port it is told (``--port N``, ``0.0.0.0``), so the port must be
  chosen before it runs: the one window left is another process choosing the same port in the
  same instant (both of them outside the ephemeral range, so only another stand-in would).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import threading
from typing import Optional

#: 127.1.0.0 - 127.254.255.255: leaves 127.0.0.0/16 (127.0.0.1 and the usual test addresses) alone.
_FIRST = int(ipaddress.IPv4Address("127.1.0.0"))
_SPAN = 254 * 65536


class PortInUse(OSError):
    """An address/port pair is taken (by another process or emulator)."""


class Loopback:
    """Hands out loopback addresses with sockets bound on them, and free local ports."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._index = (os.getpid() * 7919) % _SPAN
        low, high = _ephemeral_range()
        self._port_low = 10_000 if low > 12_000 else 2_000
        self._port_high = low  # exclusive: never in the ephemeral range
        self._port_next = self._port_low + (os.getpid() * 131) % max(1, self._port_high - self._port_low)
        self._ports_given: set[int] = set()

    def address(self, ports: tuple[int, ...], *, listen: tuple[bool, ...]) -> tuple[str, list[socket.socket]]:
        """A fresh address with one TCP socket bound on each of ``ports`` (0: any free port, the
        same for no other address), listening or not (a bound socket that does not listen keeps
        the pair reserved and refuses connections: an endpoint nobody answers on). Raises
        ``PermissionError`` when a port needs privileges (443 without root)."""
        for _ in range(4096):
            with self._lock:
                address = self._next_address()
            sockets: list[socket.socket] = []
            try:
                for port, listens in zip(ports, listen, strict=True):
                    sockets.append(bind(address, port, listens))
                return address, sockets
            except PortInUse:
                for sock in sockets:
                    sock.close()
                continue
            except BaseException:
                for sock in sockets:
                    sock.close()
                raise
        raise OSError(errno.EADDRINUSE, "no free loopback address found in 4096 tries")

    def _next_address(self) -> str:
        while True:
            value = _FIRST + self._index % _SPAN
            self._index += 1
            last = value & 0xFF
            if last not in (0, 255):
                return str(ipaddress.IPv4Address(value))

    def local_port(self) -> int:
        """A port free on every address (``0.0.0.0``) right now, below the ephemeral range, not
        handed out before by this process."""
        span = self._port_high - self._port_low
        with self._lock:
            for _ in range(span):
                port = self._port_next
                self._port_next = self._port_low + (self._port_next + 1 - self._port_low) % span
                if port in self._ports_given:
                    continue
                try:
                    bind("0.0.0.0", port, False).close()
                except (PortInUse, PermissionError):
                    continue
                self._ports_given.add(port)
                return port
        raise OSError(errno.EADDRINUSE, f"no free local port in {self._port_low}-{self._port_high - 1}")


def bind(address: str, port: int, listens: bool) -> socket.socket:
    """A TCP socket bound on ``address:port`` (listening if ``listens``). ``PortInUse`` when the
    pair is taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # No SO_REUSEADDR: a pair another process holds, even in TIME_WAIT, counts as taken.
        sock.bind((address, port))
        if listens:
            sock.listen(256)
        return sock
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(exc.errno, f"{address}:{port} is in use") from None
        if exc.errno == errno.EACCES:
            raise PermissionError(
                exc.errno,
                f"cannot bind {address}:{port}: ports below "
                f"{_unprivileged_port_start()} need root (or lower net.ipv4.ip_unprivileged_port_start)",
            ) from None
        raise


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as handle:
            low, high = (int(part) for part in handle.read().split())
            return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _unprivileged_port_start() -> Optional[int]:
    try:
        with open("/proc/sys/net/ipv4/ip_unprivileged_port_start", encoding="ascii") as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return 1024
