#!/usr/bin/env bash
# Start a real single-node Slurm (munge + slurmctld + slurmd, one fake GPU) on localhost.
#
# Installs nothing: the packages (Debian slurmctld slurmd slurm-client munge) must be present
# (.ci/run installs them). Writes slurm.conf and gres.conf under a state dir and records every
# daemon's PID there, so tests/slurm/stop.sh stops exactly what this script started.
# Needs root (slurmd runs jobs as the submitting user). Pitfalls met on a single node: see the
# comments below and docs/slurm.md ("The test cluster").
#
#   tests/slurm/start.sh            # state dir $EVIL_MOE_SLURM_DIR or /tmp/evil_moe_slurm
# Clients (sinfo, sbatch, srun) find the config through /etc/slurm/slurm.conf, a link into the
# state dir made here (refused if a real config is there); stop.sh removes the link.
#   tests/slurm/stop.sh
set -euo pipefail

DIR="${EVIL_MOE_SLURM_DIR:-/tmp/evil_moe_slurm}"
ETC="$DIR/etc"
PIDS="$DIR/pids"
LOGS="$DIR/logs"
export SLURM_CONF="$ETC/slurm.conf"

die() { echo "tests/slurm/start.sh: $*" >&2; exit 1; }
source "$(dirname "$0")/pids.sh"  # runs FILE PROGRAM
alive() { runs "$PIDS/$1.pid" "$1"; }

for exe in munged munge unmunge slurmctld slurmd sinfo scontrol; do
  command -v "$exe" >/dev/null || [[ -x "/usr/sbin/$exe" ]] || die "$exe not found (apt-get install slurmctld slurmd slurm-client munge)"
done
[[ $(id -u) -eq 0 ]] || die "must run as root (slurmd and munged are started by hand)"

node_state() { sinfo -h -N -o '%T' 2>/dev/null | head -n1; }

wait_idle() {
  local state=""
  for _ in $(seq 1 120); do
    state="$(node_state || true)"
    case "$state" in
      idle|mixed|allocated) echo "slurm: node $(hostname -s) is $state (SLURM_CONF=$SLURM_CONF)"; return 0 ;;
      *inval*|*drain*|*drng*|*fail*|*down*\**)
        scontrol show node >&2 || true
        die "node is '$state' (not usable); see $LOGS and wipe $DIR before retrying" ;;
    esac
    sleep 0.5
  done
  scontrol show node >&2 || true
  die "node did not become idle within 60 s (last state '${state:-none}'); logs in $LOGS"
}

if alive slurmctld && alive slurmd; then
  echo "slurm: already running from $DIR"
  wait_idle
  exit 0
fi

# A stale state dir from a bad start (e.g. an INVAL node) poisons the next one: start clean.
rm -rf "$DIR/state" "$LOGS"
mkdir -p "$ETC" "$PIDS" "$LOGS" "$DIR/state/ctld" "$DIR/state/d"

# --- munge ---------------------------------------------------------------------------------
if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  echo "munge: already running (reused, not recorded: stop.sh leaves it alone)"
else
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  [[ -s /etc/munge/munge.key ]] || die "/etc/munge/munge.key missing (the munge package creates it)"
  runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
  for _ in $(seq 1 50); do [[ -s /run/munge/munged.pid ]] && break; sleep 0.1; done
  cp /run/munge/munged.pid "$PIDS/munged.pid"
  munge -n | unmunge >/dev/null || die "munge does not work after starting munged"
fi

# --- slurm.conf / gres.conf -----------------------------------------------------------------
HOST="$(hostname -s)"
# CPU layout exactly as slurmd sees it (plain CPUs=N makes slurmd complain about boundaries).
LAYOUT="$(slurmd -C | head -n1 | tr ' ' '\n' | grep -E '^(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore)=' | tr '\n' ' ')"
MEM_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))

# Fake GPUs: each needs a File= (without one the node goes INVAL); plain files stand in for
# device nodes. Several, so that the pilots (gpu: 1 each) can run side by side.
NGPU="${EVIL_MOE_SLURM_GPUS:-4}"
mkdir -p "$DIR/dev"
for i in $(seq 0 $((NGPU - 1))); do : > "$DIR/dev/gpu$i"; done

cat > "$ETC/slurm.conf" <<CONF
# Written by tests/slurm/start.sh: a single-node test cluster with $NGPU fake GPUs.
ClusterName=evilmoe
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
StateSaveLocation=$DIR/state/ctld
SlurmdSpoolDir=$DIR/state/d
SlurmctldPidFile=$PIDS/slurmctld.daemon.pid
SlurmdPidFile=$PIDS/slurmd.daemon.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
# No accounting: sacct does not work, so the Snakemake plugin must use squeue, which only sees
# jobs for MinJobAge seconds after they end (keep it >= 3 x init-seconds-before-status-checks).
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MinJobAge=600
# Refuse impossible requests at submit time instead of leaving them PENDING for ever.
EnforcePartLimits=ALL
DefMemPerCPU=1024
GresTypes=gpu
NodeName=$HOST NodeAddr=127.0.0.1 $LAYOUT RealMemory=$MEM_MB Gres=gpu:$NGPU State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
CONF

cat > "$ETC/gres.conf" <<CONF
AutoDetect=off
NodeName=$HOST Name=gpu File=$DIR/dev/gpu[0-$((NGPU - 1))]
CONF

# Clients find the config at Slurm's default path too: the Snakemake plugin's job step drops
# every SLURM_* variable (SLURM_CONF included) before its nested srun. Link it there, but never
# replace a real cluster's config.
# A link left by another test cluster of ours (another state dir, e.g. from a machine image
# taken while one ran) is replaced when that cluster's slurmctld is no longer alive.
SYS_CONF=/etc/slurm/slurm.conf
MARK="# Written by tests/slurm/start.sh"
if [[ -L "$SYS_CONF" && "$(readlink "$SYS_CONF")" == "$SLURM_CONF" ]]; then
  :
elif [[ -L "$SYS_CONF" ]] && { [[ ! -e "$SYS_CONF" ]] || [[ "$(head -n1 "$SYS_CONF")" == "$MARK"* ]]; }; then
  OTHER_CONF="$(readlink "$SYS_CONF")"
  OTHER_DIR="$(dirname "$(dirname "$OTHER_CONF")")"
  if runs "$OTHER_DIR/pids/slurmctld.pid" slurmctld; then
    die "$SYS_CONF links to another test cluster that is running ($OTHER_DIR); stop it first: EVIL_MOE_SLURM_DIR=$OTHER_DIR tests/slurm/stop.sh"
  fi
  echo "slurm: replacing $SYS_CONF, a stale link to a stopped test cluster ($OTHER_CONF)"
  ln -sfn "$SLURM_CONF" "$SYS_CONF"
elif [[ -e "$SYS_CONF" || -L "$SYS_CONF" ]]; then
  die "$SYS_CONF exists and is not a test cluster's (not a link to a file this script wrote); not touching it"
else
  mkdir -p /etc/slurm
  ln -s "$SLURM_CONF" "$SYS_CONF"
fi

# --- daemons ---------------------------------------------------------------------------------
setsid nohup slurmctld -D -i -f "$SLURM_CONF" > "$LOGS/slurmctld.out" 2>&1 < /dev/null &
echo $! > "$PIDS/slurmctld.pid"
for _ in $(seq 1 100); do scontrol ping >/dev/null 2>&1 && break; sleep 0.1; done
scontrol ping >/dev/null 2>&1 || die "slurmctld did not answer; see $LOGS/slurmctld.log"

setsid nohup slurmd -D -f "$SLURM_CONF" > "$LOGS/slurmd.out" 2>&1 < /dev/null &
echo $! > "$PIDS/slurmd.pid"

wait_idle
