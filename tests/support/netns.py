"""Separate machines for a test, as far as the network goes: Linux network namespaces on one
bridge (``ip netns``, veth pairs), each with its own address in 10.x and no route to the
host's loopback.

``NetLab`` owns one bridge (the host's side, ``lab.host_ip``: bind a server there to make it
reachable from every namespace) and the namespaces ``lab.add(name)`` creates, each with a veth
pair on the bridge; ``lab.popen(host, argv, …)`` starts a process inside one (``ip netns exec``)
in a session of its own; ``lab.partition(host)`` cuts one off the bridge for a while, the
processes in it still running. ``net_lab(tag)`` yields a lab and always tears it down (every process
started in it killed, the namespaces and the bridge deleted), even when the test fails; a
kernel or a user that cannot make namespaces (not root, no ``ip``, ``ip netns add`` refused in
an unprivileged container) skips the test with the reason ``ip`` gave.

``ip`` is iproute2's (``tests/support/iproute2/install.sh`` installs it on a fresh machine).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

__all__ = ["NetHost", "NetLab", "net_lab"]

#: Interface names are at most 15 bytes (IFNAMSIZ - 1).
_IFNAMSIZ = 15


@dataclass(frozen=True)
class NetHost:
    """One namespace: its name (for ``ip netns exec``), its address on the lab's bridge and
    the host's end of its veth pair (the bridge port ``NetLab.cut`` takes down)."""

    namespace: str
    ip: str
    port: str


@dataclass
class NetLab:
    """A bridge ``bridge`` with ``host_ip`` on it (the host's side), in subnet ``prefix``.0/24,
    and the namespaces added to it."""

    tag: str
    prefix: str  # "10.A.B": the lab's /24
    bridge: str
    hosts: list[NetHost] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes] | subprocess.Popen[str]] = field(default_factory=list)

    @property
    def host_ip(self) -> str:
        """The host's address on the bridge: what servers bind for the namespaces to reach."""
        return f"{self.prefix}.1"

    def add(self, name: str) -> NetHost:
        """A new namespace with a veth pair on the bridge, address ``prefix.N/24``, its own
        loopback up and a default route through the host's side."""
        n = len(self.hosts) + 2
        outside, inside = f"{self.tag}h{n}", f"{self.tag}n{n}"
        host = NetHost(f"{self.tag}-{name}", f"{self.prefix}.{n}", outside)
        _ip("netns", "add", host.namespace)
        self.hosts.append(host)  # deleted at teardown from here on
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", outside, "master", self.bridge)
        _ip("link", "set", outside, "up")
        _ip("link", "set", inside, "netns", host.namespace)
        _ip("-n", host.namespace, "addr", "add", f"{host.ip}/24", "dev", inside)
        _ip("-n", host.namespace, "link", "set", inside, "up")
        _ip("-n", host.namespace, "link", "set", "lo", "up")
        _ip("-n", host.namespace, "route", "add", "default", "via", self.host_ip)
        return host

    def cut(self, host: NetHost) -> None:
        """Cut ``host`` off the network: its bridge port (the host's end of its veth) goes
        down, as a pulled cable or a failed switch port does. Inside, the link loses its
        carrier and keeps its address and routes, so its processes go on running and see
        what a partition shows: packets lost, connections that hang until TCP's
        retransmissions give up, new ones refused (``No route to host``) once ARP fails
        (about 3 s). Nothing is reset: ``heal`` brings the same connections back."""
        _ip("link", "set", host.port, "down")

    def heal(self, host: NetHost) -> None:
        """Reconnect ``host`` (``cut`` undone): its bridge port up again."""
        _ip("link", "set", host.port, "up")

    @contextlib.contextmanager
    def partition(self, host: NetHost) -> Iterator[None]:
        """``cut`` ``host`` for the block's duration; healed on the way out, also when the
        block raises."""
        self.cut(host)
        try:
            yield
        finally:
            self.heal(host)

    def popen(
        self,
        host: NetHost,
        argv: Sequence[str],
        *,
        env: dict[str, str],
        cwd: Path,
        log: Path,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside ``host``'s namespace with exactly ``env`` and ``cwd``, its
        output in ``log``; killed (its whole session) at teardown."""
        proc = subprocess.Popen(
            _inside(host, argv),
            env=env,
            cwd=cwd,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def spawn(
        self, host: NetHost, argv: Sequence[str], *, env: dict[str, str], cwd: Path
    ) -> subprocess.Popen[str]:
        """Start ``argv`` inside ``host``'s namespace with exactly ``env`` and ``cwd``, its
        stdout and stderr piped as text (read them with ``communicate``); killed (its whole
        session) at teardown."""
        proc = subprocess.Popen(
            _inside(host, argv),
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def run(
        self, host: NetHost, argv: Sequence[str], *, env: dict[str, str], cwd: Path, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in ``host``'s namespace to its end; its output captured as text."""
        return subprocess.run(
            _inside(host, argv), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
        )

    def close(self) -> None:
        """Kill what was started here (process groups, then whatever is still in a
        namespace), delete the namespaces (their veth ends go with them) and the bridge."""
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        for host in reversed(self.hosts):
            pids = subprocess.run(
                ["ip", "netns", "pids", host.namespace], capture_output=True, text=True
            ).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


def _inside(host: NetHost, argv: Sequence[str]) -> list[str]:
    """``argv`` as run inside ``host``'s namespace (``ip netns exec``)."""
    return [shutil.which("ip") or "ip", "netns", "exec", host.namespace, *argv]


def _ip(*args: str) -> None:
    """Run ``ip ARGS``; fail the test with ``ip``'s own message if it refuses."""
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")


def _refusal() -> str | None:
    """Why this process cannot make network namespaces, or None (tries one and deletes it)."""
    if shutil.which("ip") is None:
        return "no `ip` (iproute2): tests/support/iproute2/install.sh installs it"
    if os.geteuid() != 0:
        return "network namespaces need root (`ip netns add`)"
    probe = f"elprobe{os.getpid() % 100000}"
    result = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if result.returncode != 0:
        return f"the kernel refuses network namespaces: ip netns add: {result.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _free_prefix() -> str:
    """A 10.A.B /24 no interface of this machine uses (A from 200, B from this pid)."""
    used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    start = os.getpid() % 250
    for i in range(250 * 50):
        a, b = 200 + (start + i) // 250 % 50, (start + i) % 250 + 1
        prefix = f"10.{a}.{b}"
        if f" {prefix}." not in used:
            return prefix
    raise RuntimeError("no free 10.x /24 for the network lab")


@contextlib.contextmanager
def net_lab(tag: str) -> Iterator[NetLab]:
    """A ``NetLab`` whose names start with ``tag`` plus a per-process number (at most 4
    characters of tag); skips the test when namespaces cannot be made here; always torn
    down."""
    why = _refusal()
    if why is not None:
        pytest.skip(why)
    unique = f"{tag[:4]}{os.getpid() % 10000}"
    bridge = f"{unique}br"
    assert len(f"{unique}h99") <= _IFNAMSIZ and len(bridge) <= _IFNAMSIZ
    lab = NetLab(tag=unique, prefix=_free_prefix(), bridge=bridge)
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{lab.host_ip}/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        yield lab
    finally:
        lab.close()
