#!/usr/bin/env bash
# Installs what libengine builds with, when missing (Open MPI for data parallelism included): idempotent and
# quiet. Needs root (apt-get) on Debian.
set -euo pipefail
packages=(cmake ninja-build g++ libopenblas-dev libhwy-dev nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev zlib1g-dev
          libboost-context-dev libopenmpi-dev openmpi-bin python3-matplotlib)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install_deps: missing ${missing[*]}; run as root or install them" >&2
    exit 1
  fi
  echo "install_deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
