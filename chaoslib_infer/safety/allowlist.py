"""Blast radius: the targets a game day may send traffic (and faults) to.

A target URL is allowed when one pattern of the allowlist matches its scheme, host and port.
Pattern syntax: ``SCHEME://HOST[:PORT]``

- ``SCHEME``: ``http``, ``https`` or ``*`` (either);
- ``HOST``: a host name (``api.example.com``, case-insensitive), a glob (``*.internal``), an IP
  address (``10.0.0.7``, ``[fd00::1]``) or a CIDR block (``10.0.0.0/8``, ``[fd00::]/8``); host
  names are never resolved (``evil.example`` pointing at 127.0.0.1 is not loopback);
- ``PORT``: a number or ``*``; omitted means the scheme's default port (80 / 443).

The default allowlist is loopback only (:data:`DEFAULT_ALLOW`). Extend it with ``--allow PATTERN``
(repeatable), the environment variable ``CHAOS_INFER_ALLOW`` (patterns separated by commas or
spaces) or the plan's top-level ``allow:`` list. A target outside it is refused before anything
starts (``chaos-infer gameday --target URL``: one line on stderr, exit 2).
"""

from __future__ import annotations

import fnmatch
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from chaoslib_infer.errors import ConfigError

__all__ = [
    "DEFAULT_ALLOW",
    "ENV_VAR",
    "Pattern",
    "allow_patterns",
    "check_target",
    "is_allowed",
    "parse_pattern",
    "plan_allow",
]

ENV_VAR = "CHAOS_INFER_ALLOW"
DEFAULT_ALLOW = ("*://127.0.0.0/8:*", "*://localhost:*", "*://[::1]:*")
_DEFAULT_PORTS = {"http": 80, "https": 443}
_PATTERN = re.compile(
    r"^(?P<scheme>\*|https?)://"
    r"(?P<host>\[[0-9A-Fa-f:.]+\](?:/\d{1,3})?|[^\s:/\[\]@]+(?:/\d{1,3})?)"
    r"(?::(?P<port>\d{1,5}|\*))?/?$"
)


@dataclass(frozen=True)
class Pattern:
    """One parsed allowlist entry."""

    text: str
    scheme: str  # "http" | "https" | "*"
    host: str  # lower-case name or glob; "" when ``network`` is set
    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None
    port: int | None  # None = any port

    def matches(self, scheme: str, host: str, port: int) -> bool:
        """True when ``scheme://host:port`` (host without brackets) falls under this pattern."""
        if self.scheme != "*" and self.scheme != scheme:
            return False
        if self.port is not None and self.port != port:
            return False
        if self.network is not None:
            try:
                addr = ipaddress.ip_address(host)
            except ValueError:
                return False
            return addr.version == self.network.version and addr in self.network
        return fnmatch.fnmatchcase(host.lower(), self.host)


def parse_pattern(text: str) -> Pattern:
    """Parse ``SCHEME://HOST[:PORT]`` (see the module docstring).

    Raises:
        ConfigError: malformed pattern (the message shows the expected form).
    """
    raw = text.strip()
    m = _PATTERN.match(raw)
    if not m:
        raise ConfigError(
            f"allow pattern {text!r}: expected SCHEME://HOST[:PORT], e.g. https://api.example.com:443 "
            "or http://10.0.0.0/8:*"
        )
    scheme = m["scheme"]
    host = m["host"]
    port_text = m["port"]
    if port_text is None:
        if scheme == "*":
            raise ConfigError(f"allow pattern {text!r}: with scheme '*' give a port (or ':*')")
        port: int | None = _DEFAULT_PORTS[scheme]
    elif port_text == "*":
        port = None
    else:
        port = int(port_text)
        if not 0 < port < 65536:
            raise ConfigError(f"allow pattern {text!r}: port {port} out of range")
    network = None
    bare = host.replace("[", "").replace("]", "")
    looks_ip = host.startswith("[") or re.fullmatch(r"[\d.]+(?:/\d{1,3})?", host) is not None
    if looks_ip:
        try:
            network = ipaddress.ip_network(bare, strict=False)
        except ValueError as exc:
            raise ConfigError(f"allow pattern {text!r}: {exc}") from None
        host = ""
    elif "/" in host:
        raise ConfigError(f"allow pattern {text!r}: a /prefix needs an IP address")
    return Pattern(raw, scheme, host.lower(), network, port)


def _split_env(value: str) -> list[str]:
    return [p for p in re.split(r"[,\s]+", value) if p]


def plan_allow(plan_path: Path | None) -> list[str]:
    """The plan's top-level ``allow:`` list (empty without one).

    Raises:
        ConfigError: ``allow`` is not a list of strings.
    """
    if plan_path is None:
        return []
    try:
        raw = yaml.safe_load(Path(plan_path).read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return []  # the plan loader reports unreadable plans
    if not isinstance(raw, dict) or raw.get("allow") is None:
        return []
    allow = raw["allow"]
    if not isinstance(allow, list) or not all(isinstance(a, str) for a in allow):
        raise ConfigError(f"{plan_path}: allow: expected a list of SCHEME://HOST[:PORT] patterns")
    return list(allow)


def allow_patterns(
    cli: tuple[str, ...] | list[str] = (), plan_path: Path | None = None
) -> list[Pattern]:
    """The effective allowlist: defaults + ``CHAOS_INFER_ALLOW`` + plan ``allow:`` + ``--allow``.

    Raises:
        ConfigError: a malformed pattern (from any source; the message says which).
    """
    texts = [*DEFAULT_ALLOW, *_split_env(os.environ.get(ENV_VAR, "")), *plan_allow(plan_path)]
    texts += list(cli)
    return [parse_pattern(t) for t in texts]


def _split_url(url: str) -> tuple[str, str, int]:
    try:
        parts = urlsplit(url.strip())
        scheme = parts.scheme.lower()
        host = parts.hostname or ""
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"target {url!r}: not a valid URL ({exc})") from None
    if scheme not in _DEFAULT_PORTS or not host:
        raise ConfigError(f"target {url!r}: expected an http:// or https:// URL with a host")
    return scheme, host, port if port is not None else _DEFAULT_PORTS[scheme]


def is_allowed(url: str, patterns: list[Pattern]) -> bool:
    """True when one of ``patterns`` matches ``url``.

    Raises:
        ConfigError: ``url`` is not an http(s) URL with a host.
    """
    scheme, host, port = _split_url(url)
    return any(p.matches(scheme, host, port) for p in patterns)


def check_target(
    url: str, cli: tuple[str, ...] | list[str] = (), plan_path: Path | None = None
) -> None:
    """Refuse ``url`` unless the effective allowlist (:func:`allow_patterns`) matches it.

    Raises:
        ConfigError: one line: the target is outside the allowlist (and how to allow it), or
            the URL or a pattern is malformed.
    """
    patterns = allow_patterns(cli, plan_path)
    if not is_allowed(url, patterns):
        scheme, host, port = _split_url(url)
        shown = f"[{host}]" if ":" in host else host
        raise ConfigError(
            f"target {url} is outside the allowlist (default: loopback only); to drill it, "
            f"allow it explicitly: --allow {scheme}://{shown}:{port} (or {ENV_VAR}, or the "
            "plan's allow: list)"
        )
