#!/usr/bin/env bash
# `make install PREFIX=/opt/azprobe`: the package in its own venv, the systemd units, and
# example configs. Idempotent: re-running upgrades the package and the units, and never
# touches a config that already exists (operators own /etc/azprobe).
#
# Overridable for packaging and tests (defaults in brackets):
#   SYSTEMD_UNIT_DIR [/etc/systemd/system]   AZPROBE_CONFIG_DIR [/etc/azprobe]
#   PYTHON_SYSTEM [/usr/bin/python3]         PIP_INSTALL_ARGS [] extra pip flags
#   AZPROBE_COMPILE [1]: 0 installs the controller as plain Python (no C compiler needed)
set -euo pipefail

PREFIX=${1:-/opt/azprobe}
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
UNIT_DIR=${SYSTEMD_UNIT_DIR:-/etc/systemd/system}
CONFIG_DIR=${AZPROBE_CONFIG_DIR:-/etc/azprobe}
PYTHON_SYSTEM=${PYTHON_SYSTEM:-/usr/bin/python3}
read -r -a PIP_ARGS <<< "${PIP_INSTALL_ARGS:-}"

log() { printf 'install: %s\n' "$*"; }

case "$PREFIX" in
  /*) ;;
  *) echo "install: PREFIX must be an absolute path, got '$PREFIX' (e.g. make install PREFIX=/opt/azprobe)" >&2; exit 2 ;;
esac

# 0. The build compiles the controller's per-cycle modules (setup.py): say what is missing
#    here, in one line, rather than in pip's wall of compiler output.
if [ "${AZPROBE_COMPILE:-1}" != 0 ]; then
  cc=${CC:-$("$PYTHON_SYSTEM" -c 'import sysconfig; print(sysconfig.get_config_var("CC") or "cc")')}  # as setuptools picks it
  cc=${cc%% *}
  headers=$("$PYTHON_SYSTEM" -c 'import os, sysconfig; print(os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")))')
  if ! command -v "$cc" >/dev/null || [ "$headers" != True ]; then
    echo "install: building azprobe compiles the controller's modules and needs a C compiler ($cc) and the Python headers: apt-get install gcc python3-dev, or AZPROBE_COMPILE=0 for plain Python (about 1.6 times the controller's CPU)" >&2
    exit 2
  fi
fi

# 1. The venv, with only `bcc` exposed from the system (as the Makefile does for .venv).
if [ ! -x "$PREFIX/bin/python" ]; then
  log "creating venv $PREFIX"
  "$PYTHON_SYSTEM" -m venv "$PREFIX"
fi
site=$("$PREFIX/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ ! -e "$site/bcc" ]; then
  if [ -d /usr/lib/python3/dist-packages/bcc ]; then
    ln -s /usr/lib/python3/dist-packages/bcc "$site/bcc"
    log "linked bcc into $site"
  else
    log "warning: /usr/lib/python3/dist-packages/bcc missing; the agent needs python3-bpfcc (the controller does not)"
  fi
fi
# A regular (non-editable) install: the daemons must not run from a source checkout.
log "installing azprobe from $SRC"
AZPROBE_WITHOUT_DEVTOOLS=1 "$PREFIX/bin/python" -m pip install -q --disable-pip-version-check "${PIP_ARGS[@]}" "$SRC"
install -m 0644 "$SRC/README.md" "$PREFIX/README.md" 2>/dev/null || true

# 2. Units: package-owned, so always refreshed; their paths follow PREFIX and CONFIG_DIR.
mkdir -p "$UNIT_DIR"
for unit in azprobe-agent.service azprobe-controller.service azprobe-scheduler-extender.service; do
  tmp=$(mktemp)
  sed -e "s#/opt/azprobe/#$PREFIX/#g" -e "s#/etc/azprobe/#$CONFIG_DIR/#g" "$SRC/systemd/$unit" > "$tmp"
  if cmp -s "$tmp" "$UNIT_DIR/$unit"; then
    rm -f "$tmp"
  else
    install -m 0644 "$tmp" "$UNIT_DIR/$unit"
    rm -f "$tmp"
    log "installed $UNIT_DIR/$unit"
  fi
done

# 3. Configs: operator-owned, so only when absent.
install -d -m 0755 "$CONFIG_DIR"
for config in agent.toml controller.toml scheduler-extender.toml; do
  if [ -e "$CONFIG_DIR/$config" ]; then
    log "kept existing $CONFIG_DIR/$config"
  else
    install -m 0644 "$SRC/systemd/$config" "$CONFIG_DIR/$config"
    log "installed example $CONFIG_DIR/$config (edit [topology] / [consul] before starting)"
  fi
done

# 4. Tell systemd, when it is the running init (not in containers or chroots).
if [ -d /run/systemd/system ] && [ "$UNIT_DIR" = /etc/systemd/system ]; then
  systemctl daemon-reload
  log "systemctl daemon-reload done"
fi
log "done: run '$PREFIX/bin/azprobe doctor --role agent|controller --config $CONFIG_DIR/<role>.toml', then 'systemctl enable --now azprobe-agent' (or azprobe-controller)"
