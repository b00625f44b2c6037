# (issue 48) the Hopper forward's consumers issuing their matmuls in turns (named barriers: FA3's ping-pong; turns.diff,
# PROBE_PP=1) and with q as the first matmul's A operand from registers (PROBE_QREGS=1), against the kernel: outputs
# checked bitwise on odd shapes, then bench.cells' forward cells in processes base, pp, ppqr (ORDER2 to change the
# order; the second run was ORDER2="pp base base pp" with cells_d64.py and the D64 cells). From the repository root, OUT set:
#   bash bench/probes/drafts/fwd_turns/ab.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
D=bench/probes/drafts/fwd_turns
F=diyflash/kernels/attention/forward_sm90.py
cp $F /tmp/base_fwd.py
[ -z "$ORDER2" ] && TRITON_CACHE_DIR=/tmp/tc_00 DIYFLASH_ATTENTION_BACKEND=hopper timeout 120 python3 $D/check.py save /tmp/ref.pt
git apply $D/turns.diff
[ -z "$ORDER2" ] && for v in "1 0" "1 1"; do set -- $v
  echo "check pp=$1 qr=$2"; TRITON_CACHE_DIR=/tmp/tc_$1$2 PROBE_PP=$1 PROBE_QREGS=$2 DIYFLASH_ATTENTION_BACKEND=hopper timeout 150 python3 $D/check.py check /tmp/ref.pt
done
cp $F /tmp/turns_fwd.py
for v in ${ORDER2:-base pp ppqr}; do
  if [ $v = base ]; then cp /tmp/base_fwd.py $F; else cp /tmp/turns_fwd.py $F; fi
  PP=0; QR=0; [ $v != base ] && PP=1; [ $v = ppqr ] && QR=1
  TRITON_CACHE_DIR=/tmp/tc_$PP$QR PROBE_PP=$PP PROBE_QREGS=$QR timeout 100 python3 ${CELLS:--m bench.cells} --modes fwd ${CELLS_ARGS} --run "pingpong: $v" --out $OUT/pp_ab.jsonl > $OUT/pp_$v.log 2>&1
  grep "^| [wGM]" $OUT/pp_$v.log | sort -u | cut -d'|' -f2,4,5,6 | sed "s/^/$v /"
done
cp /tmp/base_fwd.py $F
