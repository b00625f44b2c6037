"""The details page's headline metrics and the source page's stall samples by opcode and by site."""
import collections
import csv
import re
import sys

details, source = sys.argv[1], sys.argv[2]
want = ("Duration", "SM Frequency", "Compute (SM) Throughput", "Issue Slots Busy", "Issued Warp Per Scheduler",
        "Eligible Warps Per Scheduler", "Active Warps Per Scheduler", "Warp Cycles Per Issued Instruction",
        "Stall")
with open(details) as f:
    for row in csv.DictReader(f):
        name = row.get("Metric Name", "")
        if any(w in name for w in want):
            print(f"{row.get('Section Name', '')[:24]:24} {name[:60]:60} {row.get('Metric Value', '')} {row.get('Metric Unit', '')}")
with open(source) as f:
    lines = f.read().splitlines()
start = next(i for i, line in enumerate(lines) if line.startswith('"Address"') or line.startswith("Address"))
rows = list(csv.DictReader(lines[start:]))
cols = list(rows[0].keys())
allc = next(c for c in cols if "Sampling (All" in c)
print("columns:", [c for c in cols if "Sampl" in c])
ops = collections.Counter()
sites = []
total = 0
for r in rows:
    try:
        n = int(float(r[allc] or 0))
    except ValueError:
        continue
    src = r.get("Source", "")
    op = re.sub(r"^@!?U?P\w+\s+", "", src.strip()).split(" ")[0]
    ops[op.split(".")[0] if not op.startswith("BAR") else op] += n
    total += n
    sites.append((n, r.get("Address", ""), src.strip()[:90]))
print("total samples", total)
for op, n in ops.most_common(25):
    print(f"  {op:24} {n:9d} {100 * n / total:5.1f} %")
for n, a, s in sorted(sites, reverse=True)[:30]:
    print(f"  {n:8d} {a} {s}")
