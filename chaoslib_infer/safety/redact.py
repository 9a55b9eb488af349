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
environment variables named in ``CHAOS_INFER_REDACT_ENV`` (comma-separated names); the keys a
run registers in memory for its duration (:func:`run_secrets`: certification targets' keys,
read from their ``api_key_env`` / ``api_key_file``, never copied into the environment or a
file); secrets an
experiment declares (inline values and ``type: env`` references); configuration entries of
``type: env`` whose name or variable looks secret (``key``, ``token``, ``secret``, ``password``).
Each value is replaced by ``[REDACTED]`` in every form a server or serializer may write it (raw,
JSON-escaped, URL-encoded with ``quote`` and ``quote_plus``, HTML entities, base64 at any
alignment, as in ``Authorization: Basic ...``), and so is any run of 8 or more characters of
one of these forms (a key cut by a truncation, or echoed in part). Values shorter than
:data:`MIN_SCRUB_LEN` characters are ignored (they would shred unrelated text); keys given to
the tool must have :data:`MIN_SECRET_LEN` characters.

Server text is scrubbed *before* it is cut (:func:`clip`), at every place it is kept (records,
error lines, evidence): a key echoed across the cut leaves no prefix behind. Processes that do
not talk to the target (the lab's children) get an environment without the key
(:func:`child_env`); run folders are created ``0700`` (:func:`private_dir`) and the CLI's
umask is ``077``, so files are ``0600``.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import html
import json
import logging
import os
import re
import stat
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

__all__ = [
    "API_KEY_ENV",
    "REDACTED",
    "RedactingFilter",
    "child_env",
    "clip",
    "env_key",
    "known_secrets",
    "private_dir",
    "read_key_file",
    "redact_text",
    "run_secrets",
    "scrub",
    "scrub_file",
    "scrub_tree",
    "secrets_from_experiment",
]

API_KEY_ENV = "CHAOS_INFER_API_KEY"
EXTRA_ENV = "CHAOS_INFER_REDACT_ENV"
REDACTED = "[REDACTED]"
#: An API key given to the tool (``--api-key-file``, a target's ``api_key_env``) has at least
#: this many characters: any run of :data:`MIN_SUBSTRING` of them is then scrubbed.
MIN_SECRET_LEN = 8
#: Shorter secret values are still collected and scrubbed, but only as whole values.
MIN_SCRUB_LEN = 4
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


def env_key(env: dict[str, str] | None = None) -> str | None:
    """The API key set directly in ``$CHAOS_INFER_API_KEY`` (stripped), None when unset or blank.

    Held to the rule for key files (:func:`read_key_file`): a key of 1 to
    :data:`MIN_SECRET_LEN` - 1 characters would be neither refused nor scrubbed as a run of
    characters, so it is refused.

    Raises:
        ValueError: a key shorter than :data:`MIN_SECRET_LEN` (one line, without the key).
    """
    key = (os.environ if env is None else env).get(API_KEY_ENV, "").strip()
    if not key:
        return None
    if len(key) < MIN_SECRET_LEN:
        raise ValueError(
            f"${API_KEY_ENV}: expected a key of at least {MIN_SECRET_LEN} characters"
            f" (got {len(key)})"
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


#: Secrets registered for a run (:func:`run_secrets`): value -> number of open registrations.
#: In this process's memory only: never written to ``os.environ`` (children would inherit it)
#: nor to a file.
_RUN_SECRETS: dict[str, int] = {}
_RUN_LOCK = threading.Lock()


@contextlib.contextmanager
def run_secrets(values: Iterable[str | None]) -> Iterator[list[str]]:
    """Make ``values`` known secrets of this process inside the block (nested blocks add up).

    Inside the block :func:`known_secrets`, :func:`scrub`, :func:`clip` (hence every record a
    :class:`~chaoslib_infer.load.records.RecordWriter` writes and every error text the load
    client keeps) and :func:`child_env` treat each value as they treat ``$CHAOS_INFER_API_KEY``,
    without the value being put in the environment (which child processes inherit) or on disk.
    Used by certification for its targets' keys. Blank values and None are ignored.

    Yields:
        The values registered (stripped, non-blank).
    """
    vals = sorted({v.strip() for v in values if v and v.strip()})
    with _RUN_LOCK:
        for v in vals:
            _RUN_SECRETS[v] = _RUN_SECRETS.get(v, 0) + 1
    try:
        yield vals
    finally:
        with _RUN_LOCK:
            for v in vals:
                n = _RUN_SECRETS.get(v, 0) - 1
                if n > 0:
                    _RUN_SECRETS[v] = n
                else:
                    _RUN_SECRETS.pop(v, None)


def _registered() -> tuple[str, ...]:
    with _RUN_LOCK:
        return tuple(sorted(_RUN_SECRETS))


def known_secrets(extra: Iterable[str] = ()) -> list[str]:
    """The secret values to scrub: env and run-registered values (see the module docstring)
    plus ``extra``; longest first."""
    values = [os.environ.get(API_KEY_ENV, "")]
    for name in re.split(r"[,\s]+", os.environ.get(EXTRA_ENV, "")):
        if name:
            values.append(os.environ.get(name, ""))
    values += list(_registered())
    values += list(extra)
    uniq = {v.strip() for v in values if v and len(v.strip()) >= MIN_SCRUB_LEN}
    return sorted(uniq, key=len, reverse=True)


def _b64_cores(raw: bytes) -> list[str]:
    """The part of any base64 encoding of data holding ``raw`` that depends on ``raw`` alone.

    Base64 maps 3 bytes to 4 characters, so the encoding of ``raw`` inside a longer message
    (``Basic base64(user:key)``) depends on its offset modulo 3: one core per offset, without the
    characters shared with the neighbouring bytes. Standard and URL-safe alphabets.
    """
    out: list[str] = []
    for k in range(3):
        enc = base64.b64encode(b"\0" * k + raw).decode("ascii")
        first = -(-8 * k // 6)  # first character made of secret bits only
        last = (8 * (k + len(raw))) // 6  # characters from here on mix in padding bits
        core = enc[first:last]
        out += [core, core.replace("+", "-").replace("/", "_")]
    return out


def _variants(secret: str) -> list[bytes]:
    """Every form of ``secret`` that a server or a serializer may write (bytes, longest first)."""
    raw = secret.encode("utf-8")
    forms = {
        secret,
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        quote(secret, safe=""),
        quote(secret),
        quote_plus(secret, safe=""),
        quote_plus(secret),
        html.escape(secret, quote=True),
        html.escape(secret, quote=False),
        "".join(c if c.isalnum() else f"&#{ord(c)};" for c in secret),
        "".join(c if c.isalnum() else f"&#x{ord(c):x};" for c in secret),
        repr(secret)[1:-1],
        *_b64_cores(raw),
    }
    return sorted({f.encode("utf-8") for f in forms if f}, key=len, reverse=True)


#: Any run of at least this many characters (bytes) of a known secret's form is scrubbed.
MIN_SUBSTRING = 8
_ANCHOR = 4  # every MIN_SUBSTRING-long window of a form holds one aligned 4-byte anchor


class _Matcher:
    """Finds the spans of ``data`` that belong to a secret (see :func:`redact_text`)."""

    def __init__(self, secrets: tuple[str, ...]) -> None:
        self.exact: list[bytes] = []  # forms shorter than MIN_SUBSTRING: whole matches only
        self.anchors: list[tuple[bytes, bytes, int]] = []  # (anchor, form, offset in form)
        for secret in secrets:
            for form in _variants(secret):
                if len(form) < MIN_SUBSTRING:
                    self.exact.append(form)
                    continue
                for k in range(0, len(form) - _ANCHOR + 1, _ANCHOR):
                    self.anchors.append((form[k : k + _ANCHOR], form, k))

    def spans(self, data: bytes) -> list[tuple[int, int]]:
        """Merged ``[start, end)`` byte spans of ``data`` to replace."""
        found: list[tuple[int, int]] = []
        for form in self.exact:
            at = data.find(form)
            while at >= 0:
                found.append((at, at + len(form)))
                at = data.find(form, at + len(form))
        if len(data) >= MIN_SUBSTRING:
            for anchor, form, k in self.anchors:
                at = data.find(anchor)
                while at >= 0:
                    left = 0
                    while left < k and at - left > 0 and data[at - left - 1] == form[k - left - 1]:
                        left += 1
                    right = _ANCHOR
                    while (
                        k + right < len(form)
                        and at + right < len(data)
                        and data[at + right] == form[k + right]
                    ):
                        right += 1
                    if left + right >= MIN_SUBSTRING:
                        found.append((at - left, at + right))
                    at = data.find(anchor, at + 1)
        if not found:
            return []
        found.sort()
        merged = [found[0]]
        for start, end in found[1:]:
            if start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        return merged


@functools.lru_cache(maxsize=16)
def _matcher(secrets: tuple[str, ...]) -> _Matcher:
    return _Matcher(secrets)


def _redact_bytes(data: bytes, secrets: Iterable[str]) -> tuple[bytes, int]:
    spans = _matcher(tuple(s for s in secrets if s)).spans(data)
    if not spans:
        return data, 0
    parts: list[bytes] = []
    pos = 0
    for start, end in spans:
        parts += [data[pos:start], REDACTED.encode()]
        pos = end
    parts.append(data[pos:])
    return b"".join(parts), len(spans)


def redact_text(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every form of each secret, and every run of 8+ characters of one, scrubbed.

    Forms (:func:`_variants`): raw, JSON-escaped, URL-encoded (``quote`` and ``quote_plus``),
    HTML entities (named, decimal, hexadecimal), Python ``repr`` and base64 at each of the three
    alignments (standard and URL-safe). A form shorter than :data:`MIN_SUBSTRING` is replaced
    only whole. Each replaced span becomes ``[REDACTED]``.

    Args:
        text: any text (a response body, a journal, a log line).
        secrets: the secret values (see :func:`known_secrets`).
    """
    secrets = tuple(s for s in secrets if s)
    if not secrets or not text:
        return text
    data = text.encode("utf-8", "surrogatepass")
    new, count = _redact_bytes(data, secrets)
    return new.decode("utf-8", "replace") if count else text


def scrub(text: str) -> str:
    """``text`` scrubbed of the secrets this process knows (:func:`known_secrets`, from the env).

    Use it on any text a server sent before it is kept anywhere (a record, a log, an error).
    """
    return redact_text(text, _env_secrets())


def clip(text: str, limit: int) -> str:
    """Scrub ``text`` (:func:`scrub`), *then* cut it to ``limit`` characters.

    Cutting first would leave the prefix of a secret echoed across the cut, which no longer
    matches the whole value; scrubbing first never does.
    """
    return scrub(text)[:limit]


def _env_secrets() -> tuple[str, ...]:
    names = [API_KEY_ENV, *re.split(r"[,\s]+", os.environ.get(EXTRA_ENV, ""))]
    values = tuple(os.environ.get(n, "") for n in names if n)
    return _env_secrets_cached(values, _registered())


@functools.lru_cache(maxsize=8)
def _env_secrets_cached(values: tuple[str, ...], registered: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(known_secrets())


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of ``env`` (default ``os.environ``) without the secrets this process knows.

    For processes that do not talk to the target (the lab's supervisord and everything under it,
    the memory hog, timers and shims): drops ``CHAOS_INFER_API_KEY``, the variables named in
    ``CHAOS_INFER_REDACT_ENV`` and any variable whose value is a key registered for the run
    (:func:`run_secrets`: a certification target's ``api_key_env``). (A lab engine's own key,
    ``CHAOS_INFER_ENGINE_API_KEY``, stays: it is the server's, which the lab engine needs.)
    """
    env = dict(os.environ if env is None else env)
    drop = {API_KEY_ENV, *(n for n in re.split(r"[,\s]+", env.get(EXTRA_ENV, "")) if n)}
    registered = set(_registered())
    return {k: v for k, v in env.items() if k not in drop and v.strip() not in registered}


def private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) if needed and make it ``0700``; return it.

    Raises:
        OSError: the directory cannot be created.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)
    return path


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
