#!/usr/bin/env bash
# The scale benchmark's run on one GPU (docs/benchmarks.md, "At the released sizes"): d1jax's
# side (bench/scale.py) and the PyTorch reference's (bench/reference/scale.py) in one sitting,
# one process at a time, each under its own time limit, every JSON written as it goes.
#
#   bench/scale_gpu.sh OUT_DIR REF_DIR [PARTS]     # PARTS: llada,quant,profile,dream (default: llada,dream)
#
# REF_DIR: what bench/reference/setup.sh built (its sources; the venv is not needed when
# REF_PYTHONPATH holds the reference's packages over a machine's own torch).
# Environment: PY (python with jax[cuda]; default python3), REF_PY (the reference's python:
# default PY, which then needs torch), D1JAX_PYTHONPATH and
# REF_PYTHONPATH (prepended for each side), SCALE_ARGS (extra bench/scale.py arguments,
# e.g. --tiny --model bench-tiny on a CPU), T_NUMERICS/T_LLADA/T_REFERENCE/T_DREAM (seconds).
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
if [[ $PARTS == *llada* ]]; then
  step numerics "${T_NUMERICS:-100}" "${JAXSIDE[@]}" "$HERE/scale.py" --model $MODEL_L $EXTRA \
    --numerics "$OUT/numerics" --out "$OUT/numerics_d1jax.json"
  step llada "${T_LLADA:-270}" "${JAXSIDE[@]}" "$HERE/scale.py" --model $MODEL_L $EXTRA --fast-dllm \
    --rounds 1 --layers loop --out "$OUT/scale_llada.json"
  step reference "${T_REFERENCE:-200}" "${REFSIDE[@]}" "$HERE/reference/scale.py" --ref-dir "$REF" \
    --device "$( [ -n "$RT" ] && echo cpu || echo cuda )" $RT --numerics "$OUT/numerics" \
    --out "$OUT/reference_llada.json"
  rm -rf "$OUT/numerics"  # the logits (large): the JSONs hold the comparison
fi
if [[ $PARTS == *quant* ]]; then  # d1's NF4 base (and int8): memory, logits, the cycle
  for q in int8 nf4; do
    step numerics_$q "${T_NUMERICS:-100}" "${JAXSIDE[@]}" "$HERE/scale.py" --model $MODEL_L $EXTRA \
      --numerics "$OUT/numerics_$q" --base-quant $q --out "$OUT/numerics_$q.json"
    rm -rf "$OUT/numerics_$q"
  done
  step llada_nf4 "${T_LLADA:-270}" "${JAXSIDE[@]}" "$HERE/scale.py" --model $MODEL_L $EXTRA \
    --base-quant nf4 --rounds 1 --layers loop --out "$OUT/scale_llada_nf4.json"
fi
if [[ $PARTS == *profile* ]]; then  # the update with its layers unrolled (the config's) and in a loop, traced
  for layers in unroll loop; do
    step profile_$layers "${T_LLADA:-270}" "${JAXSIDE[@]}" "$HERE/scale.py" --model $MODEL_L $EXTRA \
      --samplers exact --rounds 1 --layers $layers --profile "$OUT/trace_$layers" \
      --out "$OUT/profile_$layers.json"
    rm -rf "$OUT/trace_$layers"
  done
fi
if [[ $PARTS == *dream* ]]; then
  step dream "${T_DREAM:-240}" "${JAXSIDE[@]}" "$HERE/scale.py" --model $MODEL_D $EXTRA --rounds 1 --init leaves --layers loop \
    --out "$OUT/scale_dream.json"
fi
