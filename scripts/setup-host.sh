#!/usr/bin/env bash
# Bring a fresh Debian machine to the state azprobe needs. Idempotent: every step checks
# first and only changes what is missing, so `make test` can run it every time.
set -euo pipefail

DEB_PACKAGES=(
  python3-bpfcc bpfcc-tools linux-headers-amd64   # BCC and the headers it compiles against
  python3-venv python3-dev gcc                     # the project's venv, C extensions, the compiled controller
  nftables iptables iproute2 ethtool               # the lab: loss, NFQUEUE delay, offloads
  libnetfilter-queue-dev                           # netfilterqueue (the lab's delay line)
  systemd                                          # systemd-analyze for the unit checks
  prometheus                                       # the Prometheus source tests; promtool for the rules
  nginx wrk                                        # bench/service_overhead.py: a service and its load
)

log() { printf 'setup: %s\n' "$*"; }

missing=()
for pkg in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" != 0 ]; then
    echo "setup: missing Debian packages: ${missing[*]}; run 'make setup' as root" >&2
    exit 2
  fi
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# BCC looks for /lib/modules/$(uname -r)/{build,source}. There are no headers for the
# running kernel here; Debian's generic ones are enough for tracepoint-only programs,
# because BCC builds tracepoint structs from tracefs. Create the links only where missing.
kdir="/lib/modules/$(uname -r)"
hdr_build=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1 || true)
hdr_common=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -n 1 || true)
if [ "$(id -u)" = 0 ] && [ -n "$hdr_build" ] && [ -n "$hdr_common" ]; then
  mkdir -p "$kdir"
  [ -e "$kdir/build" ] || { ln -s "$hdr_build" "$kdir/build"; log "linked $kdir/build -> $hdr_build"; }
  [ -e "$kdir/source" ] || { ln -s "$hdr_common" "$kdir/source"; log "linked $kdir/source -> $hdr_common"; }
fi

if [ "$(id -u)" = 0 ] && [ ! -e /sys/kernel/tracing/events ]; then
  mount -t tracefs nodev /sys/kernel/tracing && log "mounted tracefs"
fi
exit 0
