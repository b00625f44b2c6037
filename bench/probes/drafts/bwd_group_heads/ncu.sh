# (issue 48) the Hopper backward's DRAM traffic and L2 hit rate, GQA 32/8 and 64/8 D128 causal bf16 B1 N16384, one launch each; run from the repository root: bash bench/probes/drafts/bwd_group_heads/ncu.sh (OUT set)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; unset PYTHONDONTWRITEBYTECODE
for h in 32 64; do
  timeout 200 ncu --profile-from-start off --clock-control none -k regex:hopper_bwd --section SpeedOfLight --section MemoryWorkloadAnalysis --metrics lts__t_sector_hit_rate.pct,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_op_red.sum,lts__t_sectors_op_read.sum -o $OUT/gqa$h python3 bench/probes/drafts/bwd_group_heads/ncu_gqa.py $h > $OUT/ncu$h.log 2>&1; echo "ncu $h rc=$?"
  ncu -i $OUT/gqa$h.ncu-rep --page details 2>&1 | grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Hit Rate|L1/TEX Hit|Compute \(SM\)|dram__bytes|lts__t_sector_hit|lts__t_sectors_op|Mem Busy|Max Bandwidth|Elapsed Cycles|SM Frequency" | sed "s/^/$h /"
done
