#!/usr/bin/env bash
# Build the llama-cpp-python wheel once and keep it in a wheel directory, so the lab's
# real inference engine (llama_cpp.server) installs in seconds afterwards.
#
# llama-cpp-python ships as a source distribution only: pip compiles llama.cpp (CPU
# backend) on every fresh install: ~7 CPU-minutes without the multimodal library (about
# 4 minutes on 2 cores), twice that with it. This
# script is idempotent: if a wheel compatible with the target Python is already in the
# wheel directory it does nothing.
#
# Usage:
#   scripts/build-llama-wheel.sh [--install]
#
# Environment:
#   CHAOS_INFER_WHEELS   wheel directory (default: ~/.cache/chaoslib-infer/wheels)
#   LLAMA_CPP_VERSION    llama-cpp-python version (default: 0.3.36)
#   PYTHON               interpreter the wheel is for (default: ./.venv/bin/python if
#                        present, else python3)
#   PIP                  pip command to build with (default: "$PYTHON -m pip"); when set
#                        and PYTHON is not, PYTHON is taken from it ("/v/bin/python -m pip")
#   CMAKE_ARGS           passed through to the llama.cpp CMake build (default
#                        -DLLAVA_BUILD=OFF: the multimodal library mtmd is about half of the
#                        compile time and the lab never loads it; add -DGGML_NATIVE=OFF for a
#                        wheel that runs on other CPUs)
#
# --install additionally installs the wheel (and the server extra's pure-Python
# dependencies) into that interpreter's environment. Without it, install with:
#   $PYTHON -m pip install --find-links "$CHAOS_INFER_WHEELS" "llama-cpp-python[server]==$LLAMA_CPP_VERSION"
set -euo pipefail

WHEEL_DIR="${CHAOS_INFER_WHEELS:-$HOME/.cache/chaoslib-infer/wheels}"
VERSION="${LLAMA_CPP_VERSION:-0.3.36}"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -n "${PYTHON:-}" ]]; then
    PY="$PYTHON"
elif [[ -n "${PIP:-}" && "$PIP" == *" -m pip"* ]]; then
    PY="${PIP%% -m pip*}"
elif [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then
    PY="$REPO_ROOT/.venv/bin/python"
else
    PY="python3"
fi

INSTALL=0
for arg in "$@"; do
    case "$arg" in
        --install) INSTALL=1 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "build-llama-wheel: unknown argument: $arg" >&2; exit 2 ;;
    esac
done

mkdir -p "$WHEEL_DIR"

# Print the path of a llama_cpp_python-$VERSION wheel in $WHEEL_DIR whose tags the target
# interpreter accepts; exit 1 if there is none.
find_wheel() {
    "$PY" - "$WHEEL_DIR" "$VERSION" <<'EOF'
import sys
from pathlib import Path

try:
    from packaging.tags import sys_tags
    from packaging.utils import parse_wheel_filename
except ImportError:  # pip always vendors packaging
    from pip._vendor.packaging.tags import sys_tags
    from pip._vendor.packaging.utils import parse_wheel_filename

wheel_dir, version = Path(sys.argv[1]), sys.argv[2]
supported = set(sys_tags())
for whl in sorted(wheel_dir.glob(f"llama_cpp_python-{version}-*.whl")):
    try:
        _name, ver, _build, tags = parse_wheel_filename(whl.name)
    except Exception:
        continue
    if str(ver) == version and tags & supported and whl.stat().st_size > 0:
        print(whl)
        sys.exit(0)
sys.exit(1)
EOF
}

if wheel="$(find_wheel)"; then
    echo "build-llama-wheel: found $wheel (nothing to build)"
else
    jobs="$(nproc 2>/dev/null || echo 2)"
    echo "build-llama-wheel: compiling llama-cpp-python==$VERSION for $("$PY" -c 'import sys; print(sys.version.split()[0])')"
    echo "build-llama-wheel: this takes ~4 minutes on 2 cores (CPU backend, no multimodal library); output goes to $WHEEL_DIR"
    CMAKE_ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=OFF}" \
        CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$jobs}" \
        ${PIP:-"$PY" -m pip} wheel --no-deps -w "$WHEEL_DIR" "llama-cpp-python==$VERSION"
    wheel="$(find_wheel)" || {
        echo "build-llama-wheel: pip finished but no compatible wheel is in $WHEEL_DIR" >&2
        exit 1
    }
    echo "build-llama-wheel: built $wheel"
fi

if [[ "$INSTALL" == 1 ]]; then
    ${PIP:-"$PY" -m pip} install --find-links "$WHEEL_DIR" "llama-cpp-python[server]==$VERSION"
else
    echo "build-llama-wheel: install with:"
    echo "  $PY -m pip install --find-links $WHEEL_DIR \"llama-cpp-python[server]==$VERSION\""
fi
