#!/usr/bin/env bash
# Installs what libengine builds with, when missing (Open MPI for data parallelism included), and the Python
# oracles its tests compare with (Debian's torch 1.13, and jinja2 for chat templates; pip's transformers 4.36.2,
# tokenizers, peft 0.7.1): idempotent and quiet. Needs root (apt-get) on Debian.
set -euo pipefail
packages=(cmake ninja-build g++ pkg-config libpcre2-dev libopenblas-dev libhwy-dev nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev zlib1g-dev
          libboost-context-dev libopenmpi-dev openmpi-bin python3-matplotlib
          python3-torch python3-pip python3-psutil python3-yaml python3-jinja2)
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
# The transformers/PEFT oracles (tests/golden/*.py) run on Debian's python3 beside its torch 1.13. pip would
# replace that torch by a new one (gigabytes, with CUDA wheels) for peft and accelerate, which declare a newer
# one than 1.13.0a0 satisfies; they work with 1.13, so they come without their dependencies.
oracle_python=/usr/bin/python3
if ! "$oracle_python" -c 'import transformers, peft, tokenizers, safetensors, accelerate
assert transformers.__version__ == "4.36.2" and peft.__version__ == "0.7.1"' >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install_deps: $oracle_python lacks transformers 4.36.2 / peft 0.7.1; run as root or install them" >&2
    exit 1
  fi
  echo "install_deps: installing transformers 4.36.2, tokenizers, peft 0.7.1 for $oracle_python"
  "$oracle_python" -m pip install -q --break-system-packages --root-user-action=ignore "transformers==4.36.2"
  "$oracle_python" -m pip install -q --break-system-packages --root-user-action=ignore --no-deps "peft==0.7.1" \
    "accelerate==0.25.0"
fi
