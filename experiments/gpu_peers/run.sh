#!/bin/bash
# bash .gpu/run.sh start|wait SECONDS: start the detached job (once), wait for it up to SECONDS,
# then copy what it has written (result tables, the systems' logs) to $OUT.
J=${J:-/tmp/job}; OUT=${OUT:-/tmp/job-out}; mkdir -p "$J" "$OUT"
if [ "$1" = start ] && [ ! -f "$J/started" ]; then
  touch "$J/started"; setsid nohup bash .gpu/job.sh > "$J/job.log" 2>&1 < /dev/null &
fi
end=$(( $(date +%s) + ${2:-60} ))
while [ ! -f "$J/done" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
cat "$J/progress.txt" "$J/host.txt" 2>/dev/null
cp "$J"/out/*.json "$OUT"/ 2>/dev/null
for f in ours pecos; do [ -f "$J/$f.log" ] && tail -c 100000 "$J/$f.log" > "$OUT/$f.log"; done
find /tmp/work -name log.txt -newer "$J/started" -exec tail -v -c 20000 {} + > "$OUT/runs.log" 2>/dev/null
cp "$J/gpu.txt" "$OUT/" 2>/dev/null
tail -c 100000 "$J/setup.log" > "$OUT/setup.log" 2>/dev/null
ps aux --sort=-%cpu | head -4 | cut -c1-160; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv 2>/dev/null
