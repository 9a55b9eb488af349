"""Build of the compiled chunk path (issue 24): ``chaoslib_infer/measure/_ssefast.pyx`` (the
stream parser) and ``_recvfast.pyx`` (kernel-stamped reads, Linux), Cython.

Everything else is in pyproject.toml. ``pip install -e .`` (scripts/quickstart's install step)
compiles the extension in place with the build requirements (setuptools, Cython) and gcc. The
extension is optional: where it cannot be built (no C compiler, no Python headers) the install
goes on and ``chaoslib_infer.measure.chunkpath`` chooses the pure-Python path, which the records
then name (``chunk_path: "python"``).
"""

from __future__ import annotations

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # building without Cython: the pure-Python path only
    ext_modules: list[Extension] = []
else:
    ext_modules = cythonize(
        [
            Extension(
                "chaoslib_infer.measure._ssefast",
                ["chaoslib_infer/measure/_ssefast.pyx"],
                optional=True,
            ),
            Extension(
                "chaoslib_infer.measure._recvfast",
                ["chaoslib_infer/measure/_recvfast.pyx"],
                optional=True,
            ),
        ],
        compiler_directives={"language_level": "3"},
        quiet=True,
    )

setup(ext_modules=ext_modules)
