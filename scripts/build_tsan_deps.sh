#!/usr/bin/env bash
# Builds the libraries Tandem links whose synchronisation ThreadSanitizer must see, Debian's own
# Abseil and gRPC, with -fsanitize=thread, as shared libraries that stand in for the system's at run
# time (LD_LIBRARY_PATH; scripts/sanitize.sh tsan). Each is the version installed, from its Debian
# source package on deb.debian.org with Debian's patches and build options, so the ABI, Abseil's
# inline namespace and the sonames are the system's: Tandem's programs run on them without relinking.
#
#   scripts/build_tsan_deps.sh [PREFIX]   (default: .cache/tsan; prints PREFIX/lib when done)
#
# Why both: TSan sees only what instrumented code does. absl::Mutex (which Tandem locks, and which
# gRPC's own locks are) synchronises through atomics inside Abseil; gRPC hands calls and messages
# between threads through its lock-free completion queues and call state. Left uninstrumented,
# either makes correctly ordered accesses look like races. Protobuf stays Debian's: a message is
# used by one thread at a time and handed over through gRPC, and its shared state (the descriptor
# pool) is guarded by std::mutex, which TSan intercepts.
#
# Abseil about 10 minutes on two cores, gRPC about 15 (only the libraries Tandem links: grpc++,
# grpc, gpr, upb, address_sorting). Each is rebuilt only when the installed version changes. Needs
# curl, xz-utils and patch (apt-get install curl xz-utils patch) and access to deb.debian.org.
# Environment: TSAN_DEPS_JOBS (build jobs, 2).
set -euo pipefail
prefix="$(realpath -m "${1:-$(dirname "$0")/../.cache/tsan}")"
jobs="${TSAN_DEPS_JOBS:-2}"
flags="-fsanitize=thread -fno-omit-frame-pointer"
# TSan wants -O1 or more; -g1 keeps the line tables its reports print (full -g triples gRPC's build).
# No NDEBUG, as Debian builds them: Abseil's debug-mode checks (its Mutex deadlock detection, which
# command_line_test exercises) and gRPC's debug assertions stay what the system's libraries do.
opt="-O1 -g1"
arch="$(gcc -print-multiarch)"

# The installed version of a binary package (e.g. 1.51.1-3+b1), or an error naming it.
installed() {
  dpkg-query -W -f='${Version}' "$1" 2>/dev/null ||
    { echo "build_tsan_deps: $1 is not installed (scripts/install_deps.sh)" >&2; return 1; }
}

# Unpacks Debian's source package SRC (pool directory POOL) at VERSION into DIR with Debian's
# patches applied, and prints the source tree's path.
debian_source() {
  local src="$1" pool="$2" version="$3" dir="$4"
  version="${version%+b[0-9]*}"  # a binNMU (+b1) rebuilt the same source
  local upstream="${version%-*}" url="http://deb.debian.org/debian/pool/main/$pool"
  echo "== $src $version from $url" >&2
  curl -fsSL -o "$dir/orig.tar.gz" "$url/${src}_${upstream}.orig.tar.gz"
  curl -fsSL -o "$dir/debian.tar.xz" "$url/${src}_${version}.debian.tar.xz"
  tar -xzf "$dir/orig.tar.gz" -C "$dir"
  local tree="$dir/$src-$upstream"
  tar -xJf "$dir/debian.tar.xz" -C "$tree"
  local p
  while read -r p _ || [[ -n ${p:-} ]]; do  # a patch name (and options) a line
    [[ -z $p || $p == \#* ]] && continue
    patch -d "$tree" -p1 -s <"$tree/debian/patches/$p"
  done <"$tree/debian/patches/series"
  echo "$tree"
}

# Configures TREE with the common flags and ARGS, builds TARGETS (all when none) and installs them.
# build NAME TREE "TARGETS" ARGS...
build() {
  local name="$1" tree="$2" targets="$3"
  shift 3
  local work="$tree/../build-$name"
  echo "== building $name with ThreadSanitizer (errors are printed)" >&2
  cmake -S "$tree" -B "$work" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_STANDARD=17 \
    -DBUILD_SHARED_LIBS=ON -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR=lib \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$opt" \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="$opt" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" "$@" \
    >"$work.configure.log" 2>&1 || { tail -20 "$work.configure.log" >&2; return 1; }
  local t=()
  for x in $targets; do t+=(--target "$x"); done
  local start=$SECONDS
  cmake --build "$work" -j"$jobs" "${t[@]}" >"$work.build.log" 2>&1 ||
    { grep -E "error|FAILED" "$work.build.log" | head -20 >&2; return 1; }
  echo "== $name built in $(((SECONDS - start) / 60)) minutes" >&2
}

mkdir -p "$prefix/lib"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Abseil: Debian's patches set its inline namespace (the ABI Tandem's programs were linked against).
version="$(installed libabsl-dev)"
if [[ "$(cat "$prefix/.abseil-version" 2>/dev/null)" != "$version" ]]; then
  tree="$(debian_source abseil a/abseil "$version" "$work")"
  grep -q "ABSL_OPTION_INLINE_NAMESPACE_NAME debian" "$tree/absl/base/options.h" ||
    { echo "build_tsan_deps: Debian's patches did not set Abseil's inline namespace" >&2; exit 1; }
  build abseil "$tree" "" -DBUILD_TESTING=OFF
  cmake --install "$work/build-abseil" >/dev/null
  echo "$version" >"$prefix/.abseil-version"
fi

# gRPC: debian/rules' options (every dependency the system's package), the libraries only.
version="$(installed libgrpc++-dev)"
if [[ "$(cat "$prefix/.grpc-version" 2>/dev/null)" != "$version" ]]; then
  tree="$(debian_source grpc g/grpc "$version" "$work")"
  libs="grpc++ grpc gpr upb address_sorting"
  # (Configuring asks for libprotoc even without the code generators, which alone would link it.)
  protoc="$(ls /usr/lib/"$arch"/libprotoc.so* 2>/dev/null | head -1)"
  build grpc "$tree" "$libs" -DgRPC_BUILD_TESTS=OFF -DgRPC_BUILD_CODEGEN=OFF \
    -DgRPC_ABSL_PROVIDER=package -DgRPC_CARES_PROVIDER=package -DgRPC_PROTOBUF_PROVIDER=package \
    -DgRPC_RE2_PROVIDER=package -DgRPC_SSL_PROVIDER=package -DgRPC_ZLIB_PROVIDER=package \
    -DgRPC_BACKWARDS_COMPATIBILITY_MODE=OFF \
    -DProtobuf_PROTOC_LIBRARY="$protoc"
  for l in $libs; do  # the shared objects and their soname links (libgrpc.so.29 -> ...)
    cp -P "$work/build-grpc/lib$l.so".* "$prefix/lib/"
  done
  echo "$version" >"$prefix/.grpc-version"
fi
echo "$prefix/lib"
