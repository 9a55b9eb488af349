"""The Kubernetes target file: which cluster, namespace and pods a drill may touch.

Example (``target.yaml``)::

    kubeconfig: ~/.kube/config          # optional; default $KUBECONFIG or ~/.kube/config
    context: prod-eu-1                  # optional; default the kubeconfig's current context
    namespace: llm
    selector: app=vllm                  # label selector of the model-server pods
    container: vllm                     # container name inside those pods
    url: https://llm.example.com        # where traffic goes (Service, Ingress or gateway)
    deployment: vllm                    # optional: the Deployment owning the pods (quota-cut)
    quota: gpu-quota                    # optional: the ResourceQuota to cut (quota-cut)
    service: vllm                       # optional: the Service in front of the pods (observation:
                                        #   its EndpointSlices give the ready endpoints)
    hpa: vllm                           # optional: the HorizontalPodAutoscaler (KEDA: keda-hpa-<name>)
                                        #   of the Deployment (traffic-spike; found by its
                                        #   scaleTargetRef when absent)
    allow:
      contexts: [prod-eu-1, "kind-*"]   # fnmatch globs
      namespaces: [llm, "llm-*"]

The allowlist is mandatory: a target whose (resolved) context or namespace is not listed is
refused before any API call with one :class:`~chaoslib_infer.errors.ConfigError` line, which the
CLI prints before exiting with status 2 (``python -m chaoslib_infer.platforms.kubernetes.target
FILE`` checks a file the same way).
"""

from __future__ import annotations

import fnmatch
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from chaoslib_infer.errors import ConfigError
from chaoslib_infer.safety.allowlist import check_name_glob

__all__ = ["K8sTarget", "check_allowed", "effective_context", "load_target", "main", "preflight"]

_KEYS = {
    "kubeconfig",
    "context",
    "namespace",
    "selector",
    "container",
    "url",
    "deployment",
    "quota",
    "service",
    "hpa",
    "allow",
}

# Service names are DNS-1035 labels; HPA names DNS-1123 subdomains (Kubernetes object names).
_NAME_RULES = {
    "service": (re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$"), 63, "a DNS-1035 label"),
    "hpa": (re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"), 253, "a DNS-1123 subdomain"),
}

# url: http(s)://host[:port][/path] (host: DNS name, IPv4 or [IPv6]); no query or fragment.
_URL = re.compile(
    r"^https?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?)(:\d{1,5})?(/[^\s?#]*)?$"
)
# Label keys: [prefix/]name (DNS-1123 subdomain prefix, name <= 63); values <= 63, may be empty.
_LKEY = r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_LVAL = r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?"
_SEL_TERM = re.compile(
    rf"^(!?{_LKEY}|{_LKEY}\s*(=|==|!=)\s*{_LVAL}"
    rf"|{_LKEY}\s+(in|notin)\s+\(\s*{_LVAL}(\s*,\s*{_LVAL})*\s*\))$"
)


def _selector_ok(selector: str) -> bool:
    """Whether ``selector`` parses as a Kubernetes label selector (equality- and set-based terms,
    comma-separated; grammar of k8s.io/apimachinery ``labels.Parse``)."""
    terms, depth, cur = [], 0, ""
    for ch in selector:
        depth += (ch == "(") - (ch == ")")
        if depth < 0 or depth > 1:
            return False
        if ch == "," and depth == 0:
            terms.append(cur.strip())
            cur = ""
        else:
            cur += ch
    terms.append(cur.strip())
    return depth == 0 and all(_SEL_TERM.match(t) for t in terms)


def _check_kubeconfig(kubeconfig: str, context: str | None, source: str) -> None:
    """Refuse a named kubeconfig that is unreadable or lacks the context (no API call).

    Raises:
        ConfigError: one line naming the file and the kubeconfig.
    """
    try:
        doc = yaml.safe_load(Path(kubeconfig).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{source}: kubeconfig {kubeconfig}: {exc.strerror}") from None
    except yaml.YAMLError:
        raise ConfigError(f"{source}: kubeconfig {kubeconfig}: not valid YAML") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: kubeconfig {kubeconfig}: not a kubeconfig (a mapping)")
    names = {c.get("name") for c in doc.get("contexts") or [] if isinstance(c, dict)}
    wanted = context or doc.get("current-context")
    if not wanted:
        raise ConfigError(f"{source}: kubeconfig {kubeconfig} has no current-context; set context:")
    if wanted not in names:
        raise ConfigError(
            f"{source}: context {wanted!r} is not in kubeconfig {kubeconfig} "
            f"(contexts: {', '.join(sorted(str(n) for n in names)) or 'none'})"
        )


@dataclass(frozen=True)
class K8sTarget:
    """A validated Kubernetes target (see the module docstring for the file format)."""

    namespace: str
    selector: str
    container: str
    url: str
    context: str | None = None  # None: the kubeconfig's current context
    kubeconfig: str | None = None  # None: $KUBECONFIG, ~/.kube/config or in-cluster
    deployment: str | None = None
    quota: str | None = None
    service: str | None = None  # observation: EndpointSlices labelled kubernetes.io/service-name
    hpa: str | None = None  # traffic-spike: the HPA to watch (None: found by its scaleTargetRef)
    allow_contexts: tuple[str, ...] = field(default_factory=tuple)
    allow_namespaces: tuple[str, ...] = field(default_factory=tuple)
    source: str = "<target>"


def _resolve_context(kubeconfig: str | None) -> str | None:
    """The current context of the kubeconfig, or None when running in-cluster / no kubeconfig."""
    path = kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    try:
        doc = yaml.safe_load(Path(path).expanduser().read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return None
    current = doc.get("current-context") if isinstance(doc, dict) else None
    return str(current) if current else None


def effective_context(target: K8sTarget) -> str:
    """The kubeconfig context ``target`` acts in: its own ``context``, else the kubeconfig's
    current context, else ``"in-cluster"`` (no kubeconfig: the service account's cluster).
    This is the name the allowlists are checked against and the evidence records."""
    return target.context or _resolve_context(target.kubeconfig) or "in-cluster"


def check_allowed(
    target: K8sTarget,
    configuration: dict[str, Any] | None = None,
    plan_path: str | Path | None = None,
) -> None:
    """Refuse a target whose context or namespace is outside its allowlist or the operator's.

    The context checked is the resolved one (the kubeconfig's current context when the file names
    none; ``in-cluster`` when there is no kubeconfig). It must match the file's ``allow:`` *and*
    the operator's allowlist (:func:`chaoslib_infer.safety.allowlist.operator_k8s_allow`:
    ``$CHAOS_INFER_ALLOW_CONTEXTS`` / ``$CHAOS_INFER_ALLOW_NAMESPACES``, the plan's ``allow:``,
    the game day's configuration): a target file narrows the operator's list, never widens it.

    Raises:
        ConfigError: one line naming the file, the refused value and the allowlist; or no
            operator allowlist at all (nothing is allowed by default).
    """
    from chaoslib_infer.safety.allowlist import (
        K8S_CONTEXTS_ENV,
        K8S_NAMESPACES_ENV,
        operator_k8s_allow,
    )

    context = effective_context(target)
    if not any(fnmatch.fnmatchcase(context, pat) for pat in target.allow_contexts):
        raise ConfigError(
            f"{target.source}: context {context!r} is not in the allowlist "
            f"(allow.contexts: {', '.join(target.allow_contexts) or 'empty'}); refusing to touch it"
        )
    if not any(fnmatch.fnmatchcase(target.namespace, pat) for pat in target.allow_namespaces):
        raise ConfigError(
            f"{target.source}: namespace {target.namespace!r} is not in the allowlist "
            f"(allow.namespaces: {', '.join(target.allow_namespaces) or 'empty'}); refusing to touch it"
        )
    op_contexts, op_namespaces = operator_k8s_allow(
        configuration, Path(plan_path) if plan_path else None
    )
    for kind, value, pats, env in (
        ("context", context, op_contexts, K8S_CONTEXTS_ENV),
        ("namespace", target.namespace, op_namespaces, K8S_NAMESPACES_ENV),
    ):
        if not pats:
            raise ConfigError(
                f"{target.source}: no operator allowlist for Kubernetes {kind}s (set ${env} or "
                f"the plan's allow: {kind}s:); a target file can narrow it, never grant it"
            )
        if not any(fnmatch.fnmatchcase(value, pat) for pat in pats):
            raise ConfigError(
                f"{target.source}: {kind} {value!r} is not in the operator's allowlist "
                f"({', '.join(pats)}; ${env} or the plan's allow:); refusing to touch it"
            )


def _str(doc: dict[str, Any], key: str, source: str, required: bool = True) -> str | None:
    value = doc.get(key)
    if value is None or value == "":
        if required:
            raise ConfigError(f"{source}: missing required field {key!r}")
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{source}: field {key!r} must be a string, got {type(value).__name__}")
    return value


def _object_name(doc: dict[str, Any], key: str, source: str) -> str | None:
    """Optional field ``key`` holding a Kubernetes object name (validated by :data:`_NAME_RULES`)."""
    value = _str(doc, key, source, required=False)
    pattern, limit, what = _NAME_RULES[key]
    if value is not None and (len(value) > limit or not pattern.match(value)):
        raise ConfigError(f"{source}: field {key!r} must be {what} (a {key} name), got {value!r}")
    return value


def load_target(
    path: str | Path,
    check: bool = True,
    configuration: dict[str, Any] | None = None,
    plan_path: str | Path | None = None,
) -> K8sTarget:
    """Read and validate a target file.

    Args:
        path: the YAML target file.
        check: also enforce the allowlists (:func:`check_allowed`: the file's and the
            operator's, from the environment, ``plan_path``'s ``allow:`` and ``configuration``).

    Returns:
        The :class:`K8sTarget`.

    Raises:
        ConfigError: unreadable or malformed file, unknown or missing field, a url that is not
            http(s)://host[:port][/path], a selector that is not a label selector, empty
            allowlist, a context/namespace outside the allowlist, or a named kubeconfig that is
            unreadable or lacks the context (one line naming the file and field; no API call).
    """
    source = str(path)
    try:
        doc = yaml.safe_load(Path(path).expanduser().read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read target file: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: a target file is a mapping (namespace, selector, ...)")
    unknown = sorted(set(doc) - _KEYS)
    if unknown:
        raise ConfigError(
            f"{source}: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(_KEYS))}"
        )
    allow = doc.get("allow")
    if not isinstance(allow, dict):
        raise ConfigError(f"{source}: missing 'allow:' with 'contexts:' and 'namespaces:' lists")
    lists: dict[str, tuple[str, ...]] = {}
    for key in ("contexts", "namespaces"):
        value = allow.get(key)
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(v, str) and v for v in value)
        ):
            raise ConfigError(f"{source}: allow.{key} must be a non-empty list of names or globs")
        for v in value:
            check_name_glob(v, f"{source}: allow.{key}")
        lists[key] = tuple(value)
    kubeconfig = _str(doc, "kubeconfig", source, required=False)
    url = str(_str(doc, "url", source))
    if not _URL.match(url):
        raise ConfigError(
            f"{source}: field 'url' must be http(s)://host[:port][/path], got {url!r}"
        )
    selector = str(_str(doc, "selector", source))
    if not _selector_ok(selector):
        raise ConfigError(
            f"{source}: field 'selector' is not a Kubernetes label selector "
            f"(e.g. app=vllm or 'app in (vllm,sglang)'), got {selector!r}"
        )
    if kubeconfig:
        kubeconfig = str(Path(kubeconfig).expanduser())
    target = K8sTarget(
        namespace=str(_str(doc, "namespace", source)),
        selector=selector,
        container=str(_str(doc, "container", source)),
        url=url.rstrip("/"),
        context=_str(doc, "context", source, required=False),
        kubeconfig=kubeconfig,
        deployment=_str(doc, "deployment", source, required=False),
        quota=_str(doc, "quota", source, required=False),
        service=_object_name(doc, "service", source),
        hpa=_object_name(doc, "hpa", source),
        allow_contexts=lists["contexts"],
        allow_namespaces=lists["namespaces"],
        source=source,
    )
    if kubeconfig and not os.path.isfile(kubeconfig):  # before the allowlist: not "in-cluster"
        raise ConfigError(f"{source}: kubeconfig {kubeconfig}: no such file")
    if check:
        check_allowed(target, configuration, plan_path)
    if kubeconfig:  # after the allowlist: a refused context is named as such
        _check_kubeconfig(kubeconfig, target.context, source)
    return target


def preflight(target: K8sTarget) -> None:
    """One cheap API call before a real run starts anything: list at most one target pod.

    ``list pods`` in the target namespace is granted by deploy/rbac.yaml, so an unreachable API
    server, bad credentials or a missing grant refuse the run before any load is sent.

    Raises:
        ConfigError: one line (unusable kubeconfig, unreachable server, error status).
    """
    from chaoslib_infer.platforms.kubernetes import K8sError, clients, request_json

    try:
        api = clients(target.kubeconfig, target.context)
        request_json(
            api,
            f"preflight: list pods {target.selector} in namespace {target.namespace}",
            "GET",
            f"/api/v1/namespaces/{target.namespace}/pods?limit=1",
        )
    except K8sError as exc:
        raise ConfigError(f"{target.source}: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    """``python -m chaoslib_infer.platforms.kubernetes.target FILE``: validate a target file.

    Returns:
        0 (prints the resolved target) or 2 (prints the one-line refusal on stderr).
    """
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(
            "usage: python -m chaoslib_infer.platforms.kubernetes.target TARGET.yaml",
            file=sys.stderr,
        )
        return 2
    try:
        target = load_target(args[0])
    except ConfigError as exc:
        print(f"chaos-infer: {exc}", file=sys.stderr)
        return 2
    context = effective_context(target)
    print(
        f"target ok: context {context}, namespace {target.namespace}, pods {target.selector}, "
        f"container {target.container}, url {target.url}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
