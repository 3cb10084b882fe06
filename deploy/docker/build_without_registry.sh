#!/usr/bin/env bash
# Builds the CPU image where no container registry is reachable (only a Debian mirror): a Debian 12
# root filesystem made with debootstrap is imported as the base (debian:12 and debian:12-slim), the
# image is built with podman, and the demo runs inside it (a `tandem up` cluster as user 10001 and
# scripts/demo.sh's request). With a registry, `docker build -f deploy/docker/Dockerfile.cpu .` is
# all it takes.
#   deploy/docker/build_without_registry.sh [TAG]        (as root; default tag localhost/tandem:cpu)
# PODMAN_ARGS passes options to podman (e.g. "--runtime runc" where crun cannot run: a VM without
# CAP_SYS_RESOURCE, or with cgroup v1 and a v2 mount that has controllers).
set -euo pipefail
cd "$(dirname "$0")/../.."
TAG="${1:-localhost/tandem:cpu}"
PODMAN=(podman ${PODMAN_ARGS:-})
command -v podman >/dev/null && command -v debootstrap >/dev/null ||
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends podman debootstrap runc; }
if ! "${PODMAN[@]}" image exists localhost/debian:12; then
  root="$(mktemp -d /tmp/tandem-rootfs.XXXXXX)"
  echo "== debootstrap bookworm into $root"
  debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >/dev/null
  tar -C "$root" -c . | "${PODMAN[@]}" import - localhost/debian:12
  "${PODMAN[@]}" tag localhost/debian:12 localhost/debian:12-slim
  rm -rf "$root"
fi
echo "== building $TAG"
"${PODMAN[@]}" build --network host -f deploy/docker/Dockerfile.cpu -t "$TAG" .
"${PODMAN[@]}" images "$TAG"
echo "== the demo inside the image"
"${PODMAN[@]}" run --rm --network host "$TAG" sh -c '
  tandem up --model /opt/tandem/models/kjv-target --port 50071 --ready-file /tmp/ready > /tmp/up.log 2>&1 &
  UP=$!
  for i in $(seq 300); do [ -f /tmp/ready ] && break; sleep 0.2; done
  tandem generate --server "$(cat /tmp/ready)" --prompt "And God said unto Moses," --max-tokens 64 \
    --seed 0 --temperature 0.8 --top-p 0.95
  echo
  tandem health --server "$(cat /tmp/ready)"
  kill -INT $UP; wait $UP'
