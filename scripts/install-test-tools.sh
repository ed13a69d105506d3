#!/usr/bin/env bash
# The system tools some tests drive: Debian's Chromium (dashboard browser tests),
# Prometheus's promtool (alert-rule unit tests) and PgBouncer (pooler tests, its own
# script). Installs whichever is missing, without starting any service the packages ship.
set -euo pipefail

bash "$(dirname "$0")/install-pgbouncer.sh"

missing=()
command -v chromium >/dev/null || missing+=(chromium)
command -v promtool >/dev/null || missing+=(prometheus)
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null; then
    echo "install-test-tools: need root to apt-get install ${missing[*]}" >&2
    exit 1
  fi
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
# Packages must not start their daemons here (the prometheus package would start a server).
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  "${sudo[@]}" sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod +x $policy"
  trap '"${sudo[@]}" rm -f "$policy"' EXIT
fi
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
