#!/bin/bash
# gpufleet Slurm epilog: remove this job's GPU mapping files (see prolog.sh). A file now
# naming another job (the GPU was reallocated already) is left alone.
set -u
DIR="${GPUFLEET_JOB_MAPPING_DIR:-/var/run/gpufleet/jobs}"
GPUSTAT="${GPUFLEET_GPUSTAT_DIR:-}"
JOB="${SLURM_JOB_ID:-}"
[ -n "$JOB" ] || exit 0
for d in "$DIR" ${GPUSTAT:+"$GPUSTAT"}; do
    [ -d "$d" ] || continue
    for f in "$d"/*; do
        [ -f "$f" ] || continue
        read -r first _ < "$f" 2>/dev/null || continue
        [ "$first" = "$JOB" ] && rm -f "$f"
    done
done
exit 0
