#!/usr/bin/env bash
# Prints the Debian packages whose shared libraries the given programs load
# (ldd), one per line, sorted: what a slim runtime image must install for
# them. Libraries no package owns (the CUDA runtime, from NVIDIA's packages)
# are reported on stderr and left out.
#
#   deploy/docker/runtime_packages.sh PROGRAM...
set -euo pipefail

for program in "$@"; do
  ldd "$program" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
done | sort -u | while read -r library; do
  # Debian 12 merged /lib into /usr/lib; dpkg knows each file by the path
  # its package shipped, which may be either.
  owner=""
  for candidate in "$library" "$(readlink -f "$library")" "${library/#\/usr\/lib/\/lib}" \
      "$(readlink -f "$library" | sed 's|^/usr/lib/|/lib/|')"; do
    if owner=$(dpkg-query -S "$candidate" 2>/dev/null); then
      break
    fi
    owner=""
  done
  if [ -z "$owner" ]; then
    echo "runtime_packages: no Debian package owns $library" >&2
    continue
  fi
  # "libfoo1:amd64: /usr/lib/..." -> "libfoo1"
  echo "${owner%%:*}"
done | sort -u
