#!/usr/bin/env bash
# The PgBouncers the pooler tests run the services behind:
# - 1.24.1, built from Debian 13's source tarball into $PGBOUNCER_PREFIX (outside the
#   repository, so a fresh clone finds it built), the version the pooler tests target;
# - Debian 12's own package (1.18, /usr/sbin/pgbouncer), older than 1.21 (no prepared
#   statements in transaction mode), for the legacy test; its service is not started.
# Does nothing when both are there.
set -euo pipefail

VERSION=1.24.1
PREFIX=${PGBOUNCER_PREFIX:-/opt/jobqueue-tools/pgbouncer-$VERSION}
TARBALL_URL=http://deb.debian.org/debian/pool/main/p/pgbouncer/pgbouncer_$VERSION.orig.tar.gz
TARBALL_SHA256=da72a3aba13072876d055a3e58dd4aba4a5de4ed6148e73033185245598fd3e0
LEGACY=/usr/sbin/pgbouncer

built() { "$PREFIX/bin/pgbouncer" --version 2>/dev/null | grep -q "^PgBouncer $VERSION\$"; }

need_build=true
built && need_build=false
need_legacy=true
[ -x "$LEGACY" ] && need_legacy=false
$need_build || $need_legacy || exit 0

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null; then
    echo "install-pgbouncer: need root to install into $PREFIX and apt-get install" >&2
    exit 1
  fi
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive

# Removed on exit: the build directory, and policy-rc.d only if this script created it.
work=$(mktemp -d)
own_policy=
cleanup() {
  rm -rf "$work"
  if [ -n "$own_policy" ]; then "${sudo[@]}" rm -f "$own_policy"; fi
}
trap cleanup EXIT

packages=()
$need_legacy && packages+=(pgbouncer)
if $need_build; then
  for pkg in build-essential pkg-config libevent-dev libssl-dev libc-ares-dev curl ca-certificates; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
      || packages+=("$pkg")
  done
fi
if [ ${#packages[@]} -gt 0 ]; then
  # The pgbouncer package must not start its daemon here.
  policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    "${sudo[@]}" sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod +x $policy"
    own_policy=$policy
  fi
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
fi

if $need_build; then
  curl -sSf -o "$work/src.tar.gz" "$TARBALL_URL"
  echo "$TARBALL_SHA256  $work/src.tar.gz" | sha256sum -c --quiet -
  tar -xzf "$work/src.tar.gz" -C "$work"
  (
    cd "$work/pgbouncer-$VERSION"
    # The tarball ships the man pages already built: no pandoc needed.
    ./configure -q --prefix="$PREFIX" --with-cares --without-pam --without-systemd >/dev/null
    make -s -j "$(nproc)" pgbouncer >/dev/null 2>&1 || make pgbouncer >&2
  )
  "${sudo[@]}" install -D -m 0755 "$work/pgbouncer-$VERSION/pgbouncer" "$PREFIX/bin/pgbouncer"
  built || { echo "install-pgbouncer: $PREFIX/bin/pgbouncer is not PgBouncer $VERSION" >&2; exit 1; }
fi
