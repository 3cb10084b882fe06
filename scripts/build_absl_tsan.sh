#!/usr/bin/env bash
# Builds Debian's own Abseil (the version installed, from its source package on deb.debian.org,
# with Debian's patches: the same ABI, inline namespace and sonames) with ThreadSanitizer, as shared
# libraries that can stand in for the system's at run time (LD_LIBRARY_PATH). Tandem's binaries
# link Debian's Abseil; with these loaded instead, TSan sees absl::Mutex's synchronisation and
# stops reporting races on data it guards (scripts/sanitize.sh tsan uses them).
#
#   scripts/build_absl_tsan.sh [PREFIX]   (default: .cache/absl-tsan; prints PREFIX/lib when done)
#
# About ten minutes on two cores. Needs curl, xz-utils and patch (apt-get install curl xz-utils
# patch) and network access to deb.debian.org.
# Environment: ABSL_TSAN_JOBS (build jobs, 2).
set -euo pipefail
prefix="$(realpath -m "${1:-$(dirname "$0")/../.cache/absl-tsan}")"
if ! version="$(dpkg-query -W -f='${Version}' libabsl-dev 2>/dev/null)"; then
  echo "build_absl_tsan: libabsl-dev is not installed (scripts/install_deps.sh)" >&2
  exit 1
fi
upstream="${version%%-*}"  # e.g. 20220623.1 of 20220623.1-1+deb12u2
if [[ -f "$prefix/.debian-version" && "$(cat "$prefix/.debian-version")" == "$version" ]]; then
  echo "$prefix/lib"
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
pool="http://deb.debian.org/debian/pool/main/a/abseil"
echo "== Abseil $version from $pool" >&2
curl -fsSL -o "$work/orig.tar.gz" "$pool/abseil_${upstream}.orig.tar.gz"
curl -fsSL -o "$work/debian.tar.xz" "$pool/abseil_${version}.debian.tar.xz"
tar -xzf "$work/orig.tar.gz" -C "$work"
src="$work/abseil-$upstream"
tar -xJf "$work/debian.tar.xz" -C "$src"
while read -r p _ || [[ -n ${p:-} ]]; do  # a patch name (and options) a line
  [[ -z $p || $p == \#* ]] && continue
  patch -d "$src" -p1 -s <"$src/debian/patches/$p"
done <"$src/debian/patches/series"
grep -q "ABSL_OPTION_INLINE_NAMESPACE_NAME debian" "$src/absl/base/options.h" ||
  { echo "build_absl_tsan: Debian's patches did not set the inline namespace" >&2; exit 1; }
flags="-fsanitize=thread -fno-omit-frame-pointer -g"
echo "== building (errors are printed)" >&2
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_STANDARD=17 \
  -DBUILD_SHARED_LIBS=ON -DBUILD_TESTING=OFF -DCMAKE_INSTALL_PREFIX="$prefix" \
  -DCMAKE_INSTALL_LIBDIR=lib -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" >"$work/configure.log" 2>&1 ||
  { tail -20 "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" -j"${ABSL_TSAN_JOBS:-2}" >"$work/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$work/build.log" | head -20 >&2; exit 1; }
cmake --install "$work/build" >/dev/null
echo "$version" >"$prefix/.debian-version"
echo "$prefix/lib"
