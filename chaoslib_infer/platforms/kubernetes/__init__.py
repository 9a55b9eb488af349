"""Kubernetes platform: run the drills against a real cluster with the official ``kubernetes`` client.

- :mod:`.target`: the target file (context, namespace, selector, container, URL, allowlist);
- :mod:`.pods`: pod selection, simultaneous deletion, krkn-style recovery timings;
- :mod:`.quota`: ResourceQuota / Deployment cut and byte-for-byte restore;
- :mod:`.nodes`: cordon, drain through the Eviction API (PDB 429s reported), uncordon;
- :mod:`.network`: netem through an ephemeral container with ``NET_ADMIN``.

Every call goes through :func:`call`, which reads the raw JSON answer (``_preload_content=False``,
so objects are plain dicts exactly as the API server sent them, and the client's model classes
never reject a field) and turns an :class:`~kubernetes.client.ApiException` into a one-line
:class:`K8sError` naming the verb, the object and the cause (403 missing permission, 404 absent
object, 429 refused eviction, 409 conflict).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from chaoslib_infer.errors import InferChaosError
from chaoslib_infer.safety.redact import clip

__all__ = [
    "REQUEST_TIMEOUT_S",
    "K8sError",
    "api_error_line",
    "call",
    "call_bytes",
    "clients",
    "request_json",
]

#: Per-request timeout (connect, read) in seconds for every API call the actions make.
REQUEST_TIMEOUT_S = (5.0, 20.0)


class K8sError(InferChaosError):
    """An expected Kubernetes API failure; ``status`` is the HTTP code (0 when none)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def _status_message(body: Any) -> str:
    try:
        doc = json.loads(body) if isinstance(body, (str, bytes)) else None
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        msg = str(doc.get("message") or doc.get("reason") or "")
        causes = (doc.get("details") or {}).get("causes") or []
        extra = "; ".join(str(c.get("message")) for c in causes if c.get("message"))
        return f"{msg} ({extra})" if extra else msg
    return clip(str(body or "").strip().splitlines()[0], 300) if body else ""


def api_error_line(status: int, what: str, body: Any) -> str:
    """One line describing a failed API call.

    Args:
        status: HTTP status code of the answer.
        what: the attempted operation, e.g. ``"delete pod llm/vllm-0"``.
        body: the answer body (a Kubernetes ``Status`` JSON document, or text).

    Returns:
        ``"<what>: <cause>: <API message>"``.
    """
    message = _status_message(body)
    cause = {
        401: "not authenticated (check the kubeconfig user / token)",
        403: "permission denied (apply deploy/rbac.yaml to the service account or user)",
        404: "not found",
        409: "conflict (the object changed meanwhile)",
        429: "refused (a PodDisruptionBudget allows no disruption now)",
    }.get(status, f"HTTP {status}")
    return f"{what}: {cause}: {message}" if message else f"{what}: {cause}"


def call_bytes(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bytes:
    """Call one client method and return the raw answer body, exactly the bytes the server sent.

    Args:
        what: the operation in words, used in the error line (``"patch node gpu-a"``).
        fn: a bound method of ``CoreV1Api``/``AppsV1Api``... ; ``_preload_content=False`` and
            the request timeout :data:`REQUEST_TIMEOUT_S` are added.
        *args, **kwargs: passed to ``fn``.

    Returns:
        The body (bytes; empty when none).

    Raises:
        K8sError: the API answered an error status (one line, see :func:`api_error_line`) or
            could not be reached.
    """
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT_S)
    try:
        resp = fn(*args, _preload_content=False, **kwargs)
    except ApiException as exc:
        status = int(exc.status or 0)
        raise K8sError(api_error_line(status, what, exc.body), status) from None
    except (HTTPError, OSError) as exc:
        raise K8sError(f"{what}: API server unreachable: {exc}") from None
    return bytes(resp.data or b"")


def call(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Like :func:`call_bytes`, but returns the decoded JSON answer (a dict, or None when empty).

    Raises:
        K8sError: see :func:`call_bytes`; an answer that is not JSON.
    """
    data = call_bytes(what, fn, *args, **kwargs)
    try:
        return json.loads(data) if data else None
    except ValueError:
        raise K8sError(f"{what}: the API server answered something that is not JSON") from None


def request_json(
    api_client: Any, what: str, method: str, path: str, body: dict[str, Any] | None = None
) -> Any:
    """Send ``body`` as-is (JSON) to ``path`` and return the decoded answer.

    The typed client methods validate a dict body against their model class first, which rewrites
    it (timestamps reformatted, unknown fields dropped); a restore that must put back exactly the
    stored object goes through here instead, with the client's own authentication and TLS.

    Args:
        api_client: ``kubernetes.client.ApiClient``.
        what: the operation in words (error line).
        method: HTTP method. path: API path (``/api/v1/namespaces/llm/resourcequotas/q``).
        body: JSON body.

    Raises:
        K8sError: error status or unreachable server (one line).
    """
    from urllib3.exceptions import HTTPError

    request = api_client.param_serialize(
        method,
        path,
        header_params={"Content-Type": "application/json", "Accept": "application/json"},
        body=body,
        auth_settings=["BearerToken"],
    )
    try:
        resp = api_client.call_api(*request, _request_timeout=REQUEST_TIMEOUT_S)
        resp.read()
    except (HTTPError, OSError) as exc:
        raise K8sError(f"{what}: API server unreachable: {exc}") from None
    if not 200 <= resp.status <= 299:
        raise K8sError(api_error_line(resp.status, what, resp.data), resp.status)
    return json.loads(resp.data) if resp.data else None


def clients(kubeconfig: str | None, context: str | None) -> Any:
    """An ``ApiClient`` for ``context`` of ``kubeconfig``, or the in-cluster config.

    In-cluster configuration (the pod's service account) is used when ``kubeconfig`` is None, no
    ``KUBECONFIG`` / ``~/.kube/config`` exists and ``KUBERNETES_SERVICE_HOST`` is set.

    Raises:
        K8sError: no usable configuration (one line).
    """
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    path = kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    try:
        if (
            kubeconfig is None
            and not os.path.exists(path)
            and os.environ.get("KUBERNETES_SERVICE_HOST")
        ):
            cfg = client.Configuration()
            config.load_incluster_config(client_configuration=cfg)
            return client.ApiClient(cfg)
        return config.new_client_from_config(config_file=path, context=context)
    except (ConfigException, OSError, ValueError) as exc:
        raise K8sError(f"kubeconfig {path}: {str(exc).splitlines()[0]}") from None
