#!/usr/bin/env bash
# Builds Debian's own Abseil (the version installed, from its source package on deb.debian.org,
# with Debian's patches: the same ABI, inline namespace and sonames) with ThreadSanitizer, as shared
# libraries that can stand in for the system's at run time (LD_LIBRARY_PATH). Tandem's binaries
# link Debian's Abseil; with these loaded instead, TSan sees absl::Mutex's synchronisation and
# stops reporting races on data it guards (scripts/sanitize.sh tsan uses them).
#
#   scripts/build_absl_tsan.sh [PREFIX]   (default: .cache/absl-tsan; prints PREFIX/lib when done)
#
# About 15 minutes on two cores. Needs curl, xz and patch (scripts/install_deps.sh installs them).
# Environment: ABSL_TSAN_JOBS (build jobs, 2).
set -euo pipefail
cd "$(dirname "$0")/.."
prefix="$(realpath -m "${1:-.cache/absl-tsan}")"
if [[ -f "$prefix/lib/libabsl_synchronization.so.20220623" && -f "$prefix/.debian-version" &&
      "$(cat "$prefix/.debian-version")" == "$(dpkg-query -W -f='${Version}' libabsl-dev)" ]]; then
  echo "$prefix/lib"
  exit 0
fi
version="$(dpkg-query -W -f='${Version}' libabsl-dev)"  # e.g. 20220623.1-1+deb12u2
upstream="${version%%-*}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
pool="http://deb.debian.org/debian/pool/main/a/abseil"
echo "== Abseil $version from $pool" >&2
curl -fsSL -o "$work/orig.tar.gz" "$pool/abseil_${upstream}.orig.tar.gz"
curl -fsSL -o "$work/debian.tar.xz" "$pool/abseil_${version}.debian.tar.xz"
tar -xzf "$work/orig.tar.gz" -C "$work"
src="$work/abseil-$upstream"
tar -xJf "$work/debian.tar.xz" -C "$src"
while read -r p; do
  [[ -z $p || $p == \#* ]] && continue
  patch -d "$src" -p1 -s <"$src/debian/patches/$p"
done <"$src/debian/patches/series"
grep -q "ABSL_OPTION_INLINE_NAMESPACE_NAME debian" "$src/absl/base/options.h" ||
  { echo "build_absl_tsan: Debian's patches did not set the inline namespace" >&2; exit 1; }
flags="-fsanitize=thread -fno-omit-frame-pointer -g"
echo "== building (log: $work/build.log is removed at exit; errors are printed)" >&2
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
