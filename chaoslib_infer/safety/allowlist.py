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
starts (``chaos-infer gameday --target URL``: one line on stderr, exit 2). A host of wildcards
only (``*://*:*``) and a ``/0`` block are refused: they would allow everything. URLs with a
control character or whitespace are refused (:func:`check_url_chars`).

The allowlist is the operator's (CLI, environment, plan): a Kubernetes target file's own
``allow:`` can only narrow it (:func:`operator_k8s_allow` for contexts and namespaces; the
file's ``url`` must match these patterns like any other). The game day hands its patterns to
the experiments through configuration (``infer_allow``), never by changing ``os.environ``.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from chaoslib_infer.errors import ConfigError

__all__ = [
    "DEFAULT_ALLOW",
    "ENV_VAR",
    "Pattern",
    "allow_patterns",
    "check_name_glob",
    "check_target",
    "check_url_chars",
    "config_allow",
    "is_allowed",
    "operator_k8s_allow",
    "parse_pattern",
    "plan_allow",
]

ENV_VAR = "CHAOS_INFER_ALLOW"
K8S_CONTEXTS_ENV = "CHAOS_INFER_ALLOW_CONTEXTS"
K8S_NAMESPACES_ENV = "CHAOS_INFER_ALLOW_NAMESPACES"
#: configuration keys through which the game day hands its allowlists to experiments
CONFIG_KEY = "infer_allow"
CONFIG_CONTEXTS = "infer_allow_contexts"
CONFIG_NAMESPACES = "infer_allow_namespaces"
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
    if re.fullmatch(r"[*?.\[\]!]+", host):
        raise ConfigError(
            f"allow pattern {text!r}: a host of wildcards only would allow every target; "
            "name the hosts (a glob needs a literal part: *.corp.example)"
        )
    network = None
    bare = host.replace("[", "").replace("]", "")
    looks_ip = host.startswith("[") or re.fullmatch(r"[\d.]+(?:/\d{1,3})?", host) is not None
    if looks_ip:
        try:
            network = ipaddress.ip_network(bare, strict=False)
        except ValueError as exc:
            raise ConfigError(f"allow pattern {text!r}: {exc}") from None
        if network.prefixlen == 0:
            raise ConfigError(f"allow pattern {text!r}: a /0 block would allow every address")
        host = ""
    elif "/" in host:
        raise ConfigError(f"allow pattern {text!r}: a /prefix needs an IP address")
    return Pattern(raw, scheme, host.lower(), network, port)


def _split_env(value: str) -> list[str]:
    return [p for p in re.split(r"[,\s]+", value) if p]


def _plan_allow_doc(plan_path: Path | None) -> dict[str, list[str]]:
    """The plan's ``allow:``: a list of URL patterns, or ``{urls, contexts, namespaces}``.

    Raises:
        ConfigError: ``allow`` (or one of its lists) is not a list of strings.
    """
    if plan_path is None:
        return {}
    try:
        raw = yaml.safe_load(Path(plan_path).read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return {}  # the plan loader reports unreadable plans
    if not isinstance(raw, dict) or raw.get("allow") is None:
        return {}
    allow = raw["allow"]
    if isinstance(allow, list):
        allow = {"urls": allow}
    if not isinstance(allow, dict) or set(allow) - {"urls", "contexts", "namespaces"}:
        raise ConfigError(
            f"{plan_path}: allow: expected a list of SCHEME://HOST[:PORT] patterns, or a mapping "
            "with urls:, contexts:, namespaces: lists"
        )
    out: dict[str, list[str]] = {}
    for key, value in allow.items():
        if value is None:
            continue
        if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
            raise ConfigError(f"{plan_path}: allow.{key}: expected a list of strings")
        out[key] = list(value)
    return out


def plan_allow(plan_path: Path | None) -> list[str]:
    """The plan's URL patterns: ``allow:`` as a list, or its ``urls:`` (empty without one).

    Raises:
        ConfigError: ``allow`` is malformed.
    """
    return _plan_allow_doc(plan_path).get("urls", [])


def config_allow(configuration: dict[str, Any] | None) -> list[str]:
    """URL patterns the game day handed to an experiment (configuration ``infer_allow``).

    The game day passes its operator-owned patterns (``--allow``, the plan's) this way, never by
    changing the process environment. A comma/space separated string or a list.
    """
    value = (configuration or {}).get(CONFIG_KEY)
    if isinstance(value, str):
        return _split_env(value)
    if isinstance(value, list | tuple):
        return [str(v) for v in value if v]
    return []


def check_name_glob(pattern: str, what: str) -> str:
    """Refuse a context/namespace allowlist glob that matches everything (``*``, ``?*``).

    Raises:
        ConfigError: one line naming ``what`` (e.g. ``allow.contexts``) and the pattern.
    """
    if not pattern or re.fullmatch(r"[*?\[\]!]+", pattern):
        raise ConfigError(
            f"{what}: {pattern!r} would allow every name; list the names (or a glob with a "
            "literal part, e.g. kind-*)"
        )
    return pattern


def operator_k8s_allow(
    configuration: dict[str, Any] | None = None,
    plan_path: Path | None = None,
    contexts: tuple[str, ...] | list[str] = (),
    namespaces: tuple[str, ...] | list[str] = (),
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The operator's Kubernetes allowlist: ``(contexts, namespaces)`` globs.

    Sources, all owned by whoever runs the tool (never the target file, which can only narrow
    them): ``contexts``/``namespaces`` (CLI), ``$CHAOS_INFER_ALLOW_CONTEXTS`` /
    ``$CHAOS_INFER_ALLOW_NAMESPACES`` (comma/space separated), the plan's ``allow: {contexts,
    namespaces}`` and the configuration keys ``infer_allow_contexts`` / ``infer_allow_namespaces``
    (how the game day hands them to its experiments).

    Raises:
        ConfigError: a bare ``*`` (or another match-everything glob), or a malformed plan list.
    """
    doc = _plan_allow_doc(plan_path)
    cfg = configuration or {}
    out: list[tuple[str, ...]] = []
    for kind, env, key, cli in (
        ("contexts", K8S_CONTEXTS_ENV, CONFIG_CONTEXTS, contexts),
        ("namespaces", K8S_NAMESPACES_ENV, CONFIG_NAMESPACES, namespaces),
    ):
        raw = cfg.get(key)
        from_cfg = _split_env(raw) if isinstance(raw, str) else list(raw or [])
        pats = [*_split_env(os.environ.get(env, "")), *doc.get(kind, []), *from_cfg, *cli]
        out.append(tuple(dict.fromkeys(check_name_glob(p, f"allow {kind}") for p in pats)))
    return out[0], out[1]


def allow_patterns(
    cli: tuple[str, ...] | list[str] = (),
    plan_path: Path | None = None,
    configuration: dict[str, Any] | None = None,
) -> list[Pattern]:
    """The effective allowlist: defaults + ``CHAOS_INFER_ALLOW`` + plan ``allow:`` + ``--allow``
    + the configuration's ``infer_allow`` (:func:`config_allow`).

    Raises:
        ConfigError: a malformed pattern (from any source; the message says which).
    """
    texts = [*DEFAULT_ALLOW, *_split_env(os.environ.get(ENV_VAR, "")), *plan_allow(plan_path)]
    texts += [*cli, *config_allow(configuration)]
    return [parse_pattern(t) for t in texts]


#: ASCII control characters and whitespace: never part of a URL we send (request smuggling)
_CONTROL = re.compile(r"[\x00-\x20\x7f]")


def check_url_chars(url: str) -> None:
    """Refuse a URL with a control character or whitespace (CR/LF would split a request line).

    Raises:
        ConfigError: one line naming the first offending character (the URL shown escaped).
    """
    bad = _CONTROL.search(url)
    if bad:
        raise ConfigError(
            f"URL {url!r}: control character or space {bad.group()!r} at position "
            f"{bad.start()}; refusing it"
        )


def _split_url(url: str) -> tuple[str, str, int]:
    check_url_chars(url)
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
    url: str,
    cli: tuple[str, ...] | list[str] = (),
    plan_path: Path | None = None,
    configuration: dict[str, Any] | None = None,
    what: str = "target",
) -> None:
    """Refuse ``url`` unless the effective allowlist (:func:`allow_patterns`) matches it.

    Every outbound HTTP client of the project calls this (or :func:`guard_url`) before its
    first request: the load client, the metrics scraper, the Prometheus probe, the preflight.

    Args:
        what: how the message names the URL (``target``, ``metrics URL``, ``prometheus URL``).

    Raises:
        ConfigError: one line: the URL is outside the allowlist (and how to allow it), has a
            control character, or the URL or a pattern is malformed.
    """
    patterns = allow_patterns(cli, plan_path, configuration)
    if not is_allowed(url, patterns):
        scheme, host, port = _split_url(url)
        shown = f"[{host}]" if ":" in host else host
        raise ConfigError(
            f"{what} {url} is outside the allowlist (default: loopback only); to reach it, "
            f"allow it explicitly: --allow {scheme}://{shown}:{port} (or {ENV_VAR}, or the "
            "plan's allow: list)"
        )
