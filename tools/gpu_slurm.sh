#!/usr/bin/env bash
# The card's command on a real GPU under real Slurm: a one-node Slurm (slurmctld + slurmd +
# munged, Debian 12's Slurm 22.05) whose gres are the machine's /dev/nvidia* devices, typed
# by the GPU's model (h100, h200, ...), then `snakemake --profile profiles/slurm` on a small
# grid: a doctor job and measure jobs through sbatch with --gpus=<model>:1, telemetry, the
# table and the report.
#
#   tools/gpu_slurm.sh fetch [DEBS]        here (Debian 12, network): apt-get download the
#                                          Slurm and munge packages into DEBS (default .debs,
#                                          ignored through .git/info/exclude), about 4 MB
#   tools/gpu_slurm.sh run [DEBS] [WHL]    on the lent GPU machine (root, no network): unpack
#                                          them, install the wheels of WHL (default .whl,
#                                          tools/gpu_setup.sh), run, copy what it made to $OUT
#
# Slurm and munge are unpacked into / (their binaries find their plugins, slurmstepd and the
# munge socket by compiled-in paths; none of their files is the system's); the libraries they
# need are unpacked only where the system has none of that name, into /opt/gpu-slurm-libs.
# The config goes to /etc/slurm/slurm.conf (the executor plugin's job step reads no other).
set -euo pipefail
cd "$(dirname "$0")/.."
CMD=${1:?usage: tools/gpu_slurm.sh fetch|run [DEBS] [WHL]}
DEBS=${2:-.debs}
WHL=${3:-.whl}
# the daemons and the client commands; then the libraries a minimal image may lack
SLURM_PKGS="slurmctld slurmd slurm-client slurm-wlm-basic-plugins munge libmunge2"
LIB_PKGS="libhwloc15 libnuma1 liblua5.1-0 libjson-c5 libyaml-0-2 libreadline8 liblz4-1
  libdbus-1-3 libgcrypt20 libgpg-error0"
STATE=/tmp/gpu-slurm
LIBS=/opt/gpu-slurm-libs

fetch() {
  mkdir -p "$DEBS"
  grep -qx "/$DEBS/" .git/info/exclude 2>/dev/null || echo "/$DEBS/" >> .git/info/exclude
  (cd "$DEBS" && apt-get download $SLURM_PKGS $LIB_PKGS)
  du -sh "$DEBS"
}

unpack() {
  for p in $SLURM_PKGS; do dpkg -x "$(ls "$DEBS"/${p}_*.deb | head -1)" /; done
  for d in slurmctld slurmd slurmstepd; do  # Debian's postinst makes these (alternatives)
    [ -e /usr/sbin/$d ] || ln -s /usr/sbin/$d-wlm /usr/sbin/$d
  done
  mkdir -p "$LIBS"
  for p in $LIB_PKGS; do  # only a library the system lacks (never replace one of its own)
    local deb so
    deb=$(ls "$DEBS"/${p}_*.deb 2>/dev/null | head -1 || true)
    [ -n "$deb" ] || continue  # not carried: the image is expected to have it
    so=$(dpkg -c "$deb" | grep -o '[^/]*\.so\.[0-9]*' | head -1)  # its soname, lib*.so.N
    if [ -n "$so" ] && ! ldconfig -p | grep -q "$so"; then
      dpkg -x "$deb" "$LIBS"
      echo "gpu_slurm: $so from $deb"
    fi
  done
  find "$LIBS" -name '*.so*' -printf '%h\n' | sort -u > /etc/ld.so.conf.d/gpu-slurm.conf
  ldconfig
  id munge >/dev/null 2>&1 || useradd -r -M -d /var/lib/munge -s /usr/sbin/nologin munge
  slurmctld -V
}

gpu_model() {  # "NVIDIA H100 80GB HBM3" -> h100
  nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z' 'a-z' \
    | grep -o '\b[a-z][0-9]\{2,4\}[a-z]*\b' | head -1
}

run() {
  [ "$(id -u)" = 0 ] || { echo "gpu_slurm: needs root" >&2; exit 1; }
  unpack
  # shellcheck disable=SC1091
  source tools/gpu_setup.sh "$WHL"
  local model n files
  model=$(gpu_model)
  n=$(nvidia-smi -L | wc -l)
  files=$(ls /dev/nvidia[0-9]* | sort -V | tr '\n' ' ')
  echo "gpu_slurm: $n GPU(s), model $model, devices $files"
  rm -rf "$STATE" && mkdir -p "$STATE"
  # Slurm's cgroup/v2 plugin asks systemd (over dbus) for slurmstepd's scope; a container
  # without a dbus system bus kills slurmd at start ("cannot connect to dbus system daemon").
  # IgnoreSystemd makes slurmd create its cgroup directories itself.
  if [ -f /sys/fs/cgroup/cgroup.controllers ] && [ ! -S /run/dbus/system_bus_socket ]; then
    mkdir -p /etc/slurm /sys/fs/cgroup/system.slice  # where slurmd puts its stepd scope
    printf 'CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\nCgroupAutomount=yes\n' > /etc/slurm/cgroup.conf
    echo "gpu_slurm: cgroup v2 without dbus: cgroup.conf IgnoreSystemd=yes" \
      "(controllers: $(cat /sys/fs/cgroup/cgroup.controllers))"
  fi
  # the daemons' logs reach $OUT even when the cluster does not come up
  trap '[ -n "${OUT:-}" ] && cp "$STATE"/log/*.log "$OUT/" 2>/dev/null; true' EXIT
  GPU_FILES="$model:${files% }" SLURM_CPUS=$(nproc) bash tests/slurm/one_node_slurm.sh up "$STATE"
  trap 'bash tests/slurm/one_node_slurm.sh down "$STATE" || true' EXIT
  local wd=/tmp/gpu-slurm-run rc=0
  rm -rf "$wd" && mkdir -p "$wd"
  python3 - "$wd/config.yaml" "$model" <<'EOF'
import sys, yaml
cfg = yaml.safe_load(open("tools/smoke.gpu.yaml"))
cfg["slurm"] = {"gpu_model": sys.argv[2], "runtime_min": 30, "mem_mb": 16000,
                "cpus_per_task": 4}
yaml.safe_dump(cfg, open(sys.argv[1], "w"))
EOF
  t0=$(date +%s)
  timeout -s INT -k 30 500 snakemake -s "$PWD/Snakefile" --directory "$wd" \
    --configfile "$wd/config.yaml" --profile profiles/slurm --profile tests/slurm/profile \
    > "$wd/snakemake.log" 2>&1 || rc=$?
  echo "gpu_slurm: snakemake exit $rc after $(( $(date +%s) - t0 )) s"
  grep -E '^cudalab|submitted with SLURM jobid' "$wd/snakemake.log" || true
  squeue -h -t all -o '%i %j %k %T %b' || true
  cat "$wd"/results/doctor/*.md 2>/dev/null | head -30 || true
  python3 - "$wd" <<'EOF' || rc=1
import pathlib, sys
import pandas as pd
wd = pathlib.Path(sys.argv[1])
df = pd.read_csv(wd / "results" / "results.csv", dtype=str, keep_default_na=False)
gpu = df[df["gpu_name"] != ""]
print(f"gpu_slurm: {len(df)} rows, {len(gpu)} on {set(gpu['gpu_name'])}, status "
      f"{df['status'].value_counts().to_dict()}, Slurm jobs {set(df['slurm_job_id'])}, "
      f"CUDA_VISIBLE_DEVICES {set(gpu['cuda_visible_devices'])}")
tele = sorted(p.name for p in (wd / "results" / "telemetry").rglob("*") if p.is_file())
print(f"gpu_slurm: telemetry files: {len(tele)} ({', '.join(tele[:6])})")
EOF
  if [ -n "${OUT:-}" ]; then
    cp "$wd/snakemake.log" "$wd/config.yaml" "$OUT/"
    (cd "$wd" && tar czf "$OUT/results.tgz" results/results.csv results/report.html \
       results/logs results/doctor .snakemake/slurm_logs 2>/dev/null) || true
    cp "$STATE"/log/*.log "$OUT/" 2>/dev/null || true
  fi
  return "$rc"
}

case "$CMD" in
  fetch) fetch ;;
  run) run ;;
  *) echo "usage: tools/gpu_slurm.sh fetch|run [DEBS] [WHL]" >&2; exit 1 ;;
esac
