# (issue 48) the Hopper forward's row max as a tree (tree.diff) against the kernel, bench.cells' forward cells, processes
# in turns (base, tree, tree, base), each provider right after cuDNN. From the repository root, OUT set:
#   bash bench/probes/drafts/fwd_row_max_tree/ab.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
F=diyflash/kernels/attention
mkdir -p /tmp/tree_ab && cp $F/forward_sm90.py $F/semantics.py /tmp/tree_ab/
for v in base tree tree base; do
  cp /tmp/tree_ab/forward_sm90.py /tmp/tree_ab/semantics.py $F/
  [ $v = tree ] && git apply bench/probes/drafts/fwd_row_max_tree/tree.diff
  timeout 135 python3 -m bench.cells --modes fwd --run "row max tree: $v" --out $OUT/tree_ab.jsonl > $OUT/tree_$v.log 2>&1
  grep "^| [wGM]" $OUT/tree_$v.log | cut -d'|' -f2,4,5,6 | sed "s/^/$v /"
done
cp /tmp/tree_ab/forward_sm90.py /tmp/tree_ab/semantics.py $F/
