# Probe (issue 48): the Hopper backward's step order on the GQA cells and the causal window, processes in turns on
# one machine, each `bench.cells --modes bwd` with diyflash/kernels/attention/backward_sm90.py swapped for a
# label's copy. Before the device call, from the repository root:
#   git show 02a9527:diyflash/kernels/attention/backward_sm90.py > bsm90_old.py    # head after head
#   git show da8005d:diyflash/kernels/attention/backward_sm90.py > bsm90_new.py    # by row, every GQA call
#   git show 348e417:diyflash/kernels/attention/backward_sm90.py > bsm90_new2.py   # by row but windows
# then on the GPU machine: bash ab.sh OUT_DIR old new old new   (or new2 old new2)
set -u
out=$1; shift
f=diyflash/kernels/attention/backward_sm90.py
cp "$f" /tmp/bsm90_keep.py
for v in "$@"; do
  cp "bsm90_$v.py" "$f"
  timeout 140 python3 -m bench.cells --cells "window4096 GQA32/8 D128 causal bf16 B1 N16384" \
    "GQA64/8 D128 causal bf16 B1 N16384" "GQA32/8 D128 causal bf16 B1 N16384" --modes bwd \
    --run "order ab: $v" --out "$out/ab.jsonl" | grep "^| [wG]" | head -3 | sed "s/^/$v /"
done
cp /tmp/bsm90_keep.py "$f"
