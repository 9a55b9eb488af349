"""Which chunk path parses the streams: the compiled one (issue 24) or the pure-Python one.

The compiled path is :class:`chaoslib_infer.measure._ssefast.FastStreamParser` with the compiled
kernel-stamped reads of ``chaoslib_infer.measure._recvfast`` (Cython, both built by ``setup.py``
at ``pip install -e .``; one path needs both); the pure-Python path is
:class:`chaoslib_infer.measure.sse.StreamParser` with ``load.kerneltime.recv_stamped``, the
reference. Both give the same parser state,
hence the same records, on the same bytes (tests/test_chunk_path.py). :data:`ENV` chooses:

* unset, empty or ``auto``: the compiled path when its extension imports, else the pure one;
* ``python``: the pure path (tests, and a check of a figure against the reference);
* ``compiled``: the compiled path, and an error when it is not built.

Each record names the path that parsed it (``chunk_path``: ``"compiled"`` | ``"python"``,
``docs/contracts.md`` section 3), and so does the load summary.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from chaoslib_infer.measure.sse import StreamParser

__all__ = ["ENV", "CompiledReads", "compiled_available", "compiled_reads", "parser_class", "path"]

#: Environment variable that chooses the chunk path (module docstring).
ENV = "CHAOS_INFER_CHUNK_PATH"


@dataclass(frozen=True)
class CompiledReads:
    """The compiled kernel-stamped reads (``measure/_recvfast.pyx``).

    Attributes:
        recv_stamped: ``(fd, size, floor) -> (data, t, now, stamped) | None``, the twin of
            ``load.kerneltime.recv_stamped`` on a descriptor (its docstring: definitions).
        dispatch: ``(epfd, handlers) -> None``, one ``load.kerneltime.Poller`` turn:
            ``epoll_wait`` without waiting, then ``handlers[fd]()`` for each ready descriptor.
    """

    recv_stamped: Callable[[int, int, float], tuple[bytes, float, float, bool] | None]
    dispatch: Callable[[int, dict[int, Callable[[], None]]], None]


def _load() -> tuple[type[StreamParser] | None, CompiledReads | None, str]:
    try:
        from chaoslib_infer.measure._recvfast import (  # type: ignore[import-not-found]
            dispatch,
            recv_stamped,
        )
        from chaoslib_infer.measure._ssefast import FastStreamParser  # type: ignore[import-not-found]
    except ImportError as exc:  # not built (no compiler at install) or built for another Python
        return None, None, f"{type(exc).__name__}: {exc}"
    return FastStreamParser, CompiledReads(recv_stamped, dispatch), ""


_COMPILED, _READS, _WHY_NOT = _load()


def compiled_available() -> tuple[bool, str]:
    """``(True, "")`` when the compiled extension imports, else ``(False, why)``."""
    return _COMPILED is not None, _WHY_NOT


def parser_class() -> type[StreamParser]:
    """The stream parser class :data:`ENV` chooses (module docstring), read at each call.

    Returns:
        ``FastStreamParser`` or ``StreamParser``; an instance's ``chunk_path`` attribute names it
        (``"compiled"`` | ``"python"``).

    Raises:
        ValueError: :data:`ENV` is not auto/python/compiled, or is ``compiled`` and the
            extension is not built (the reason is in the message).
    """
    v = os.environ.get(ENV, "").strip().lower()
    if v in ("", "auto"):
        return _COMPILED if _COMPILED is not None else StreamParser
    if v in ("python", "pure"):
        return StreamParser
    if v == "compiled":
        if _COMPILED is None:
            raise ValueError(
                f"{ENV}=compiled: the compiled chunk path is not built ({_WHY_NOT}); "
                "run `pip install -e .` with a C compiler and the Python headers"
            )
        return _COMPILED
    raise ValueError(f"{ENV}={v!r}: expected auto, python or compiled")


def path() -> str:
    """``"compiled"`` or ``"python"``: the path :func:`parser_class` chooses now.

    Raises:
        ValueError: as :func:`parser_class`.
    """
    return str(parser_class().chunk_path)


def compiled_reads() -> CompiledReads | None:
    """The compiled kernel-stamped reads (:class:`CompiledReads`) when :data:`ENV` chooses the
    compiled path, else None.

    Raises:
        ValueError: as :func:`parser_class`.
    """
    return _READS if parser_class() is _COMPILED and _COMPILED is not None else None
