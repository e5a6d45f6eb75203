#!/usr/bin/env bash
# One GPU node (all its GPUs in one process): install d1jax with jax[cuda12] and run d1jax.main.
#
#   launch/gpu_node.sh [--dry-run] [--workdir DIR] -- --config=configs/grpo_gsm8k.py --config.model.path=/models/LLaDA-8B-Instruct
set -euo pipefail
DRY=0; WORKDIR="runs/$(date +%Y%m%d_%H%M%S)"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY=1; shift;;
    --workdir) WORKDIR="$2"; shift 2;;
    --) shift; break;;
    *) echo "error: unknown option $1 (see the header of $0)" >&2; exit 2;;
  esac
done
[[ $# -gt 0 ]] || { echo "error: give the d1jax.main flags after --" >&2; exit 2; }
run() { if [[ $DRY == 1 ]]; then printf '%q ' "$@"; echo; else "$@"; fi; }
run pip install -e ".[cuda12]" -c requirements.txt
run env XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 python -m d1jax.main --workdir="$WORKDIR" "$@"
