#!/usr/bin/env bash
# Makes a private CA and one certificate it signs, for TLS and mTLS between
# Trident's services on one machine (`trident up --tls`) and in tests:
#
#   tools/tls/make_certs.sh DIR [NAME] [SAN...]
#
# writes DIR/ca.crt, DIR/ca.key, DIR/tls.crt and DIR/tls.key (the layout of
# a Kubernetes kubernetes.io/tls Secret). The certificate's common name is
# NAME (default "trident"); it is valid for both server and client
# authentication, for localhost, 127.0.0.1 and ::1 plus each SAN given
# ("DNS:router.example" or "IP:10.0.0.7"), for 30 days. Keys are P-256.
# An existing DIR/ca.crt and ca.key are reused, so that a second call
# issues another certificate of the same CA. For production, use your own
# CA or cert-manager (see helm/trident/README.md).
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 DIR [NAME] [SAN...]" >&2
  exit 2
fi
dir="$1"
name="${2:-trident}"
shift $(($# >= 2 ? 2 : 1))
command -v openssl >/dev/null || { echo "$0: openssl is not installed" >&2; exit 1; }
mkdir -p "${dir}"
umask 077

sans="DNS:localhost,IP:127.0.0.1,IP:::1"
for san in "$@"; do sans="${sans},${san}"; done

if [[ ! -f "${dir}/ca.crt" || ! -f "${dir}/ca.key" ]]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "${dir}/ca.key" -out "${dir}/ca.crt" -days 30 -subj "/CN=${name} CA" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi

ext="$(mktemp)"
trap 'rm -f "${ext}" "${dir}/tls.csr"' EXIT
cat >"${ext}" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=${sans}
EXT
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "${dir}/tls.key" -out "${dir}/tls.csr" -subj "/CN=${name}" 2>/dev/null
openssl x509 -req -in "${dir}/tls.csr" -CA "${dir}/ca.crt" -CAkey "${dir}/ca.key" \
  -CAcreateserial -CAserial "${dir}/ca.srl" -out "${dir}/tls.crt" -days 30 \
  -extfile "${ext}" 2>/dev/null
chmod 0644 "${dir}/ca.crt" "${dir}/tls.crt"
echo "${dir}: ca.crt, tls.crt and tls.key for CN=${name} (${sans})"
