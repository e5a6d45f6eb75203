#!/usr/bin/env bash
# The scale benchmark's run on one GPU (docs/benchmarks.md, "At the released sizes"): d1jax's
# side (bench/scale.py) and the PyTorch reference's (bench/reference/scale.py) in one sitting,
# one process at a time, each under its own time limit, every JSON written as it goes.
#
#   bench/scale_gpu.sh OUT_DIR REF_DIR [PARTS]
#
# PARTS (comma-separated, run in the order given; default llada,dream): llada (numerics, the
# cycle, the reference's), profile (the updates alone, the layers in a loop, traced), pair
# (one update's loss and gradient norm, d1jax's and d1's, on shared inputs), dream, quant (an
# NF4 base: logits and the updates' memory; QUANTS=int8,nf4 for both), profile_unroll (the
# updates with the layers unrolled: on an H100 their compile ran past 3 minutes), moe (one
# LLaDA2.0-mini MoE layer beside a dense SwiGLU of equal active FLOPs, bench/moe.py: its
# JSON in OUT/moe.log; T_MOE seconds).
#
# REF_DIR: what bench/reference/setup.sh built (its sources; the venv is not needed when
# REF_PYTHONPATH holds the reference's packages over a machine's own torch).
# Environment: PY (python with jax[cuda]; default python3), REF_PY (the reference's python:
# default PY, which then needs torch), D1JAX_PYTHONPATH and
# REF_PYTHONPATH (prepended for each side), SCALE_ARGS (extra bench/scale.py arguments,
# e.g. --tiny on a CPU), T_NUMERICS/T_LLADA/T_REFERENCE/T_DREAM/T_UPDATE (seconds).
set -uo pipefail
OUT=${1:?OUT_DIR}; REF=${2:?REF_DIR}; PARTS=${3:-llada,dream}
PY=${PY:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}
JAXSIDE=(env "PYTHONPATH=${D1JAX_PYTHONPATH:-}:$HERE/.." "$PY")
REFSIDE=(env "PYTHONPATH=${REF_PYTHONPATH:-}" "${REF_PY:-$PY}")
step() {  # step NAME SECONDS CMD...: one part, its log in OUT, its exit status said
  local name=$1 limit=$2; shift 2
  echo "[scale_gpu] $name (limit ${limit}s) $(date -u +%T)"
  timeout --signal=INT --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "[scale_gpu] $name exit $? $(date -u +%T)"
  grep -E "^\[(scale|reference-scale)\]|Error|error:" "$OUT/$name.log" | cut -c1-300 | tail -25
}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
    || echo "no nvidia-smi"; "$PY" -c "import jax, jaxlib; print('jax', jax.__version__, jaxlib.__version__, jax.devices())"; } > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"
MODEL_L=llada-8b; MODEL_D=dream-7b; EXTRA=${SCALE_ARGS:-}
case " $EXTRA " in *" --tiny "*) MODEL_L=bench-tiny; MODEL_D=dream-test-tiny; RT=--tiny;; *) RT=;; esac
part_llada() {
  step numerics "${T_NUMERICS:-100}" "${JAXSIDE[@]}" "$HERE/scale.py" --model $MODEL_L $EXTRA \
    --numerics "$OUT/numerics" --out "$OUT/numerics_d1jax.json"
  step llada "${T_LLADA:-270}" "${JAXSIDE[@]}" "$HERE/scale.py" --model $MODEL_L $EXTRA --fast-dllm \
    --rounds 1 --layers loop --out "$OUT/scale_llada.json"
  step reference "${T_REFERENCE:-200}" "${REFSIDE[@]}" "$HERE/reference/scale.py" --ref-dir "$REF" \
    --device $DEV $RT --numerics "$OUT/numerics" --out "$OUT/reference_llada.json"
  rm -rf "$OUT/numerics"  # the logits (large): the JSONs hold the comparison
}
part_profile() {  # the updates alone (a generated batch), traced; $1: loop or unroll
  local layers=${1:-loop}
  step profile_$layers "${T_UPDATE:-120}" "${JAXSIDE[@]}" "$HERE/scale.py" --model $MODEL_L $EXTRA \
    --samplers none --rounds 2 --init leaves --layers $layers --profile "$OUT/trace_$layers" \
    --out "$OUT/profile_$layers.json"
  rm -rf "$OUT/trace_$layers"
}
part_pair() {  # one update on shared hashed weights, adapters, batch and prompt mask
  step pair_d1jax "${T_UPDATE:-120}" "${JAXSIDE[@]}" "$HERE/scale.py" --model $MODEL_L $EXTRA \
    --pair "$OUT/pair" --layers loop --out "$OUT/pair_d1jax.json"
  step pair_reference "${T_REFERENCE:-200}" "${REFSIDE[@]}" "$HERE/reference/scale.py" \
    --ref-dir "$REF" --device $DEV $RT --sections none --pair "$OUT/pair" \
    --out "$OUT/pair_reference.json"
  rm -rf "$OUT/pair"
}
part_dream() {
  step dream "${T_DREAM:-240}" "${JAXSIDE[@]}" "$HERE/scale.py" --model $MODEL_D $EXTRA --rounds 1 \
    --init leaves --layers loop --out "$OUT/scale_dream.json"
}
part_quant() {  # d1's NF4 base (QUANTS: int8 too): logits on the shared weights, the updates' memory
  local q
  for q in ${QUANTS//,/ }; do
    step numerics_$q "${T_NUMERICS:-100}" "${JAXSIDE[@]}" "$HERE/scale.py" --model $MODEL_L $EXTRA \
      --numerics "$OUT/numerics_$q" --base-quant $q --out "$OUT/numerics_$q.json"
    rm -rf "$OUT/numerics_$q"
    step update_$q "${T_UPDATE:-120}" "${JAXSIDE[@]}" "$HERE/scale.py" --model $MODEL_L $EXTRA \
      --base-quant $q --samplers none --rounds 2 --layers loop --out "$OUT/update_$q.json"
  done
}
QUANTS=${QUANTS:-nf4}
DEV=$( [ -n "$RT" ] && echo cpu || echo cuda )
for part in ${PARTS//,/ }; do
  case $part in
    llada|pair|dream|quant) part_$part;;
    profile) part_profile loop;;
    profile_unroll) part_profile unroll;;
    moe) step moe "${T_MOE:-300}" "${JAXSIDE[@]}" "$HERE/moe.py" --repeats 10;;
    *) echo "[scale_gpu] unknown part $part (llada, profile, pair, dream, quant, profile_unroll, moe)"; exit 2;;
  esac
done
