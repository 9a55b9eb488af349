"""Keep secrets out of everything a run writes: journal, logs, records, evidence, summary.

The target's API key reaches the load generator through the environment only
(``CHAOS_INFER_API_KEY``; ``--api-key-file`` puts the file's content there for the run), never
through a command line (``ps``) or a file the run writes. Chaos Toolkit does not redact secrets
in ``journal.json`` or its log, and a target may echo a key in an error body that ends up in a
record, so the game day also scrubs the values it knows to be secret:

- on the fly, in the ``chaostoolkit.log`` handler (:class:`RedactingFilter`) and in progress lines;
- after each drill, every file of the drill folder (:func:`scrub_tree`), before the evidence is
  final; at the end of the game day the whole output folder, the lab's included (once it is down);
- ``chaos-infer report`` scrubs again (a run killed with SIGKILL never reached its final scrub).

Known secret values (:func:`known_secrets`): ``CHAOS_INFER_API_KEY``; the values of the
environment variables named in ``CHAOS_INFER_REDACT_ENV`` (comma-separated names); secrets an
experiment declares (inline values and ``type: env`` references); configuration entries of
``type: env`` whose name or variable looks secret (``key``, ``token``, ``secret``, ``password``).
Each value is replaced, as raw text, JSON-escaped and URL-encoded, by ``[REDACTED]``. Values shorter
than :data:`MIN_SECRET_LEN` characters are ignored (they would shred unrelated text).
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote

__all__ = [
    "API_KEY_ENV",
    "REDACTED",
    "RedactingFilter",
    "known_secrets",
    "read_key_file",
    "redact_text",
    "scrub_file",
    "scrub_tree",
    "secrets_from_experiment",
]

API_KEY_ENV = "CHAOS_INFER_API_KEY"
EXTRA_ENV = "CHAOS_INFER_REDACT_ENV"
REDACTED = "[REDACTED]"
MIN_SECRET_LEN = 6
MAX_FILE_BYTES = 512 << 20
_SECRETISH = re.compile(r"key|token|secret|passw", re.IGNORECASE)


def read_key_file(path: Path) -> str:
    """Read an API key file (first line, whitespace stripped).

    Raises:
        ValueError: unreadable or empty file, or a key shorter than :data:`MIN_SECRET_LEN`
            (one line, without the key).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(
            f"cannot read API key file {path}: {getattr(exc, 'strerror', None) or exc}"
        ) from None
    key = (text.strip().splitlines() or [""])[0].strip()
    if len(key) < MIN_SECRET_LEN:
        raise ValueError(
            f"API key file {path}: expected a key of at least {MIN_SECRET_LEN} characters"
        )
    return key


def secrets_from_experiment(experiment: dict[str, Any]) -> list[str]:
    """Secret values an experiment refers to (see the module docstring)."""
    out: list[str] = []

    def _value(entry: Any) -> str | None:
        if isinstance(entry, dict) and entry.get("type") == "env" and entry.get("key"):
            return os.environ.get(str(entry["key"]))
        if isinstance(entry, str) and not entry.startswith("${"):
            return entry
        return None

    secrets = experiment.get("secrets") if isinstance(experiment, dict) else None
    if isinstance(secrets, dict):
        for scope in secrets.values():
            if isinstance(scope, dict):
                for entry in scope.values():
                    value = _value(entry)
                    if value:
                        out.append(value)
    configuration = experiment.get("configuration") if isinstance(experiment, dict) else None
    if isinstance(configuration, dict):
        for name, entry in configuration.items():
            if isinstance(entry, dict) and entry.get("type") == "env":
                if _SECRETISH.search(str(name)) or _SECRETISH.search(str(entry.get("key", ""))):
                    value = _value(entry)
                    if value:
                        out.append(value)
    return out


def known_secrets(extra: Iterable[str] = ()) -> list[str]:
    """The secret values to scrub: env (see the module docstring) plus ``extra``; longest first."""
    values = [os.environ.get(API_KEY_ENV, "")]
    for name in re.split(r"[,\s]+", os.environ.get(EXTRA_ENV, "")):
        if name:
            values.append(os.environ.get(name, ""))
    values += list(extra)
    uniq = {v.strip() for v in values if v and len(v.strip()) >= MIN_SECRET_LEN}
    return sorted(uniq, key=len, reverse=True)


def _variants(secret: str) -> list[bytes]:
    forms = {secret, json.dumps(secret)[1:-1], quote(secret, safe=""), repr(secret)[1:-1]}
    return sorted({f.encode("utf-8") for f in forms if f}, key=len, reverse=True)


def redact_text(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every known form of each secret replaced by ``[REDACTED]``."""
    for secret in secrets:
        for form in _variants(secret):
            text = text.replace(form.decode("utf-8"), REDACTED)
    return text


def _redact_bytes(data: bytes, secrets: Iterable[str]) -> tuple[bytes, int]:
    count = 0
    for secret in secrets:
        for form in _variants(secret):
            n = data.count(form)
            if n:
                count += n
                data = data.replace(form, REDACTED.encode())
    return data, count


def scrub_file(path: Path, secrets: Iterable[str]) -> int:
    """Replace the secrets in one file (atomic rename, mode kept); return how many were replaced.

    Symlinks, non-regular files and files over 512 MiB are left alone (returns 0).
    """
    secrets = list(secrets)
    if not secrets:
        return 0
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FILE_BYTES:
        return 0
    try:
        data = Path(path).read_bytes()
    except OSError:
        return 0
    new, count = _redact_bytes(data, secrets)
    if count:
        tmp = Path(path).with_name(f".{Path(path).name}.redact{os.getpid()}")
        with open(tmp, "wb") as fh:
            fh.write(new)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, stat.S_IMODE(st.st_mode))
        os.replace(tmp, path)
    return count


def scrub_tree(root: Path, secrets: Iterable[str], skip: Iterable[Path] = ()) -> dict[str, int]:
    """Scrub every regular file under ``root`` (not following symlinks), except under ``skip``.

    Returns:
        ``{relative path: replacements}`` for the files that held a secret.
    """
    secrets = list(secrets)
    out: dict[str, int] = {}
    root = Path(root)
    if not secrets or not root.is_dir():
        return out
    skipped = [Path(s).resolve() for s in skip]
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath).resolve()
        if any(here == s or s in here.parents for s in skipped):
            dirnames[:] = []
            continue
        for name in filenames:
            path = Path(dirpath) / name
            n = scrub_file(path, secrets)
            if n:
                out[str(path.relative_to(root))] = n
    return out


class RedactingFilter(logging.Filter):
    """Logging filter that scrubs the secrets from every record's final message."""

    def __init__(self, secrets: Iterable[str]) -> None:
        """Scrub ``secrets`` (see :func:`known_secrets`)."""
        super().__init__()
        self.secrets = list(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite ``record.msg`` (arguments merged) and exception text; always keep the record."""
        if not self.secrets:
            return True
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: leave it to the handler
            return True
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        record.msg = redact_text(message, self.secrets)
        record.args = None
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text, self.secrets)
        return True
