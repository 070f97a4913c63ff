#!/bin/bash
# A real one-node Slurm cluster (slurmctld + slurmd + munged) for the project's tests.
#
#   tests/slurm/one_node_slurm.sh up   STATE_DIR   start it; prints the node line when idle
#   tests/slurm/one_node_slurm.sh down STATE_DIR   scancel everything, stop the daemons by PID
#
# Needs root and Debian's `slurm-wlm munge` (Slurm 22.05 on Debian 12). By default no
# accounting (no slurmdbd): use `slurm-status-command: squeue` in the Snakemake profile,
# because the executor plugin's default, sacct, hangs for ever without an accounting
# database. SLURM_ACCT=slurmdbd (needs Debian's `mariadb-server slurmdbd` too) adds
# accounting as a site has it: a MariaDB of our own (datadir $S/mysql, 127.0.0.1 only) and
# slurmdbd, AccountingStorageType=accounting_storage/slurmdbd and
# AccountingStoreFlags=job_comment, so sacct answers (the plugin's default status command)
# and shows the jobs' comments. About 3 s more to start, 1-2 s more to stop.
#
# Things that do not work otherwise (each was seen failing):
#  * the config lives at /etc/slurm/slurm.conf: the plugin's in-job step drops SLURM_CONF
#    before its inner srun, so a config elsewhere kills every job ("Could not establish a
#    configuration source"). We refuse to overwrite a slurm.conf that is not ours.
#  * GPUs in gres.conf need File= pointing at character devices; we make fake ones with
#    mknod (c 1 3, i.e. /dev/null) so `--gpus=1` jobs are schedulable on a GPU-less machine
#    and Slurm sets CUDA_VISIBLE_DEVICES for them.
#  * TaskPlugin=task/affinity (task/none prints a cpu-binding warning into every job log).
#  * MinJobAge=600 keeps finished jobs visible to squeue/scontrol (status via squeue).
#  * jobacct_gather/linux with OverMemoryKill (polled every second) enforces --mem
#    without cgroups (none in a container): a job over its mem_mb is killed as
#    OUT_OF_MEMORY, its log saying so, as under a site's cgroup limit.
#
# Env: FAKE_GPU_TYPES (default "fake:2"): the node's GPU models and counts, comma separated,
# e.g. "fake:2,h100:1" (two models: --gpus=fake:1 and --gpus=h100:1 are both schedulable,
# plain --gpus=1 takes any); SLURM_CPUS (default nproc; more than nproc oversubscribes).
# FAKE_GPUS / FAKE_GPU_TYPE (count and type of one model) are still read when
# FAKE_GPU_TYPES is unset. SLURM_MAX_TIME (default 60): the partition's MaxTime, minutes.
# Ports: 6817/6818 (slurmdbd 6819, MariaDB 3316), or the next free ones where daemons left
# by a killed run hold them.
set -euo pipefail

CMD=${1:?usage: one_node_slurm.sh up|down STATE_DIR}
S=$(realpath -m "${2:?usage: one_node_slurm.sh up|down STATE_DIR}")
CONF=/etc/slurm/slurm.conf
GRES=/etc/slurm/gres.conf
DBDCONF=/etc/slurm/slurmdbd.conf   # slurmdbd reads it there (it has no -f)
ACCT=${SLURM_ACCT:-none}
MARK="# written by cudalab tests/slurm/one_node_slurm.sh"

HOST=$(hostname -s)
NCPU=${SLURM_CPUS:-$(nproc)}
GPU_TYPES=${FAKE_GPU_TYPES:-${FAKE_GPU_TYPE:-fake}:${FAKE_GPUS:-2}}
# GPU_FILES="h100:/dev/nvidia0 /dev/nvidia1": real GPUs of one type (tools/gpu_slurm.sh)
if [ -n "${GPU_FILES:-}" ]; then
  read -ra REAL <<< "${GPU_FILES#*:}"
  GPU_TYPES="${GPU_FILES%%:*}:${#REAL[@]}"
fi
NGPU=0; GRES_NODE=""; GRES_LINES=""
for tc in ${GPU_TYPES//,/ }; do   # type:count -> one fake device file per GPU
  t=${tc%%:*}; c=${tc##*:}
  [[ "$t" =~ ^[A-Za-z0-9_]+$ && "$c" =~ ^[0-9]+$ && "$c" -gt 0 ]] || {
    echo "one_node_slurm.sh: bad FAKE_GPU_TYPES entry '$tc' (want type:count)" >&2; exit 1; }
  GRES_NODE+="${GRES_NODE:+,}gpu:$t:$c"
  GRES_LINES+="$t $NGPU $((NGPU + c - 1))"$'\n'
  NGPU=$((NGPU + c))
done
MEM=$(( $(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 / 2 ))
MAX_TIME=${SLURM_MAX_TIME:-60}   # the partition's time limit, minutes (PartitionTimeLimit)
case "$ACCT" in
  none|slurmdbd) ;;
  *) echo "one_node_slurm.sh: SLURM_ACCT=$ACCT (want none or slurmdbd)" >&2; exit 1 ;;
esac

die() { echo "one_node_slurm.sh: $*" >&2; exit 1; }
# A command that fails under set -e says nothing of itself (slurmctld logs to its file): name
# it, and show the daemons' logs, so a failed start is never silent.
on_err() {
  echo "one_node_slurm.sh: line $1: '$2' failed (exit $3)" >&2
  tail -n 20 "$S"/log/*.log >&2 2>/dev/null || true
}
trap 'on_err $LINENO "$BASH_COMMAND" $?' ERR

# the state dir named in our slurm.conf's first line ('' if none, or not ours)
conf_state() { [ -f "$CONF" ] && head -1 "$CONF" | sed -n "s|^$MARK (state: \(.*\))$|\1|p" || true; }

port_busy() { ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

ours() { [ ! -e "$1" ] || head -1 "$1" | grep -qF "$MARK"; }

acct_conf() {  # slurm.conf's accounting lines
  if [ "$ACCT" = slurmdbd ]; then
    local tres="gres/gpu" t
    for t in ${GPU_TYPES//,/ }; do tres+=",gres/gpu:${t%%:*}"; done
    printf '%s\n' "AccountingStorageType=accounting_storage/slurmdbd" \
      "AccountingStorageHost=127.0.0.1" "AccountingStoragePort=$DBD_PORT" \
      "AccountingStoreFlags=job_comment" "AccountingStorageTRES=$tres" \
      "AccountingStorageEnforce=associations,limits,qos"
  else
    echo "AccountingStorageType=accounting_storage/none"
  fi
}

# MariaDB (own datadir and port, 127.0.0.1 only) + slurmdbd, the cluster registered in it.
# slurmdbd reaches munged on its default socket (22.05 ignores AuthInfo=socket= there).
start_accounting() {
  local db=$S/mysql sock=$S/run/mysql.sock
  if [ ! -d "$db/mysql" ]; then
    mariadb-install-db --user=root --datadir="$db" --auth-root-authentication-method=normal \
      --skip-test-db > "$S/log/mysql-install.log" 2>&1
  fi
  # detached (setsid, no inherited fds): `up` returns while it runs; down stops it by PID
  setsid mariadbd --no-defaults --user=root --datadir="$db" --socket="$sock" \
    --port="$DB_PORT" --bind-address=127.0.0.1 --pid-file="$S/run/mysqld.pid" \
    --log-error="$S/log/mysqld.log" --skip-name-resolve --innodb-lock-wait-timeout=900 \
    --innodb-buffer-pool-size=64M --innodb-flush-log-at-trx-commit=0 --innodb-doublewrite=0 \
    --innodb-log-file-size=16M --innodb-buffer-pool-dump-at-shutdown=0 \
    --innodb-buffer-pool-load-at-startup=0 < /dev/null > /dev/null 2>&1 &
  for _ in $(seq 1 100); do
    mariadb --no-defaults --socket="$sock" -uroot -e 'select 1' > /dev/null 2>&1 && break
    sleep 0.1
  done
  mariadb --no-defaults --socket="$sock" -uroot -e \
    "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'cudalab-ci';
     GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" ||
    die "MariaDB did not start (see $S/log/mysqld.log)"
  # the password is a throw-away one of this local test database (127.0.0.1, tmp datadir)
  install -m 0600 /dev/null "$DBDCONF"
  cat > "$DBDCONF" <<DBD
$MARK (state: $S)
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$S/run/slurmdbd.pid
LogFile=$S/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=cudalab-ci
StorageLoc=slurm_acct_db
DBD
  slurmdbd   # daemonizes, pid -> $S/run/slurmdbd.pid
  local ok=""
  for _ in $(seq 1 100); do
    sacctmgr -n list cluster > /dev/null 2>&1 && { ok=1; break; }
    sleep 0.1
  done
  [ -n "$ok" ] || die "slurmdbd does not answer (see $S/log/slurmdbd.log)"
  # (a reused state dir has it already: sacctmgr then says so and exits 1)
  sacctmgr -i add cluster cudalab-ci > /dev/null || true
  add_limits
}

# Limits as a site sets them (AccountingStorageEnforce=limits applies them): QOS `short`
# allows 45 minutes a job (MaxWall), account `small` 1 CPU and 1000 MB a job (MaxTRES).
# The user keeps its default account (root) and QOS (normal, no limits), so other tests are
# not limited; a test picks `short` or `small` (sbatch --qos / -A) to meet a limit.
add_limits() {
  local me
  me=$(id -un)
  sacctmgr -i add qos short MaxWall=45 > /dev/null || true
  sacctmgr -i add account small Cluster=cudalab-ci > /dev/null || true
  sacctmgr -i add user "$me" Account=small Cluster=cudalab-ci > /dev/null || true
  sacctmgr -i modify user "$me" set QOS=normal,short DefaultQOS=normal > /dev/null
  sacctmgr -i modify user "$me" where Account=small set MaxTRES=cpu=1,mem=1000 > /dev/null
}

up() {
  [ "$(id -u)" = 0 ] || die "needs root"
  for b in slurmctld slurmd sbatch sinfo munged; do
    command -v "$b" >/dev/null || die "$b not found (apt-get install -y slurm-wlm munge)"
  done
  if [ "$ACCT" = slurmdbd ]; then
    for b in slurmdbd mariadbd mariadb-install-db mariadb sacctmgr; do
      command -v "$b" >/dev/null ||
        die "$b not found (SLURM_ACCT=slurmdbd: apt-get install -y mariadb-server slurmdbd)"
    done
  fi
  ours "$CONF" || die "$CONF exists and is not ours; not touching a real cluster's config"
  ours "$GRES" || die "$GRES exists and is not ours"
  ours "$DBDCONF" || die "$DBDCONF exists and is not ours"
  if alive "$S/run/slurmctld.pid" || alive "$S/run/slurmd.pid"; then
    die "already up in $S (run: $0 down $S)"
  fi
  local other
  other=$(conf_state)
  if [ -n "$other" ] && alive "$other/run/slurmctld.pid"; then
    die "another test cluster is up (state $other; its $CONF): run '$0 down $other' first"
  fi
  # Daemons whose config is gone (a test run killed before its teardown) may still hold
  # the default ports: take the next free pair instead of stopping processes not ours.
  PORT=6817
  while port_busy "$PORT" || port_busy $((PORT + 1)) || port_busy $((PORT + 2)); do
    PORT=$((PORT + 10))
  done
  DBD_PORT=$((PORT + 2))
  DB_PORT=3316
  while port_busy "$DB_PORT"; do DB_PORT=$((DB_PORT + 10)); done

  mkdir -p "$S"/{run,log,state/ctld,state/d,dev} /etc/slurm
  for i in $(seq 0 $((NGPU - 1))); do
    [ -n "${GPU_FILES:-}" ] || [ -e "$S/dev/gpu$i" ] || mknod -m 666 "$S/dev/gpu$i" c 1 3
  done

  cat > "$CONF" <<CONF
$MARK (state: $S)
ClusterName=cudalab-ci
SlurmctldHost=${HOST}(127.0.0.1)
SlurmctldPort=${PORT}
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$S/state/ctld
SlurmdSpoolDir=$S/state/d
SlurmctldPidFile=$S/run/slurmctld.pid
SlurmdPidFile=$S/run/slurmd.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=100
GresTypes=gpu
$(acct_conf)
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=1
JobAcctGatherParams=OverMemoryKill
JobCompType=jobcomp/none
MinJobAge=600
$( [ "$NCPU" -gt "$(nproc)" ] && echo SlurmdParameters=config_overrides )
NodeName=${HOST} NodeAddr=127.0.0.1 CPUs=${NCPU} RealMemory=${MEM} Gres=${GRES_NODE} State=UNKNOWN
PartitionName=gpu Nodes=${HOST} Default=YES MaxTime=${MAX_TIME} State=UP
CONF
  {
    echo "$MARK"
    while read -r t lo hi; do
      [ -n "$t" ] || continue
      f=$S/dev/gpu$lo; [ "$lo" = "$hi" ] || f="$S/dev/gpu[$lo-$hi]"
      if [ -n "${GPU_FILES:-}" ]; then  # one line per real device
        for f in "${REAL[@]}"; do echo "NodeName=$HOST Name=gpu Type=$t File=$f"; done
        continue
      fi
      echo "NodeName=$HOST Name=gpu Type=$t File=$f"
    done <<< "$GRES_LINES"
  } > "$GRES"

  # munge: reuse a running munged, else start one and remember that we did
  if alive /run/munge/munged.pid; then
    rm -f "$S/run/munged.ours"
  else
    if [ ! -s /etc/munge/munge.key ]; then
      install -d -o munge -g munge -m 0700 /etc/munge
      if command -v mungekey >/dev/null; then mungekey --create --keyfile=/etc/munge/munge.key
      else dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; fi
      chown munge:munge /etc/munge/munge.key; chmod 0400 /etc/munge/munge.key
    fi
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 1 50); do alive /run/munge/munged.pid && break; sleep 0.1; done
    alive /run/munge/munged.pid || die "munged did not start"
    touch "$S/run/munged.ours"
  fi

  [ "$ACCT" = none ] || start_accounting
  slurmctld -i   # -i: ignore missing state; daemonizes, pid -> $S/run/slurmctld.pid
  slurmd         # daemonizes, pid -> $S/run/slurmd.pid
  st=""
  for _ in $(seq 1 120); do
    st=$(sinfo -h -N -o %T 2>/dev/null || true)
    [ "$st" = idle ] && break
    sleep 0.5
  done
  sinfo -N -o '%N %P %T %c %m %G'
  if [ "$st" != idle ]; then
    echo "node not idle: '$st'" >&2
    tail -n 20 "$S"/log/*.log >&2 || true
    exit 1
  fi
}

stop_pid() {  # stop_pid PIDFILE: SIGTERM, wait up to 10 s, then SIGKILL
  local f=$1 p
  [ -f "$f" ] || return 0
  p=$(cat "$f")
  kill "$p" 2>/dev/null || { rm -f "$f"; return 0; }
  for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
  if kill -0 "$p" 2>/dev/null; then
    echo "pid $p ($f) still alive, SIGKILL" >&2
    kill -9 "$p" 2>/dev/null || true
  fi
  rm -f "$f"
}

down() {
  if alive "$S/run/slurmctld.pid"; then
    scancel --user="$(id -un)" 2>/dev/null || true
  fi
  # each daemon takes ~2 s to stop: two at a time, then the rest at once
  stop_pid "$S/run/slurmd.pid" & stop_pid "$S/run/slurmctld.pid" & wait
  stop_pid "$S/run/slurmdbd.pid" & stop_pid "$S/run/mysqld.pid" &
  if [ -f "$S/run/munged.ours" ]; then
    stop_pid /run/munge/munged.pid
    rm -f "$S/run/munged.ours"
  fi
  wait
  # only the config of this state dir: a failed `up` must not unplug another test cluster
  if [ "$(conf_state)" = "$S" ]; then rm -f "$CONF" "$GRES"; fi
  if [ -f "$DBDCONF" ] && [ "$(head -1 "$DBDCONF")" = "$MARK (state: $S)" ]; then
    rm -f "$DBDCONF"
  fi
  return 0
}

case "$CMD" in
  up) up ;;
  down) down ;;
  *) die "usage: one_node_slurm.sh up|down STATE_DIR" ;;
esac
