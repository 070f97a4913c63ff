#!/bin/bash
# An independent one-node Slurm site, built from scratch as an admin would build it; it uses
# nothing of the repository's own test cluster (tests/slurm/one_node_slurm.sh).
#
#   site-cluster.sh up [comment|nocomment]   build and start it (accounting stores job
#                                             comments, or not: AccountingStoreFlags)
#   site-cluster.sh restart comment|nocomment  restart slurmctld/slurmdbd with the other flag
#   site-cluster.sh down                      scancel all, stop every daemon by PID, remove
#                                             the config, the user's processes, /opt/site
#
# The site: Debian 12's Slurm 22.05 (slurm-wlm, slurmdbd, munge) and MariaDB 10.11, Lmod 8.6.
#  * SlurmUser=slurm (slurmctld and slurmdbd run as the `slurm` user; slurmd as root).
#  * cgroup v1 (what this machine mounts): proctrack/cgroup, task/cgroup + task/affinity,
#    jobacct_gather/cgroup; cgroup.conf constrains cores and RAM (a job over its --mem is
#    killed by the kernel's OOM killer and ends OUT_OF_MEMORY). Devices are not constrained:
#    the fake GPUs are character devices 1:3 (as /dev/null), which a device cgroup would
#    take from every job that does not hold them.
#  * Two fake GPU types, one each: gres gpu:a100 and gpu:l40s (File= char devices: Slurm
#    22.05 drops file-less GPUs from gres.conf and refuses regular files).
#  * Two partitions: `gpu` (default, 4 h) and `debug` (30 min).
#  * Accounting (slurmdbd + MariaDB, enforced: associations,limits,qos,safe): accounts
#    `physics` (GrpTRES gres/gpu=2) and `teaching` (MaxTRES per job: cpu=1, mem=1000M), QOS
#    `normal` and `q45` (MaxWall 45 min), user `alice` (ordinary, not root) in both accounts,
#    default physics/normal.
#  * A site Python as an Lmod module (python/3.11: a copy of this machine's Python 3.11 with
#    its packages, the cudalab install removed) and cuda/13.0 (nvcc of /usr/local/bin).
set -euo pipefail
CMD=${1:?usage: site-cluster.sh up|restart|down [comment|nocomment]}
FLAG=${2:-comment}
SITE=/opt/site
S=/var/lib/indep-slurm          # state: spool, logs, pids, MariaDB
HOST=$(hostname -s)
NCPU=$(nproc)
MEM=$(( $(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 / 2 ))
SRC_PY=/root/.pyenv/versions/3.11.7
ETC=/etc/slurm

conf() {
  local store=""
  [ "$FLAG" = comment ] && store="AccountingStoreFlags=job_comment"
  mkdir -p "$ETC"
  cat > $ETC/slurm.conf <<CONF
# independent site cluster (reports/reference/slurm-independent-2026-11-27/site-cluster.sh)
ClusterName=indep
SlurmctldHost=${HOST}(127.0.0.1)
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
StateSaveLocation=$S/ctld
SlurmdSpoolDir=$S/d
SlurmctldPidFile=$S/run/slurmctld.pid
SlurmdPidFile=$S/run/slurmd.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd.log
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup,task/affinity
JobAcctGatherType=jobacct_gather/cgroup
JobAcctGatherFrequency=task=5
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageEnforce=associations,limits,qos,safe
AccountingStorageTRES=gres/gpu,gres/gpu:a100,gres/gpu:l40s
$store
JobCompType=jobcomp/none
ReturnToService=2
NodeName=${HOST} NodeAddr=127.0.0.1 CPUs=${NCPU} RealMemory=${MEM} Gres=gpu:a100:1,gpu:l40s:1 State=UNKNOWN
PartitionName=gpu Nodes=${HOST} Default=YES MaxTime=04:00:00 State=UP
PartitionName=debug Nodes=${HOST} MaxTime=00:30:00 State=UP
CONF
  cat > $ETC/gres.conf <<CONF
NodeName=${HOST} Name=gpu Type=a100 File=$SITE/dev/gpu0
NodeName=${HOST} Name=gpu Type=l40s File=$SITE/dev/gpu1
CONF
  cat > $ETC/cgroup.conf <<CONF
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
ConstrainCores=yes
ConstrainRAMSpace=yes
AllowedRAMSpace=100
ConstrainSwapSpace=yes
AllowedSwapSpace=0
ConstrainDevices=no
CONF
  cat > $ETC/slurmdbd.conf <<CONF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=slurm
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3307
StorageUser=slurmdbd
StoragePass=indep-site-pw
StorageLoc=indep_acct
PidFile=$S/run/slurmdbd.pid
LogFile=$S/log/slurmdbd.log
CONF
  chown slurm:slurm $ETC/slurmdbd.conf
  chmod 600 $ETC/slurmdbd.conf
}

site_python() {
  # the site's Python module: a copy of this machine's Python and packages, without cudalab
  [ -x $SITE/python/3.11/bin/python3.11 ] && return
  mkdir -p $SITE/python
  cp -a $SRC_PY $SITE/python/3.11
  rm -rf $SITE/python/3.11/lib/python3.11/site-packages/{__editable__*cudalab*,cudalab-*.dist-info}
  rm -f $SITE/python/3.11/bin/cudalab
  grep -rlI "^#!$SRC_PY" $SITE/python/3.11/bin | xargs -r sed -i "1s|^#!$SRC_PY|#!$SITE/python/3.11|"
}

modules() {
  mkdir -p $SITE/modulefiles/python $SITE/modulefiles/cuda
  cat > $SITE/modulefiles/python/3.11.lua <<'LUA'
whatis("Python 3.11 with the site's scientific stack")
prepend_path("PATH", "/opt/site/python/3.11/bin")
LUA
  cat > $SITE/modulefiles/cuda/13.0.lua <<'LUA'
whatis("CUDA toolkit 13.0 (nvcc)")
setenv("CUDA_HOME", "/usr/local")
prepend_path("PATH", "/usr/local/bin")
LUA
  echo 'export MODULEPATH=/opt/site/modulefiles${MODULEPATH:+:$MODULEPATH}' \
    > /etc/profile.d/z90-indep-site-modules.sh
}

mariadb_up() {
  install -d -o mysql -g mysql $S/mysql $S/mysqlrun
  if [ ! -d $S/mysql/mysql ]; then
    mariadb-install-db --user=mysql --datadir=$S/mysql --skip-test-db \
      --auth-root-authentication-method=socket > $S/log/mariadb-install.log 2>&1
  fi
  mariadbd --user=mysql --datadir=$S/mysql --socket=$S/mysqlrun/sock \
    --pid-file=$S/mysqlrun/mariadb.pid --bind-address=127.0.0.1 --port=3307 \
    --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900 \
    --log-error=$S/log/mariadb.log > /dev/null 2>&1 &
  for _ in $(seq 120); do mariadb --socket=$S/mysqlrun/sock -u root -e 'select 1' >/dev/null 2>&1 && break; sleep 0.25; done
  mariadb --socket=$S/mysqlrun/sock -u root -e "
    CREATE DATABASE IF NOT EXISTS indep_acct;
    CREATE USER IF NOT EXISTS 'slurmdbd'@'127.0.0.1' IDENTIFIED BY 'indep-site-pw';
    GRANT ALL ON indep_acct.* TO 'slurmdbd'@'127.0.0.1';"
}

dbd_up() {
  slurmdbd
  for _ in $(seq 100); do sacctmgr -n list cluster >/dev/null 2>&1 && return; sleep 0.2; done
  echo "slurmdbd does not answer" >&2; tail -20 $S/log/slurmdbd.log >&2; exit 1
}

associations() {
  sacctmgr -i add cluster indep > /dev/null || true
  sacctmgr -i add qos q45 MaxWall=00:45:00 > /dev/null || true
  sacctmgr -i add account physics Cluster=indep Description=physics Organization=uni \
    > /dev/null || true
  sacctmgr -i add account teaching Cluster=indep Description=teaching Organization=uni \
    MaxTRES=cpu=1,mem=1000M > /dev/null || true
  sacctmgr -i add user alice Account=physics,teaching DefaultAccount=physics > /dev/null || true
  sacctmgr -i modify user alice set QOS=normal,q45 DefaultQOS=normal > /dev/null || true
  sacctmgr -i add user root Account=physics DefaultAccount=physics > /dev/null || true
}

ctld_up() {
  slurmctld
  slurmd
  local st=""
  for _ in $(seq 120); do
    st=$(sinfo -h -N -o %T 2>/dev/null | sort -u | paste -sd,)
    [ "$st" = idle ] && break
    sleep 0.5
  done
  sinfo -o '%P %N %T %c %m %G %l'
  [ "$st" = idle ] || { echo "node not idle: $st" >&2; tail -30 $S/log/slurm*.log >&2; exit 1; }
}

up() {
  if [ -f $ETC/slurm.conf ] && ! grep -q "independent site cluster" $ETC/slurm.conf; then
    echo "$ETC/slurm.conf is another cluster's: stop it first" >&2; exit 1
  fi
  id alice >/dev/null 2>&1 || useradd -m -s /bin/bash alice
  mkdir -p $S/{ctld,d,run,log} $SITE/dev
  chown -R slurm:slurm $S/ctld $S/log $S/run
  for i in 0 1; do [ -e $SITE/dev/gpu$i ] || mknod -m 666 $SITE/dev/gpu$i c 1 3; done
  site_python
  modules
  conf
  if ! { [ -f /run/munge/munged.pid ] && kill -0 "$(cat /run/munge/munged.pid)" 2>/dev/null; }; then
    install -d -o munge -g munge -m 0755 /run/munge
    [ -f /etc/munge/munge.key ] || mungekey -c -k /etc/munge/munge.key
    runuser -u munge -- /usr/sbin/munged
  fi
  mariadb_up
  dbd_up
  associations
  ctld_up
  # gres/gpu is a TRES only once slurmctld has registered AccountingStorageTRES
  sacctmgr -i modify account physics set GrpTRES=gres/gpu=2 > /dev/null
  sacctmgr -n -P show assoc format=Account,User,QOS,DefaultQOS,GrpTRES,MaxTRES
  sacctmgr -n -P show qos format=Name,MaxWall
}

stop_pid() {
  local f=$1 p
  [ -f "$f" ] || return 0
  p=$(cat "$f"); kill "$p" 2>/dev/null || return 0
  for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || return 0; sleep 0.2; done
  echo "pid $p ($f) still alive: SIGKILL" >&2; kill -9 "$p"
}

restart() {
  stop_pid $S/run/slurmctld.pid
  stop_pid $S/run/slurmdbd.pid
  conf
  dbd_up
  slurmctld
  sleep 2
  scontrol show config | grep -i "AccountingStoreFlags" || echo "AccountingStoreFlags = (none)"
}

down() {
  scancel --user=alice 2>/dev/null || true
  scancel --user=root 2>/dev/null || true
  for f in $S/run/slurmd.pid $S/run/slurmctld.pid $S/run/slurmdbd.pid $S/mysqlrun/mariadb.pid; do
    stop_pid "$f"
  done
  if [ -f /run/munge/munged.pid ]; then stop_pid /run/munge/munged.pid; fi
  if grep -qs "independent site cluster" $ETC/slurm.conf; then
    rm -f $ETC/slurm.conf $ETC/gres.conf $ETC/cgroup.conf $ETC/slurmdbd.conf
  fi
  rm -f /etc/profile.d/z90-indep-site-modules.sh
}
"$CMD"
