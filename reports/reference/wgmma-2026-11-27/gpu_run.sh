# one GPU call, steps in priority order, each only if BUDGET_S (wall seconds) leaves room:
# facts + SASS, standalone bench, framework run, sanitizers, pytest -m gpu, ncu
set -o pipefail
O=/tmp/o; mkdir -p $O
trap 'tar czf $OUT/all.tgz -C $O . 2>/dev/null' EXIT
export PYTHONUNBUFFERED=1 BASE_PP=$PYTHONPATH
T0=$(date +%s); B=${BUDGET_S:-400}
el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
room() { local left=$(( B - ($(date +%s) - T0) )); [ $left -ge $1 ] || { el "skip $2 ($left s left)"; return 1; }; }
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,power.limit --format=csv | tee $O/gpu.txt
for k in tc_wgmma_tma_fp16 tc_wgmma_pipe_fp16 tc_wgmma_ws_fp16 tc_wgmma_persist_tf32; do
  s=$(cuobjdump -sass -fun $k .wg/cub/s4.cubin); echo "$k HGMMA=$(grep -c HGMMA <<<"$s") SETMAXNREG=$(grep -ci setmaxnreg <<<"$s") LDL/STL=$(grep -c 'LDL\|STL' <<<"$s") SYNCS=$(grep -c SYNCS <<<"$s") UTMALDG=$(grep -c UTMALDG <<<"$s")"
done | tee $O/sass.txt
cuobjdump -sass -fun tc_wgmma_ws_fp16 .wg/cub/s4.cubin > $O/ws_fp16.sass 2>&1
export PYTHONPATH=$PWD/.wg/repo:$BASE_PP
timeout $(( B - 30 )) python3 .wg/wgmma_bench.py --cubins .wg/cub --smoke --sizes 4096 --extra mma:mma $BENCH_EXTRA --out $O/wgmma.json 2>&1 | tee $O/bench.log
el bench rc $?
grep -q '"status": "ok"' $O/bench.log || exit 0
# the N-major descriptor's strides the other way round: the framework builds that way too
grep -qE "^smoke swap .*'fp16': 'ok'" $O/bench.log && sed -i 's/^#define MN_SWAP 0$/#define MN_SWAP 1/' .wg/repo/cuda/tensor_cores/wgmma.cu && el "framework uses MN_SWAP=1"
if [ -z "$SKIP_FW" ] && room 150 framework; then ( cd .wg/repo && export PYTHONPATH=$PWD:$BASE_PP && R=$O/results &&
  timeout $(( B - ($(date +%s) - T0) - 25 )) python3 -m cudalab.cli measure tensor_cores --config ../${TC_CFG:-tc.yaml} --results $R > $O/measure.log 2>&1; echo "measure rc $?"; tail -3 $O/measure.log;
  python3 -m cudalab.cli aggregate --results $R --out $R/results.csv > $O/aggregate.log 2>&1; echo "aggregate rc $?";
  python3 -m cudalab.experiments.tensor_cores.bench $R/results.csv 2>&1 | tee $O/summary.txt | head -40 ); el framework done; fi
export PYTHONPATH=$PWD/.wg/repo:$BASE_PP
for tool in memcheck racecheck; do room 70 $tool || continue
  timeout 60 compute-sanitizer --tool $tool python3 .wg/wgmma_bench.py --cubins .wg/cub --one s4:wgmma_tma s4:wgmma_pipe s4:wgmma_ws s4:wgmma_persist --sizes 256,128,256 > $O/$tool.log 2>&1
  el "$tool rc $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Hazard|Invalid" $O/$tool.log | sort | uniq -c | head -8; grep -c '"status": "ok"' $O/$tool.log
done
if [ -z "$SKIP_PYTEST" ] && room 100 pytest; then ( cd .wg/repo && export PYTHONPATH=$PWD:$BASE_PP && timeout 90 python3 -m pytest -m gpu tests/gpu/test_tensor_cores_gpu.py -q -x -p no:cacheprovider > $O/pytest.log 2>&1; echo "pytest rc $?"; tail -5 $O/pytest.log ); fi
M=smsp__inst_executed_op_ldsm.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,sm__inst_executed_pipe_lsu.sum,smsp__inst_executed.sum,gpu__time_duration.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum
for kk in "tc_mma_fp16 mma:mma" "tc_wgmma_ws_fp16 s4:wgmma_ws"; do set -- $kk; room 40 ncu || break
  timeout 35 ncu --metrics $M -k $1 -c 1 python3 .wg/wgmma_bench.py --cubins .wg/cub --one $2 --sizes 4096 --precs fp16 >> $O/ncu.txt 2>&1; el ncu $1 rc $?
done
grep -E "tc_|ldsm|wavefronts|pipe_lsu|inst_executed.sum|duration" $O/ncu.txt 2>/dev/null | head -20
el all done
