#!/usr/bin/env bash
# Makes a private CA and certificates signed by it, for Tandem's TLS (docs/security.md): one
# certificate per name given, each good as both server and client certificate (mutual TLS), with
# the subject alternative names given. For development, tests and small clusters; a production
# cluster takes its certificates from its own CA (cert-manager on Kubernetes).
#
# Usage: scripts/make_certs.sh OUT_DIR NAME[:SAN,SAN...] ...
#   scripts/make_certs.sh certs node:IP:127.0.0.1,DNS:localhost
# writes certs/ca.pem, certs/ca.key (kept only to sign more), certs/node.pem and certs/node.key.
# An existing OUT_DIR/ca.pem and ca.key are reused, so more names can be added later.
# Env: CA_NAME (the CA's common name, default tandem-ca), DAYS (validity, default 365).
set -euo pipefail
if (($# < 2)); then
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
out=$1
shift
command -v openssl >/dev/null || { echo "make_certs: openssl is not installed" >&2; exit 1; }
mkdir -p "$out"
days=${DAYS:-365}
curve=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
if [[ ! -f $out/ca.pem || ! -f $out/ca.key ]]; then
  openssl req -x509 "${curve[@]}" -keyout "$out/ca.key" -out "$out/ca.pem" -days "$days" \
    -subj "/CN=${CA_NAME:-tandem-ca}" -addext basicConstraints=critical,CA:TRUE \
    -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
fi
for spec in "$@"; do
  name=${spec%%:*}
  san=""
  [[ $spec == *:* ]] && san=${spec#*:}
  [[ -n $name ]] || { echo "make_certs: empty name in '$spec'" >&2; exit 2; }
  ext=$(mktemp)
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=serverAuth,clientAuth"
    [[ -n $san ]] && echo "subjectAltName=$san"
  } >"$ext"
  openssl req "${curve[@]}" -keyout "$out/$name.key" -out "$out/$name.csr" -subj "/CN=$name" 2>/dev/null
  openssl x509 -req -in "$out/$name.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" -CAcreateserial \
    -out "$out/$name.pem" -days "$days" -extfile "$ext" 2>/dev/null
  rm -f "$ext" "$out/$name.csr"
  chmod 600 "$out/$name.key"
  echo "make_certs: $out/$name.pem ($name${san:+, $san}), signed by $out/ca.pem"
done
