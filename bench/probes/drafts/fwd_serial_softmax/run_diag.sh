#!/bin/bash
# (issue 48) One device call: serial.patch's failing bitwise test taken apart (diag2.py; the test itself under
# pytest with the C++ replay of plans on and off), then ab3.sh (KEEP on the full cells) in what time is left.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
D=bench/probes/drafts/fwd_serial_softmax
git apply $D/serial.patch || exit 1
DIYFLASH_TEST_DEVICE=cuda timeout 200 python $D/diag2.py > $OUT/diag2.txt 2>&1; echo "diag2 rc=$?"
for plans in 1 0; do
  DIYFLASH_C_PLANS=$plans DIYFLASH_TEST_DEVICE=cuda timeout 120 python -m pytest -q -p no:cacheprovider \
    tests/test_hopper.py -k serial_softmax > $OUT/pytest_plans$plans.txt 2>&1
  echo "pytest C plans=$plans rc=$?"; tail -3 $OUT/pytest_plans$plans.txt
done
git apply -R $D/serial.patch || exit 1
left=$((570 - SECONDS)); echo "ab3 gets ${left}s"
timeout $left bash $D/ab3.sh > $OUT/ab3.txt 2>&1; echo "ab3 rc=$?"
cat $OUT/diag2.txt | cut -c1-230; tail -25 $OUT/ab3.txt
