"""One request as the lab's gateway logged it, whichever gateway it is.

HAProxy's log lines (:func:`chaoslib_infer.lab.haproxy.parse_request_log`) and nginx's ``G1``
lines (:func:`chaoslib_infer.lab.gateways.nginx.parse_line`) are read into the same entry, so the
ground truth and the drills' figures read one shape. Times follow HAProxy's log format
(``%Ts``, ``%Tw``, ``%Tc``, ``%Tr``, ``%Ta``, ``%Th``, ``%Ti``, ``%TR``; HAProxy configuration
manual, section 8.4 "Timing events").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "SERVERS_FILE",
    "RequestLogEntry",
    "gateway_retries",
    "parse_line",
    "parse_request_log",
    "read_servers",
    "upstream_tries",
]

#: nginx lab: address -> replica name, every address the upstream ever had (the log's server
#: names); written by :mod:`chaoslib_infer.lab.gateways`
SERVERS_FILE = "gateway-servers.json"


@dataclass(frozen=True)
class RequestLogEntry:
    """One HAProxy request log line."""

    accept_t: float  # unix seconds when HAProxy accepted the connection (keep-alive: end of previous request)
    server: str  # server name, "<NOSRV>" when none was chosen
    status: int  # HTTP status sent to the client (-1 if none)
    tw_ms: int  # time waiting in queues (-1 if never)
    tc_ms: int  # time to connect to the server (-1 if never)
    tr_ms: int  # server response-header time (-1 if never)
    ta_ms: int  # total active time
    bytes_read: int
    term_state: str
    retries: str
    request_id: str | None
    request: str
    th_ms: int = 0  # handshake time
    ti_ms: int = 0  # idle time before the request's first byte (keep-alive)
    trq_ms: int = 0  # %TR: time to receive the full request headers

    @property
    def request_t(self) -> float:
        """Unix time the request's first byte arrived (accept + handshake + keep-alive idle)."""
        return self.accept_t + (max(self.th_ms, 0) + max(self.ti_ms, 0)) / 1000.0

    @property
    def forwarded_t(self) -> float | None:
        """Unix time the request reached the server (request + receive + queue + connect), None if
        never. On a keep-alive connection ``%Ts`` is the end of the previous request, so the idle
        time must be added (HAProxy's timing events)."""
        if self.tw_ms < 0 or self.tc_ms < 0:
            return None
        return self.request_t + (max(self.trq_ms, 0) + self.tw_ms + self.tc_ms) / 1000.0


# --- HAProxy (haproxy-requests.log; the format is haproxy.LOG_FORMAT) ---------------------------
_LINE = re.compile(
    r"^(?P<t>\d+\.\d+) (?P<srv>\S+) (?P<st>-?\d+) (?P<tw>-?\d+) (?P<tc>-?\d+) (?P<tr>-?\d+) "
    r"(?P<ta>-?\d+) (?P<b>\d+) (?P<tsc>\S+) (?P<rc>\S+) \{(?P<rid>[^}]*)\} \"(?P<req>.*)\"(?: (?P<th>-?\d+) (?P<ti>-?\d+) (?P<trq>-?\d+))?$"
)


def parse_request_log(path: Path) -> list[RequestLogEntry]:
    """Parse ``haproxy-requests.log``; malformed lines are skipped.

    A lab whose gateway is nginx links this file to nginx's log (``G1`` lines, see
    :mod:`chaoslib_infer.lab.gateways.nginx`): those lines are read into the same entries
    (:func:`parse_line`).
    """
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    out: list[RequestLogEntry] = []
    names: dict[str, str] | None = None
    for line in text.splitlines():
        if line.startswith("G1 "):
            if names is None:
                names = read_servers(path.parent)
            entry = parse_line(line, names)
            if entry is not None:
                out.append(entry)
            continue
        m = _LINE.match(line.strip())
        if not m:
            continue
        out.append(
            RequestLogEntry(
                accept_t=float(m["t"]),
                server=m["srv"],
                status=int(m["st"]),
                tw_ms=int(m["tw"]),
                tc_ms=int(m["tc"]),
                tr_ms=int(m["tr"]),
                ta_ms=int(m["ta"]),
                bytes_read=int(m["b"]),
                term_state=m["tsc"],
                retries=m["rc"],
                request_id=m["rid"] or None,
                request=m["req"],
                th_ms=int(m["th"]) if m["th"] else 0,
                ti_ms=int(m["ti"]) if m["ti"] else 0,
                trq_ms=int(m["trq"]) if m["trq"] else 0,
            )
        )
    return out


# --- nginx (G1 lines; the format is gateways.nginx.LOG_FORMAT) --------------------------------
_G1 = re.compile(
    r'^G1 (?P<end>\d+\.\d+) (?P<rt>\d+\.\d+) (?P<st>\d+) "(?P<ua>[^"]*)" "(?P<us>[^"]*)" '
    r'"(?P<uc>[^"]*)" "(?P<uh>[^"]*)" "(?P<ur>[^"]*)" (?P<b>\d+) \{(?P<rid>[^}]*)\} "(?P<req>.*)"$'
)


def _last(field: str) -> str:
    """Last value of an nginx upstream list (``"a, b : c"``: retries and internal redirects)."""
    parts = [p.strip() for p in re.split(r"[,:]\s", field) if p.strip()]
    return parts[-1] if parts else "-"


def _ms(value: str) -> int:
    try:
        return int(round(float(value) * 1000))
    except ValueError:
        return -1


def read_servers(state_dir: Path) -> dict[str, str]:
    """``gateway-servers.json``: every upstream address the lab gave nginx -> replica name."""
    try:
        data = json.loads((Path(state_dir) / SERVERS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def parse_line(line: str, names: dict[str, str]) -> RequestLogEntry | None:
    """One ``G1`` line -> :class:`~chaoslib_infer.lab.requestlog.RequestLogEntry`, or None.

    ``server`` is the replica that answered last (``names`` maps addresses to replicas; an
    unknown address stays as it is, ``<NOSRV>`` when nginx reached none); ``retries`` is the
    number of upstream tries after the first; times in ms (``tw_ms`` 0: nginx has no queue).
    """
    m = _G1.match(line.strip())
    if not m:
        return None
    rt = float(m["rt"])
    addrs = [a.strip() for a in re.split(r"[,:]\s", m["ua"]) if a.strip() and a.strip() != "-"]
    last = addrs[-1] if addrs else None
    status = int(m["st"])
    term = "----"
    if status == 499:
        term = "CD--"
    elif status in (502, 504):
        term = "SH--" if status == 504 else "SC--"
    uc, uh = _ms(_last(m["uc"])), _ms(_last(m["uh"]))
    return RequestLogEntry(
        accept_t=float(m["end"]) - rt,
        server=names.get(last, last) if last else "<NOSRV>",
        status=status,
        tw_ms=0 if last else -1,
        tc_ms=uc if last else -1,
        tr_ms=uh,
        ta_ms=int(round(rt * 1000)),
        bytes_read=int(m["b"]),
        term_state=term,
        retries=str(max(0, len(addrs) - 1)),
        request_id=(m["rid"] if m["rid"] not in ("", "-") else None),
        request=m["req"],
    )


def gateway_retries(entries: list[RequestLogEntry], request_ids: set[str]) -> int:
    """Upstream tries after the first that the gateway made for ``request_ids`` (one drill's
    requests): the sum of the entries' ``retries`` (HAProxy's ``%rc``, ``+N`` when the request
    was redispatched to another server; nginx: tries after the first). A field that is no
    number (``-``) counts 0."""
    total = 0
    for e in entries:
        if e.request_id not in request_ids:
            continue
        text = e.retries.lstrip("+")
        total += int(text) if text.isdigit() else 0
    return total


def upstream_tries(line: str) -> tuple[str | None, list[str], list[str]]:
    """``(request id, upstream addresses tried, their statuses)`` of one ``G1`` line."""
    m = _G1.match(line.strip())
    if not m:
        return None, [], []
    addrs = [a.strip() for a in re.split(r"[,:]\s", m["ua"]) if a.strip()]
    sts = [a.strip() for a in re.split(r"[,:]\s", m["us"]) if a.strip()]
    rid = m["rid"] if m["rid"] not in ("", "-") else None
    return rid, addrs, sts
