#!/usr/bin/env bash
# Multi-node GPU: one process per node; jax.distributed.initialize() reads the coordinator,
# process count and id from the D1JAX_COORDINATOR / D1JAX_NUM_PROCESSES / D1JAX_PROCESS_ID
# variables this script sets (under Slurm, jax auto-detects them instead).
#
#   launch/gpu_multinode.sh [--dry-run] --hosts h1,h2,... [--port 1234] [--workdir DIR] [--peer-timeout S] -- --config=...
# Runs over ssh on every host; the first host is the coordinator. The workdir must be on a
# filesystem all hosts share (NFS, GCS/S3 through Orbax). Every process runs the peer watchdog:
# a dead one stops the others within --peer-timeout seconds (D1JAX_PEER_TIMEOUT_S, default 30).
set -euo pipefail
DRY=0; HOSTS=""; PORT=1234; WORKDIR="runs/multinode"; PEER=""; REPO_DIR="${D1JAX_DIR:-\$HOME/d1jax}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY=1; shift;;
    --hosts) HOSTS="$2"; shift 2;;
    --port) PORT="$2"; shift 2;;
    --workdir) WORKDIR="$2"; shift 2;;
    --peer-timeout) PEER="$2"; shift 2;;
    --) shift; break;;
    *) echo "error: unknown option $1 (see the header of $0)" >&2; exit 2;;
  esac
done
[[ -n "$HOSTS" ]] || { echo "error: --hosts is required" >&2; exit 2; }
[[ $# -gt 0 ]] || { echo "error: give the d1jax.main flags after --" >&2; exit 2; }
IFS=, read -ra H <<< "$HOSTS"
N=${#H[@]}
run() { if [[ $DRY == 1 ]]; then printf '%q ' "$@"; echo; else "$@"; fi; }
for i in "${!H[@]}"; do
  cmd="cd $REPO_DIR && D1JAX_COORDINATOR=${H[0]}:$PORT D1JAX_NUM_PROCESSES=$N D1JAX_PROCESS_ID=$i ${PEER:+D1JAX_PEER_TIMEOUT_S=$PEER }python -m d1jax.main --workdir=$WORKDIR $*"
  if [[ $DRY == 1 ]]; then run ssh "${H[$i]}" "$cmd"; else ssh "${H[$i]}" "$cmd" & fi
done
[[ $DRY == 1 ]] || wait
