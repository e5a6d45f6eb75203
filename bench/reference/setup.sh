#!/usr/bin/env bash
# Builds the PyTorch reference that bench/ measures d1jax against, outside the package:
# the public code at pinned commits, and a venv with torch (CPU) and transformers 4.46.
#
#   bench/reference/setup.sh [REF_DIR]          # REF_DIR: default $TMPDIR/d1jax-ref
#
# Sources (git clone by default; a local clone or mirror of each works too, offline):
#   LLADA_SRC     ML-GSAI/LLaDA            generate.py (the exact sampler), modeling_llada.py
#   D1_SRC        dllm-reasoning/d1        diffu-grpo/diffu_grpo_trainer.py (estimator, loss)
#   FASTDLLM_SRC  NVlabs/Fast-dLLM         llada/model/configuration_llada.py (the HF config
#                                          class: LLaDA's repository ships only the model code);
#                                          llada/generate.py and llada/model/ (its own dual-cache
#                                          generation and model code, bench/reference/scale.py)
# Each must contain the commit pinned below; the files are taken from exactly that commit.
# TORCH_INDEX_URL: an extra pip index for torch (e.g. PyTorch's CPU-only wheels).
# REF_SYSTEM_SITE=1: the venv sees this Python's packages (reuse an installed torch); the
#   pinned transformers and the rest are still installed in it and take precedence.
# Then: REF_DIR/venv/bin/python bench/reference/run.py --ref-dir REF_DIR > ref.json
set -euo pipefail

LLADA_COMMIT=b7e6c3565f194352da44b38dd12b6970597309f3           # 2026-06-25: generate.py
LLADA_MODELING_COMMIT=59750478f2aa17978d636bc61dd00b1574986b4a  # 2025-10-15: modeling_llada.py
D1_COMMIT=837888f22c21a5da91a0af2b0d7b19e81d9b47ec              # 2025-05-04
FASTDLLM_COMMIT=24cc59e75f20a6384bae8c905965bb090b96388e        # 2025-06-27

HERE=$(cd "$(dirname "$0")" && pwd)
REF=${1:-${TMPDIR:-/tmp}/d1jax-ref}
LLADA_SRC=${LLADA_SRC:-https://github.com/ML-GSAI/LLaDA.git}
D1_SRC=${D1_SRC:-https://github.com/dllm-reasoning/d1.git}
FASTDLLM_SRC=${FASTDLLM_SRC:-https://github.com/NVlabs/Fast-dLLM.git}

say() { echo "[reference] $*" >&2; }
die() { echo "[reference] error: $*" >&2; exit 1; }

# git directory holding a source: a local repository as it is, a URL cloned (bare) once.
git_dir() {
  local src=$1 name=$2
  if [ -d "$src" ]; then
    git -C "$src" rev-parse --absolute-git-dir 2>/dev/null \
      || die "$name source $src is not a git repository"
  else
    local dest="$REF/src/$name.git"
    [ -d "$dest" ] || { say "cloning $src"; git clone -q --bare "$src" "$dest" \
      || die "could not clone $src (set ${name^^}_SRC to a local clone)"; }
    echo "$dest"
  fi
}

# extract GIT COMMIT PATH DEST: one file from the pinned commit, after checking it is there.
extract() {
  local g=$1 commit=$2 path=$3 dest=$4
  git --git-dir="$g" cat-file -e "$commit^{commit}" 2>/dev/null \
    || die "$g lacks the pinned commit $commit (fetch it, or point at a fuller clone)"
  mkdir -p "$(dirname "$dest")"
  git --git-dir="$g" show "$commit:$path" > "$dest.tmp" \
    || die "$g has no $path at $commit"
  mv "$dest.tmp" "$dest"
  printf '  {"file": "%s", "commit": "%s", "path": "%s", "blob": "%s"}' "${dest#$REF/}" \
    "$commit" "$path" "$(git --git-dir="$g" rev-parse "$commit:$path")"
}

mkdir -p "$REF"
LG=$(git_dir "$LLADA_SRC" llada)
DG=$(git_dir "$D1_SRC" d1)
FG=$(git_dir "$FASTDLLM_SRC" fastdllm)
{
  echo '['
  extract "$LG" $LLADA_COMMIT generate.py "$REF/llada/generate.py"; echo ','
  extract "$LG" $LLADA_MODELING_COMMIT modeling_llada.py "$REF/llada_hf/modeling_llada.py"; echo ','
  extract "$FG" $FASTDLLM_COMMIT llada/model/configuration_llada.py \
    "$REF/llada_hf/configuration_llada.py"; echo ','
  extract "$DG" $D1_COMMIT diffu-grpo/diffu_grpo_trainer.py \
    "$REF/d1/diffu-grpo/diffu_grpo_trainer.py"; echo ','
  for f in generate.py model/__init__.py model/configuration_llada.py model/modeling_llada.py; do
    extract "$FG" $FASTDLLM_COMMIT "llada/$f" "$REF/fastdllm/llada/$f"
    [ "$f" = model/modeling_llada.py ] && echo || echo ','
  done
  echo ']'
} > "$REF/sources.json"
say "sources at their pinned commits: $REF/sources.json"

if [ ! -x "$REF/venv/bin/python" ]; then
  say "building the venv (torch CPU, transformers 4.46.3) in $REF/venv"
  python3 -m venv ${REF_SYSTEM_SITE:+--system-site-packages} "$REF/venv"
fi
"$REF/venv/bin/pip" install -q ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} \
  -r "$HERE/requirements.txt"
"$REF/venv/bin/python" -c "import torch, transformers; print('[reference] torch', torch.__version__, '/ transformers', transformers.__version__)" >&2
say "ready: $REF/venv/bin/python $HERE/run.py --ref-dir $REF"
