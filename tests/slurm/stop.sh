#!/usr/bin/env bash
# Stop the daemons tests/slurm/start.sh started, by the PIDs it recorded (never by name).
# Cancels the cluster's remaining jobs first; a munged that start.sh reused is left running.
set -uo pipefail

DIR="${EVIL_MOE_SLURM_DIR:-/tmp/evil_moe_slurm}"
PIDS="$DIR/pids"
export SLURM_CONF="$DIR/etc/slurm.conf"

source "$(dirname "$0")/pids.sh"  # runs FILE PROGRAM

if runs "$PIDS/slurmctld.pid" slurmctld; then
  scancel --user="$(id -un)" 2>/dev/null || true
fi

stop_pid() {  # name
  local file="$PIDS/$1.pid" pid
  [[ -s "$file" ]] || return 0
  pid="$(cat "$file")"
  if runs "$file" "$1"; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "stop.sh: $1 ($pid) ignored SIGTERM; sending SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
    echo "stopped $1 ($pid)"
  fi
  rm -f "$file"
}

stop_pid slurmd
stop_pid slurmctld
stop_pid munged
if [[ -L /etc/slurm/slurm.conf && "$(readlink /etc/slurm/slurm.conf)" == "$SLURM_CONF" ]]; then
  rm -f /etc/slurm/slurm.conf
fi
exit 0
