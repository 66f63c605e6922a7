"""What a sandboxed agent may reach over the network: the policy its proxy applies.

Design note: docs/security.md ("The agent sandbox", Network). An agent runs in its own network
namespace (only its own loopback) and reaches out only through the proxy the runner runs for it
(runs/runner/netproxy.py), which asks this policy twice: about the name the agent asked for,
before resolving it (a refused name is not even looked up), and about every address that name
resolved to, before connecting (DNS rebinding: a public name that resolves to 127.0.0.1).

The agent entry's `network` (runs/agents.py) chooses the mode:
- no key: public addresses only — never loopback, private (RFC 1918, ULA), link-local, CGNAT,
  multicast, reserved or unspecified addresses, their IPv4-in-IPv6 forms, this host's own
  addresses, nor the hosts of DATABASE_URL and REDIS_URL;
- `"all"`: the host's network as it is, unfiltered (unsafe: loopback services, the database);
- `[]`: no network at all (no proxy either);
- a list of `host[:port]`: those targets only. A host named exactly (a name or an address) is
  allowed whatever it resolves to, private included: the operator named it. A wildcard
  (`*.example.com`) allows only public addresses, as the default does.

Pure: no I/O; the proxy resolves names and says whether an address is this host's own.
"""

from __future__ import annotations

import enum
import ipaddress
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from urllib.parse import parse_qs, unquote, urlsplit

from runs.agents import NETWORK_ALL, parse_network_entry

Address = IPv4Address | IPv6Address

# The service's own stores: an agent must not reach them even where their address is public.
SERVICE_URLS = ("DATABASE_URL", "REDIS_URL")

CGNAT = IPv4Network("100.64.0.0/10")
ULA = IPv6Network("fc00::/7")
# IPv6 forms that carry an IPv4 address a gateway connects to: SIIT (RFC 6052 / 7915), the
# deprecated IPv4-compatible form, and NAT64's well-known prefix.
V4_TRANSLATED = IPv6Network("::ffff:0:0:0/96")
V4_COMPATIBLE = IPv6Network("::/96")
NAT64 = IPv6Network("64:ff9b::/96")


class Mode(enum.StrEnum):
    PUBLIC = "public"  # no `network` key: public addresses only
    ALL = "all"  # "all": the host's network, unfiltered
    NONE = "none"  # []: no network at all
    LISTED = "listed"  # only the listed targets


@dataclass(frozen=True)
class Rule:
    """One `network` entry: a name, `*.suffix`, or an address; any port when `port` is None."""

    host: str
    port: int | None = None
    address: Address | None = None

    @classmethod
    def parse(cls, entry: str) -> Rule:
        """ValueError for an entry runs/agents.py would not have accepted."""
        host, port = parse_network_entry(entry)
        literal = address_of(host)
        return cls(host=str(literal) if literal is not None else host, port=port, address=literal)

    @property
    def wildcard(self) -> bool:
        return self.host.startswith("*.")

    def matches(self, host: str, port: int) -> bool:
        """Whether a request for `host` (as `normalize_host` gives it) and `port` is this entry's."""
        if self.port is not None and port != self.port:
            return False
        if self.address is not None:
            return address_of(host) == self.address
        if self.wildcard:
            return host.endswith(self.host[1:])  # below the domain, never the domain itself
        return host == self.host


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str = ""  # why not, for the log and the agent's 403


ALLOWED = Verdict(True)


@dataclass(frozen=True)
class NetworkPolicy:
    mode: Mode
    rules: tuple[Rule, ...] = ()
    # The hosts of DATABASE_URL and REDIS_URL: names are refused as asked for, addresses as
    # connected to (the proxy adds the names' addresses at start: `with_denied_addresses`).
    denied_names: frozenset[str] = frozenset()
    denied_addresses: frozenset[Address] = frozenset()
    entries: tuple[str, ...] = field(default=(), compare=False)  # as the operator wrote them

    @property
    def unshare_net(self) -> bool:
        """Whether the agent gets a network namespace of its own (all but `"all"`)."""
        return self.mode is not Mode.ALL

    @property
    def proxied(self) -> bool:
        """Whether the agent reaches anything at all, through its proxy (not with `[]`)."""
        return self.mode in (Mode.PUBLIC, Mode.LISTED)

    def rule_for(self, host: str, port: int) -> Rule | None:
        return next((rule for rule in self.rules if rule.matches(host, port)), None)

    def check_name(self, host: str, port: int) -> Verdict:
        """Before resolving: may the agent ask for `host:port` at all?"""
        if self.mode is Mode.ALL:
            return ALLOWED
        host = normalize_host(host)
        if self.mode is Mode.NONE:
            return Verdict(False, "this agent has no network (network = [])")
        if self.mode is Mode.LISTED:
            rule = self.rule_for(host, port)
            if rule is None:
                return Verdict(False, "not in the agent's network list")
            if not rule.wildcard:
                return ALLOWED
        if host in self.denied_names:
            return Verdict(False, "a host of the service's database or Redis")
        return ALLOWED

    def check_address(self, host: str, port: int, address: Address, *, local: bool = False) -> Verdict:
        """Before connecting: may the agent's request for `host:port` go to `address`?

        `local`: the address is one of this host's own (its public address reaches the
        services listening on every interface).
        """
        name = self.check_name(host, port)
        if not name.allowed or self.mode is Mode.ALL:
            return name
        host = normalize_host(host)
        rule = self.rule_for(host, port) if self.mode is Mode.LISTED else None
        if rule is not None and not rule.wildcard:
            return ALLOWED  # named exactly by the operator: a local model server, say
        address = unmapped(address)
        if address in self.denied_addresses:
            return Verdict(False, f"{address} is a host of the service's database or Redis")
        why = private_reason(address)
        if why:
            return Verdict(False, f"{address} is {why}")
        if local:
            return Verdict(False, f"{address} is an address of this host")
        return ALLOWED

    def with_denied_addresses(self, addresses: Iterable[Address]) -> NetworkPolicy:
        return replace(self, denied_addresses=self.denied_addresses | {unmapped(a) for a in addresses})


def policy_for(network: str | Iterable[str] | None, environ: Mapping[str, str] = os.environ) -> NetworkPolicy:
    """The policy of an agent entry's `network` (AgentSpec.network), with the service's hosts denied."""
    if network == NETWORK_ALL:
        return NetworkPolicy(Mode.ALL)
    names: set[str] = set()
    addresses: set[Address] = set()
    for host in service_hosts(environ):
        literal = address_of(host)
        if literal is None:
            names.add(host)
        else:
            addresses.add(literal)
    if network is None:
        return NetworkPolicy(
            Mode.PUBLIC, denied_names=frozenset(names), denied_addresses=frozenset(addresses)
        )
    if isinstance(network, str):
        raise ValueError(f'network must be "all" or a list of "host[:port]" strings, got {network!r}')
    entries = tuple(network)
    if not entries:
        return NetworkPolicy(Mode.NONE)
    return NetworkPolicy(
        Mode.LISTED,
        tuple(Rule.parse(entry) for entry in entries),
        denied_names=frozenset(names),
        denied_addresses=frozenset(addresses),
        entries=entries,
    )


def service_hosts(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The hosts (normalized) of DATABASE_URL and REDIS_URL; Unix socket paths are no hosts."""
    hosts: list[str] = []
    for key in SERVICE_URLS:
        url = environ.get(key, "")
        if not url:
            continue
        parts = urlsplit(url)
        netloc = parts.netloc.rpartition("@")[2]
        # libpq takes several hosts (`h1:5432,h2:5433`) and a `host=` query parameter.
        candidates = [*netloc.split(","), *parse_qs(parts.query).get("host", [])]
        for candidate in candidates:
            host = unquote(candidate)
            if host.startswith("["):
                host = host[1:].partition("]")[0]
            elif host.count(":") == 1:
                host = host.partition(":")[0]
            if host and not host.startswith("/"):
                hosts.append(normalize_host(host))
    return hosts


def normalize_host(host: str) -> str:
    """A request's host as the policy compares it: lowercase, no trailing dot, no brackets,
    an address written canonically (an IPv4-mapped IPv6 address as its IPv4 address)."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    literal = address_of(host)
    return str(literal) if literal is not None else host.removesuffix(".")


def address_of(host: str) -> Address | None:
    """`host` as an address when it is one (canonical, unmapped), else None. Never resolves."""
    try:
        return unmapped(ipaddress.ip_address(host))
    except ValueError:
        return None


def unmapped(address: Address) -> Address:
    """An IPv4-mapped IPv6 address (`::ffff:127.0.0.1`) is the IPv4 address it maps to."""
    if isinstance(address, IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def embedded_ipv4(address: IPv6Address) -> IPv4Address | None:
    """The IPv4 address an IPv6 address carries to a translator or a tunnel, if any."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if any(address in net for net in (V4_TRANSLATED, NAT64)) or (
        address in V4_COMPATIBLE and int(address) > 1  # `::` and `::1` are themselves
    ):
        return IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def private_reason(address: Address) -> str:
    """Why `address` is not a public one ("" when it is): what the default refuses."""
    if isinstance(address, IPv6Address):
        inner = embedded_ipv4(address)
        if inner is not None:
            why = private_reason(inner)
            return f"{why} (as {inner})" if why else ""
    v6 = isinstance(address, IPv6Address)
    checks = (
        ("an unspecified address", address.is_unspecified),
        ("a loopback address", address.is_loopback),
        ("a link-local address", address.is_link_local),
        ("a shared (CGNAT, 100.64.0.0/10) address", not v6 and address in CGNAT),
        ("a unique local (fc00::/7) address", v6 and address in ULA),
        ("a site-local (fec0::/10) address", v6 and address.is_site_local),  # type: ignore[union-attr]
        ("a private address", address.is_private),
        ("a multicast address", address.is_multicast),
        ("a reserved address", address.is_reserved),
        ("not a globally reachable address", not address.is_global),
    )
    return next((what for what, hit in checks if hit), "")


def is_public(address: Address) -> bool:
    return private_reason(unmapped(address)) == ""
