"""Build of the compiled chunk path (issue 24): ``chaoslib_infer/measure/_ssefast.pyx`` (the
stream parser) and ``_recvfast.pyx`` (kernel-stamped reads, Linux), Cython.

Everything else is in pyproject.toml. ``pip install -e .`` (scripts/quickstart's install step)
compiles the extensions in place with the build requirements (setuptools, Cython) and gcc.
Each extension is optional: where Cython cannot translate it or it cannot be built (no C
compiler, no Python headers) the install goes on and ``chaoslib_infer.measure.chunkpath``
chooses the pure-Python path, which the records then name (``chunk_path: "python"``).
"""

from __future__ import annotations

import sys

from setuptools import Extension, setup

#: (module, source) of each compiled part; each is optional on its own
PARTS = [
    ("chaoslib_infer.measure._ssefast", "chaoslib_infer/measure/_ssefast.pyx"),
    ("chaoslib_infer.measure._recvfast", "chaoslib_infer/measure/_recvfast.pyx"),
]


def _compiled_parts() -> list[Extension]:
    """The parts Cython could translate; a part it cannot (a Cython error, no Cython) is left
    out with one line on stderr, and the install goes on with its pure-Python twin."""
    try:
        from Cython.Build import cythonize
    except ImportError:  # building without Cython: the pure-Python path only
        return []
    out: list[Extension] = []
    for name, source in PARTS:
        try:
            out += cythonize(
                [Extension(name, [source], optional=True)],
                compiler_directives={"language_level": "3"},
                quiet=True,
            )
        except Exception as exc:  # Cython's CompileError and the like: never the whole install
            print(f"chaoslib-infer: {name} not compiled ({exc}); pure Python", file=sys.stderr)
    return out


setup(ext_modules=_compiled_parts())
