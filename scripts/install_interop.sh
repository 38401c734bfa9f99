#!/usr/bin/env bash
# The interop extra: aiomoqt (an independent draft-22 MOQT implementation, whose interop test
# client tests/interop runs against the relay) on aiopquic (a binding of picoquic), both pinned.
# Called by the Makefile with the venv's bin directory; see docs/interop.md.
#
# aiopquic ships no wheel for Python 3.11, and both packages declare Python >= 3.12 while working
# on 3.11, so aiopquic is built from its sdist here:
# - its build.sh applies picoquic patches with `git apply`, which inside another repository's
#   work tree silently applies nothing (the import then fails on
#   picoquic_get_remote_stop_sending_error): it is built in a temporary directory outside any;
# - the build is ~3 minutes on two cores, so the wheel it makes is kept in the venv
#   (interop-wheels/) and a re-install (the project's requirements changed) only reinstalls it;
#   build.sh tunes it for this host (-march=native), which is why it stays in this venv.
set -euo pipefail

# absolute: the build runs in a temporary directory (the Makefile passes .venv/bin)
BIN=$(cd "${1:?usage: install_interop.sh VENV_BIN}" && pwd)
AIOPQUIC_VERSION=0.6.1
AIOMOQT_VERSION=0.13.3
SORTEDCONTAINERS_VERSION=2.4.0
# The sdist's build needs (pyproject.toml's build-system, installed by hand: no build isolation,
# since the native libraries build.sh made must be the ones the extension links).
BUILD_REQUIREMENTS=(cython==3.2.4 "setuptools_scm>=8" "setuptools>=75" wheel==0.45.1)
# Debian 12 packages the native build needs (picoquic's CMake project is C and C++).
APT_PACKAGES=(build-essential cmake libssl-dev git pkg-config)

PY="$BIN/python"
WHEELS="$(dirname "$BIN")/interop-wheels"
PIP=("$PY" -m pip install --quiet --disable-pip-version-check)

have_debs() {
  dpkg-query -W -f='${Status}\n' "$@" 2>/dev/null | grep -c '^install ok installed$' \
    | grep -qx "$#"
}

python_headers() {
  [ -f "$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ]
}

apt_install() {
  local want=("${APT_PACKAGES[@]}")
  python_headers || want+=(python3-dev)
  have_debs "${want[@]}" && return 0
  if ! command -v apt-get >/dev/null; then
    echo "install_interop: needs ${want[*]} (no apt-get here: install them first)" >&2
    exit 1
  fi
  local sudo=()
  [ "$(id -u)" = 0 ] || sudo=(sudo)
  echo "install_interop: apt-get install ${want[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
    "${want[@]}" >/dev/null
}

build_aiopquic() {
  apt_install
  "${PIP[@]}" "${BUILD_REQUIREMENTS[@]}"
  BUILD_DIR=$(mktemp -d "${TMPDIR:-/tmp}/kvcs-aiopquic.XXXXXX")
  trap 'rm -rf "$BUILD_DIR"' EXIT
  (
    cd "$BUILD_DIR"
    "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
      --ignore-requires-python "aiopquic==$AIOPQUIC_VERSION" -d .
    tar xzf "aiopquic-$AIOPQUIC_VERSION.tar.gz"
    cd "aiopquic-$AIOPQUIC_VERSION"
    # Fail here, not at import, if the build would land inside a git work tree (see above).
    if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
      echo "install_interop: $PWD is inside a git work tree; set TMPDIR elsewhere" >&2
      exit 1
    fi
    echo "install_interop: building picoquic for aiopquic $AIOPQUIC_VERSION (~3 minutes)"
    ./build.sh --native >build.log 2>&1 || { tail -40 build.log >&2; exit 1; }
    PATH="$BIN:$PATH" SETUPTOOLS_SCM_PRETEND_VERSION="$AIOPQUIC_VERSION" \
      "$PY" -m pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation \
      --ignore-requires-python -w "$WHEELS" .
  )
}

mkdir -p "$WHEELS"
ls "$WHEELS"/aiopquic-"$AIOPQUIC_VERSION"-*.whl >/dev/null 2>&1 || build_aiopquic
"${PIP[@]}" --no-deps --ignore-requires-python --force-reinstall \
  "$WHEELS"/aiopquic-"$AIOPQUIC_VERSION"-*.whl
"${PIP[@]}" --no-deps --ignore-requires-python "aiomoqt==$AIOMOQT_VERSION" \
  "sortedcontainers==$SORTEDCONTAINERS_VERSION" certifi
# The failure this catches is the silent one: patches not applied, the extension not loading.
"$PY" -c 'import aiopquic._binding._transport, aiomoqt.tools.moq_interop_client'
echo "install_interop: aiopquic $AIOPQUIC_VERSION, aiomoqt $AIOMOQT_VERSION installed"
