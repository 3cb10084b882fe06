#!/usr/bin/env bash
# The Debian/Ubuntu packages that hold the shared libraries the binaries in DIR load (ldd, then
# dpkg -S), one per line: what an image's runtime stage installs, so it carries no build tools and
# no hand-kept list. Libraries outside any package (the CUDA image's own) are left out.
#   runtime_packages.sh DIR
set -euo pipefail
for f in "$1"/*; do
  ldd "$f" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null || true
done | cut -d: -f1 | sort -u | grep -v -E '^(libc6|libgcc-s1|libstdc\+\+6)$' || true
