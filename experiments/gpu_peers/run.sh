#!/bin/bash
# bash .gpu/run.sh start|wait SECONDS: start the detached job (once), wait for it up to SECONDS,
# then copy what it has written (result tables, the systems' logs) to $OUT. bash .gpu/run.sh put:
# keep the encoder part this command carried (an encoder larger than one command takes).
J=${J:-/tmp/job}; OUT=${OUT:-/tmp/job-out}; mkdir -p "$J" "$OUT"
G=$(basename "$(dirname "$0")")  # this payload's folder (.gpu, or another prepare.py --out)
if [ "$1" = put ]; then  # an encoder part carried by this command (<payload>-enc/partNN): kept for job.sh
  mkdir -p /tmp/enc-parts; for f in "$G-enc"/part*; do [ -f "$f" ] && mv "$f" /tmp/enc-parts/; done
  ls -l /tmp/enc-parts; exit
fi
if [ "$1" = start ] && [ ! -f "$J/started" ]; then
  touch "$J/started"; setsid nohup bash "$G/job.sh" > "$J/job.log" 2>&1 < /dev/null &
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
