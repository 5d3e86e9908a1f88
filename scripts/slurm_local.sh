#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, for trying hydra/launcher=slurm and for the tests marked `slurm`:
# munged + slurmctld + slurmd on localhost, one partition `local` holding this node's CPUs and memory
# (`slurmd -C`). Everything (config, state, logs, sockets, munge key) lives in one dir,
# $NORMLAB_SLURM_DIR (default /tmp/normlab-slurm). Needs root and Debian's `slurm-wlm` and `munge` packages.
#
#   scripts/slurm_local.sh start    # idempotent; prints the export line the clients (sbatch, squeue) need
#   eval "$(scripts/slurm_local.sh env)"
#   scripts/slurm_local.sh status   # exit status 0 while the cluster answers
#   scripts/slurm_local.sh stop
#
# Why these settings: proctrack/linuxproc and task/none need no cgroups (containers often have none);
# OverSubscribe=FORCE:4: up to 4 jobs share a CPU (a job still gets the memory it asks for: --mem, mem_gb), as jobs
# of a local sweep share the cores, so that hydra.launcher.array_parallelism, not a 2-core machine, caps how many
# jobs run at once;
# cred_expire is SLURM's wait before a requeued job may start again (120 s by default), short here so that
# a requeue test waits seconds, not minutes; no slurmdbd, so `sacct` does not work (squeue/scontrol do).
set -euo pipefail

DIR=${NORMLAB_SLURM_DIR:-/tmp/normlab-slurm}
CONF=$DIR/slurm.conf
MUNGE_SOCKET=$DIR/munge/munge.socket.2
PARTITION=local
DAEMONS=(slurmd slurmctld munged) # stop order; started in reverse

die() {
  echo "slurm_local: $*" >&2
  exit 1
}

usage() { die "usage: $0 start|stop|status|env (got: ${1:-nothing})"; }

check_prerequisites() {
  local missing=()
  for c in munged mungekey slurmctld slurmd sbatch squeue scontrol; do
    command -v "$c" >/dev/null || missing+=("$c")
  done
  if ((${#missing[@]})); then
    die "missing ${missing[*]}; install Debian's packages: apt-get install slurm-wlm munge"
  fi
  [[ $(id -u) == 0 ]] || die "must run as root (slurmd runs jobs as their user; munged and slurmd as root here)"
}

export SLURM_CONF=$CONF

running() { # the cluster answers and its node takes jobs
  [[ -f $CONF ]] && scontrol ping 2>/dev/null | grep -q UP &&
    sinfo -h -p "$PARTITION" -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated|completing)'
}

write_config() {
  local node cpus mem
  node=$(hostname -s)
  read -r cpus mem < <(slurmd -C | awk '/^NodeName/ {for (i = 1; i <= NF; i++) {split($i, kv, "="); v[kv[1]] = kv[2]}
                                                       print v["CPUs"], v["RealMemory"]}')
  mkdir -p "$DIR"/{state/ctld,state/d,log,run}
  cat >"$CONF" <<EOF
# Written by scripts/slurm_local.sh: a single-node cluster in $DIR.
ClusterName=normlab
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10
StateSaveLocation=$DIR/state/ctld
SlurmdSpoolDir=$DIR/state/d
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldPort=${NORMLAB_SLURMCTLD_PORT:-6817}
SlurmdPort=${NORMLAB_SLURMD_PORT:-6818}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
KillWait=30
MinJobAge=3600
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=$PARTITION Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
}

start_munge() {
  mkdir -p "$DIR/munge" && chmod 700 "$DIR/munge"
  [[ -f $DIR/munge/munge.key ]] || mungekey --create --keyfile="$DIR/munge/munge.key" >/dev/null
  chmod 400 "$DIR/munge/munge.key"
  munged --force --socket="$MUNGE_SOCKET" --key-file="$DIR/munge/munge.key" --pid-file="$DIR/run/munged.pid" \
    --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed" 9>&-
}

stop() {
  local pid_file pid
  if running; then # the cluster's jobs first: slurmd waits for their steps to end
    scancel --full --user=root 2>/dev/null || true
    for _ in $(seq 600); do
      [[ -z $(squeue -h -t running,completing -o %i 2>/dev/null) ]] && break
      sleep 0.1
    done
  fi
  for d in "${DAEMONS[@]}"; do
    pid_file=$DIR/run/$d.pid
    [[ -f $pid_file ]] || continue
    pid=$(cat "$pid_file")
    if kill "$pid" 2>/dev/null; then
      for _ in $(seq 600); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
      done
      kill -0 "$pid" 2>/dev/null && die "$d (pid $pid) did not stop within 60 s; see $DIR/log/$d.log"
    fi
    rm -f "$pid_file"
  done
}

start() {
  check_prerequisites
  if running; then
    echo "slurm_local: already running in $DIR (partition $PARTITION)"
  else
    stop # leftovers of a cluster that half-started or whose node is down
    write_config
    start_munge
    slurmctld -i 9>&- # -i: ignore state files of an earlier cluster in this dir that do not match the config
    slurmd 9>&-       # 9>&-: the daemons must not hold the lock below
    for _ in $(seq 300); do
      running && break
      sleep 0.1
    done
    running || die "the cluster did not come up within 30 s; logs in $DIR/log"
    echo "slurm_local: running in $DIR (partition $PARTITION, $(sinfo -h -o '%c CPUs, %m MB'))"
  fi
  echo "export SLURM_CONF=$CONF"
}

mkdir -p "$(dirname "$DIR")"
exec 9>"$DIR.lock" # one start or stop at a time (pytest workers may start the cluster side by side)
flock 9

case ${1:-} in
start) start ;;
stop) stop && echo "slurm_local: stopped ($DIR kept)" ;;
status) if running; then sinfo -p "$PARTITION"; else die "not running (start it with: $0 start)"; fi ;;
env) echo "export SLURM_CONF=$CONF" ;;
*) usage "${1:-}" ;;
esac
