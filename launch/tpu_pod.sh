#!/usr/bin/env bash
# Create a TPU VM pod slice, install d1jax (pip install -e '.[tpu]') on every worker, run one command on all workers.
#
#   launch/tpu_pod.sh [--dry-run] --name NAME --zone ZONE --type v5p-64 [--version RUNTIME] \
#       [--bucket gs://BUCKET/runs] [--repo URL] [--peer-timeout S] -- --config=configs/grpo_gsm8k.py
#
# Everything after `--` is passed to `python -m d1jax.main` on every worker; the workdir is
# <bucket>/<name> so checkpoints survive preemption (Orbax writes to gs:// directly).
set -euo pipefail
DRY=0; NAME=""; ZONE=""; TYPE="v5p-8"; VERSION="v2-alpha-tpuv5"; BUCKET=""; PEER=""; REPO="${D1JAX_REPO:-https://github.com/d1jax/d1jax.git}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY=1; shift;;
    --name) NAME="$2"; shift 2;;
    --zone) ZONE="$2"; shift 2;;
    --type) TYPE="$2"; shift 2;;
    --version) VERSION="$2"; shift 2;;
    --bucket) BUCKET="$2"; shift 2;;
    --repo) REPO="$2"; shift 2;;
    --peer-timeout) PEER="$2"; shift 2;;
    --) shift; break;;
    *) echo "error: unknown option $1 (see the header of $0)" >&2; exit 2;;
  esac
done
[[ -n "$NAME" && -n "$ZONE" ]] || { echo "error: --name and --zone are required" >&2; exit 2; }
[[ $# -gt 0 ]] || { echo "error: give the d1jax.main flags after --, e.g. -- --config=configs/grpo_gsm8k.py" >&2; exit 2; }
WORKDIR="${BUCKET:-/tmp/d1jax_runs}/${NAME}"
run() { if [[ $DRY == 1 ]]; then printf '%q ' "$@"; echo; else "$@"; fi; }
ALL=(gcloud compute tpus tpu-vm ssh "$NAME" --zone "$ZONE" --worker=all --command)

run gcloud compute tpus tpu-vm create "$NAME" --zone "$ZONE" --accelerator-type "$TYPE" --version "$VERSION"
run "${ALL[@]}" "git clone $REPO d1jax || (cd d1jax && git pull); cd d1jax && pip install -e '.[tpu]' -c requirements.txt"
# D1JAX_DISTRIBUTED=auto: every worker joins jax.distributed from the TPU metadata and runs the
# peer watchdog, as gpu_multinode.sh's D1JAX_COORDINATOR does on GPUs: a dead worker stops the
# others within D1JAX_PEER_TIMEOUT_S (--peer-timeout; default 30 s, 0 off; d1jax/distributed.py).
run "${ALL[@]}" "cd d1jax && D1JAX_DISTRIBUTED=auto ${PEER:+D1JAX_PEER_TIMEOUT_S=$PEER }python -m d1jax.main --workdir=$WORKDIR $*"
