#!/usr/bin/env bash
# Installs every system dependency Tandem needs on a Debian 12 machine. Idempotent: packages already
# present are left alone, and apt-get is only called when something is missing.
set -euo pipefail

# What building needs (CMake's configure finds GoogleTest and Google Benchmark too).
PACKAGES=(
  build-essential cmake ninja-build pkg-config ccache git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libopenblas-dev libpcre2-dev libutf8proc-dev
  libboost-dev  # Boost.Beast and Asio (header-only): the router's HTTP API
  libc-ares-dev  # the router's DNS worker discovery (--workers-dns)
  python3
)
# What the tests need besides; INSTALL_DEPS=build (the container images' build stage) skips it.
if [[ "${INSTALL_DEPS:-all}" != build ]]; then
  PACKAGES+=(
    clang-format  # ctest lint.format (scripts/check_format.sh)
    python3-jinja2  # the chat-template reference (ctest conformance.chat_template.jinja2)
    python3-jsonschema  # the structured-output reference (ctest conformance.structured_output.jsonschema)
    python3-yaml  # reads the rendered Kubernetes manifests (ctest deploy.k8s_manifests)
    prometheus  # promtool and a real Prometheus for the metrics and dashboard tests
    openssl  # makes the TLS tests' certificates (scripts/make_certs.sh)
  )
  # kubectl renders the Kubernetes manifests (its kustomize; ctest deploy.k8s_manifests): Debian's
  # kubernetes-client, unless the machine already has a kubectl.
  if ! command -v kubectl >/dev/null 2>&1; then
    PACKAGES+=(kubernetes-client)
  fi
  # Node.js runs the conformance oracles (node-llama-cpp); the machine image may already carry a
  # newer one.
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    PACKAGES+=(nodejs npm)
  fi
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "install_deps: installing ${missing[*]}" >&2
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install_deps: all system packages present" >&2
fi
