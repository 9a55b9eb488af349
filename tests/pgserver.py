"""A real PostgreSQL server for the history store's tests (issue 32): Debian's ``postgresql``
package (``/usr/lib/postgresql/*/bin/initdb`` and ``pg_ctl``), a fresh cluster in a temporary
folder owned by the ``postgres`` user, listening on a free loopback port; stopped afterwards.

:func:`pg_skip_reason` says why it cannot run here, starting with
:data:`labutil.LAB_MISSING` so the CI gate (``CHAOS_INFER_REQUIRE_LAB=1``) fails instead of
skipping.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from labutil import LAB_MISSING, free_port


def _bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def pg_skip_reason() -> str | None:
    """Why no PostgreSQL server can be started here (None: it can)."""
    if _bin() is None:
        return LAB_MISSING + "PostgreSQL (Debian package postgresql: scripts/quickstart test)"
    if os.geteuid() != 0:
        return LAB_MISSING + "root (to run the server as the postgres user)"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return LAB_MISSING + "the postgres user (Debian package postgresql)"
    return None


@contextmanager
def postgres_server() -> Iterator[str]:
    """Start a throw-away PostgreSQL server; yield its URL ``postgresql://postgres@127.0.0.1:PORT/
    postgres`` (trust authentication on loopback); stop it and remove its folder at the end."""
    bindir = _bin()
    assert bindir is not None
    base = Path(tempfile.mkdtemp(prefix="chaos-infer-pg-"))
    data = base / "data"
    user = pwd.getpwnam("postgres")
    os.chown(base, user.pw_uid, user.pw_gid)
    base.chmod(0o700)
    port = free_port()

    def as_pg(*argv: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *argv],
            check=True,
            capture_output=True,
            timeout=120,
            cwd=base,
        )

    as_pg(str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync")
    opts = f"-h 127.0.0.1 -p {port} -k {base} -F -c fsync=off"
    as_pg(
        str(bindir / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(base / "log"), "-w", "start"
    )
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            capture_output=True,
            timeout=60,
            cwd=base,
        )  # fmt: skip
        shutil.rmtree(base, ignore_errors=True)
