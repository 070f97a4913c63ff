#!/bin/bash
# run 1: SIGINT once a doctor flag exists; run 2: resume with the same command
set -m   # background jobs of a non-interactive shell ignore SIGINT otherwise
source /tmp/indep-env.sh
rm -rf results .snakemake/slurm_logs
snakemake --profile slurm --configfile /tmp/indep-cfg/cpusweep.yaml > /tmp/indep-logs/run_interrupt1.txt 2>&1 &
pid=$!
t0=$(date +%s)
while kill -0 $pid 2>/dev/null; do
  if grep -q "Rule: doctor)" /tmp/indep-logs/run_interrupt1.txt; then
    echo "doctor flag(s) at $(( $(date +%s)-t0 )) s: $(ls results/doctor/*.ok)"; squeue -h -o '%i %k %T'
    kill -INT $pid; echo "SIGINT sent at $(( $(date +%s)-t0 )) s"; break
  fi
  sleep 0.5
done
wait $pid; echo "run 1 exit=$? at $(( $(date +%s)-t0 )) s"
sleep 1; echo "squeue after: $(squeue -h | wc -l) job(s)"; echo "flags left: $(ls results/doctor/*.ok 2>/dev/null)"
t1=$(date +%s)
timeout -s INT -k 30 400 snakemake --profile slurm --configfile /tmp/indep-cfg/cpusweep.yaml > /tmp/indep-logs/run_interrupt2.txt 2>&1
echo "run 2 exit=$? wall=$(( $(date +%s)-t1 )) s"
