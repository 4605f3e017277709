#!/usr/bin/env bash
# Installs the Debian packages torchneuron builds and tests with (torch
# itself comes from the project's virtual environment: see the Makefile).
# Idempotent: does nothing (and needs no network or root) when every package
# is already installed. Run as root on a fresh Debian 12 machine.
set -euo pipefail

PACKAGES=(
  build-essential cmake make pkg-config ccache git
  libopenmpi-dev openmpi-bin
  libprotobuf-dev protobuf-compiler
  libboost-dev libssl-dev
  libopenblas-serial-dev
  googletest libgtest-dev libgmock-dev
  python3-dev python3-venv
  procps iproute2
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages (${missing[*]}); run as root or install them with apt-get" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
