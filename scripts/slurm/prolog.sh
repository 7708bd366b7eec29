#!/bin/bash
# gpufleet Slurm prolog: record which job holds which GPU, so the agent attributes GPUs that
# are allocated but idle (no process to trace). Writes one file per GPU index in
# $GPUFLEET_JOB_MAPPING_DIR (default /var/run/gpufleet/jobs) holding the job id: the same
# format as dcgm-exporter's --hpc-job-mapping-dir, so both can share the directory.
# With GPUFLEET_GPUSTAT_DIR set it also writes Princeton jobstats' "<jobid> <uid>" files.
#
# A prolog that exits non-zero drains the node: this script never fails the job.
set -u
DIR="${GPUFLEET_JOB_MAPPING_DIR:-/var/run/gpufleet/jobs}"
GPUSTAT="${GPUFLEET_GPUSTAT_DIR:-}"
JOB="${SLURM_JOB_ID:-}"
# SLURM_JOB_GPUS is set for prologs on GRES nodes; CUDA_VISIBLE_DEVICES on older setups.
GPUS="${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}"
[ -n "$JOB" ] && [ -n "$GPUS" ] || exit 0

write() {  # write <dir> <name> <content>: atomically, so the agent never reads half a file
    local tmp="$1/.$2.$JOB.$$"
    printf '%s\n' "$3" > "$tmp" 2>/dev/null && mv -f "$tmp" "$1/$2" 2>/dev/null || rm -f "$tmp"
}

mkdir -p "$DIR" 2>/dev/null || exit 0
[ -z "$GPUSTAT" ] || mkdir -p "$GPUSTAT" 2>/dev/null || GPUSTAT=""
for g in ${GPUS//,/ }; do
    case "$g" in
        ''|*[!0-9.]*) continue ;;  # only "<index>" or "<index>.<gpu instance>" (MIG)
    esac
    write "$DIR" "$g" "$JOB"
    [ -z "$GPUSTAT" ] || write "$GPUSTAT" "$g" "$JOB ${SLURM_JOB_UID:-0}"
done
exit 0
