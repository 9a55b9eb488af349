"""The lab's gateway: the process between the drills' client and the engine replicas.

``Lab.up(gateway=...)`` (plan ``lab: {gateway: nginx, gateway_config: my-nginx.conf}``,
``chaos-infer lab up --gateway nginx --gateway-config FILE``):

- ``haproxy`` (default): HAProxy with the project's settings, or with the user's haproxy.cfg
  (a Jinja2 template over the lab's replicas; the lab injects its runtime socket and request
  log: see :mod:`chaoslib_infer.lab.gateways.haproxy_user`);
- ``nginx``: Debian's nginx with the user's config (a full nginx.conf, server blocks or a
  location snippet, rendered as a Jinja2 template with the lab's replicas: see
  :mod:`chaoslib_infer.lab.gateways.nginx`) or the project's default; HAProxy keeps running off
  the client path as the lab's intent plane and health checker, and
  :mod:`chaoslib_infer.lab.gateways.sync` mirrors its server states into nginx's upstream;
- ``litellm``: LiteLLM's proxy (its own virtualenv) with the user's proxy config or the
  project's default, each deployment of its ``model_list`` reaching one replica through a
  HAProxy *lane* that ``gateway-sync`` keeps mirroring the intent plane into (see
  :mod:`chaoslib_infer.lab.gateways.litellm`).

Ground truth a gateway writes: ``gateway-requests.log`` (which replica served which request id
and when; ``haproxy-requests.log`` is a link to it, so every reader of the lab's request log
reads the gateway's), ``gateway-sync.jsonl`` (each upstream change and its reload) and
``gateway.json`` (name, config path, the config scrubbed of secrets, the binary's version).

The choice and its dispatch are :mod:`chaoslib_infer.lab.gateways.dispatch` (re-exported here);
this ``__init__`` holds no logic, and no module of the package imports it.
"""

from __future__ import annotations

from chaoslib_infer.lab.gateways.dispatch import GATEWAY_FILE as GATEWAY_FILE
from chaoslib_infer.lab.gateways.dispatch import GATEWAYS as GATEWAYS
from chaoslib_infer.lab.gateways.dispatch import GatewayError as GatewayError
from chaoslib_infer.lab.gateways.dispatch import check_choice as check_choice
from chaoslib_infer.lab.gateways.dispatch import describe as describe
from chaoslib_infer.lab.gateways.dispatch import figured as figured
from chaoslib_infer.lab.gateways.dispatch import gateway_of as gateway_of
from chaoslib_infer.lab.gateways.dispatch import precheck as precheck
from chaoslib_infer.lab.gateways.dispatch import record as record
from chaoslib_infer.lab.gateways.dispatch import redact_config as redact_config
from chaoslib_infer.lab.gateways.dispatch import start_programs as start_programs
from chaoslib_infer.lab.gateways.dispatch import write_litellm_config as write_litellm_config
from chaoslib_infer.lab.gateways.dispatch import write_nginx_config as write_nginx_config
