#!/bin/bash
# Independent one-node Slurm 22.05 cluster with accounting (slurmdbd + MariaDB), Lmod and
# two GPU types (fake char devices), for the acceptance test of issue 25.
#
#   setup.sh up   [STATE]   build + start   (STATE defaults to /opt/indep-cluster)
#   setup.sh down [STATE]   stop every daemon it started (by PID), restore /etc/slurm
#
# Debian 12, root. Packages: slurm-wlm munge mariadb-server slurmdbd lmod.
# Own ports (6917-6919, MariaDB 3316), so it does not collide
# with another cluster on this machine; slurm.conf must still be /etc/slurm/slurm.conf
# (the executor plugin strips SLURM_CONF inside jobs), so any existing one is backed up.
set -euo pipefail
CMD=${1:-up}
STATE=${2:-/opt/indep-cluster}
HERE=$(cd "$(dirname "$0")" && pwd)
HOST=$(hostname -s)
BACKUP=$STATE/etc-slurm-backup

down() {
  for p in slurmd slurmctld slurmdbd mysqld munged; do
    f=$STATE/run/$p.pid
    if [ -s "$f" ]; then
      pid=$(cat "$f")
      if kill -0 "$pid" 2>/dev/null; then
        kill "$pid" || true
        for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid" || true
      fi
      rm -f "$f"
    fi
  done
  # restore /etc/slurm exactly as found
  for f in slurm.conf gres.conf slurmdbd.conf cgroup.conf; do
    if [ -e "$BACKUP/$f" ]; then cp -a "$BACKUP/$f" /etc/slurm/$f
    elif [ -e "$BACKUP/.placed-$f" ]; then rm -f /etc/slurm/$f; fi
  done
  rm -rf "$BACKUP"
  echo "down: stopped, /etc/slurm restored"
}

if [ "$CMD" = down ]; then down; exit 0; fi

for pkg in slurm-wlm munge mariadb-server slurmdbd lmod; do
  dpkg -s $pkg >/dev/null 2>&1 || { echo "missing package $pkg: apt-get install -y slurm-wlm munge mariadb-server slurmdbd lmod"; exit 1; }
done

mkdir -p $STATE/{run,log,spool/ctld,spool/d,mysql,munge,dev,modules/cuda,modules/python,pybin} $BACKUP
chmod 700 $STATE/munge

# ---- fake GPUs: character devices (regular files are refused by slurmd) ----
[ -c $STATE/dev/fakegpu0 ] || mknod -m 666 $STATE/dev/fakegpu0 c 1 3
[ -c $STATE/dev/fakegpu1 ] || mknod -m 666 $STATE/dev/fakegpu1 c 1 3

# ---- munge: Slurm 22.05's persistent slurmdbd connection ignores AuthInfo=socket= and
# always uses the default /run/munge/munge.socket.2, so munged runs there (started only
# if no munged answers there already; then it is not ours to stop) ----
mkdir -p /run/munge
[ -s /etc/munge/munge.key ] || { dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
alive() { [ -s $STATE/run/$1.pid ] && kill -0 "$(cat $STATE/run/$1.pid)" 2>/dev/null; }
if ! alive munged && ! munge -n </dev/null >/dev/null 2>&1; then
  munged --socket=/run/munge/munge.socket.2 --pid-file=$STATE/run/munged.pid \
         --key-file=/etc/munge/munge.key --log-file=$STATE/log/munged.log \
         --seed-file=$STATE/munge/seed --force
fi

# ---- MariaDB (own datadir, TCP 127.0.0.1:3316) ----
if [ ! -d $STATE/mysql/mysql ]; then
  mariadb-install-db --user=root --datadir=$STATE/mysql --auth-root-authentication-method=normal >$STATE/log/mysql-install.log 2>&1
fi
alive mysqld || mysqld --user=root --datadir=$STATE/mysql --socket=$STATE/run/mysql.sock --port=3316 \
       --bind-address=127.0.0.1 --pid-file=$STATE/run/mysqld.pid \
       --log-error=$STATE/log/mysqld.log --innodb-lock-wait-timeout=900 </dev/null >/dev/null 2>&1 &
for _ in $(seq 1 60); do mysqladmin --socket=$STATE/run/mysql.sock ping >/dev/null 2>&1 && break; sleep 0.5; done
mysql --socket=$STATE/run/mysql.sock -uroot <<'SQL'
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmdbpass';
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmdbpass';
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
FLUSH PRIVILEGES;
SQL

# ---- config files into /etc/slurm (back up what is there) ----
for f in slurm.conf gres.conf slurmdbd.conf cgroup.conf; do
  if [ -e /etc/slurm/$f ] && [ ! -e $BACKUP/$f ] && [ ! -e $BACKUP/.placed-$f ]; then cp -a /etc/slurm/$f $BACKUP/$f
  elif [ ! -e /etc/slurm/$f ]; then touch $BACKUP/.placed-$f; fi
done
sed -e "s#@STATE@#$STATE#g" -e "s#@HOST@#$HOST#g" $HERE/slurm.conf    > /etc/slurm/slurm.conf
sed -e "s#@STATE@#$STATE#g" -e "s#@HOST@#$HOST#g" $HERE/gres.conf     > /etc/slurm/gres.conf
sed -e "s#@STATE@#$STATE#g" -e "s#@HOST@#$HOST#g" $HERE/slurmdbd.conf > /etc/slurm/slurmdbd.conf
chmod 600 /etc/slurm/slurmdbd.conf

# ---- daemons ----
alive slurmdbd || slurmdbd   # reads /etc/slurm/slurmdbd.conf (no -f option)
for _ in $(seq 1 60); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.5; done
sacctmgr -i add cluster indep >/dev/null 2>&1 || true
sacctmgr -i add account hpc-course Description="course" Organization=site >/dev/null 2>&1 || true
sacctmgr -i add user root Account=hpc-course DefaultAccount=hpc-course >/dev/null 2>&1 || true
alive slurmctld || slurmctld -f /etc/slurm/slurm.conf
alive slurmd || slurmd -f /etc/slurm/slurm.conf
for _ in $(seq 1 60); do sinfo -h -o %T 2>/dev/null | grep -q idle && break; sleep 0.5; done
scontrol update nodename=$HOST state=resume >/dev/null 2>&1 || true

# ---- Lmod module tree ----
NVCC_DIR=/usr/local/cuda-13.0/bin
[ -x $NVCC_DIR/nvcc ] || NVCC_DIR=$(dirname "$(readlink -f "$(command -v nvcc)")")
sed "s#@NVCC_DIR@#$NVCC_DIR#g" $HERE/modulefiles/cuda/13.0.lua > $STATE/modules/cuda/13.0.lua
sed "s#@STATE@#$STATE#g"       $HERE/modulefiles/python/3.11-system.lua > $STATE/modules/python/3.11-system.lua
ln -sf /usr/bin/python3 $STATE/pybin/python3
ln -sf /usr/bin/python3 $STATE/pybin/python

sinfo -o '%P %l %D %c %m %G %T'
sacctmgr -n list assoc format=cluster,account,user
echo "up: MODULEPATH=$STATE/modules"
