#!/usr/bin/env bash
# vLLM 0.33.0 for the GPU machine (Python 3.12, torch 2.11+cu130, no package index), carried as pieces.
#
#   bash benchmarks/gpu/vllm_bundle.sh build     # here: pinned wheels from PyPI -> one slim site folder ->
#                                                #   .carry/vllm/vllm-bundle.tar.xz.NN (<= PIECE_MB each) + SHA256SUMS
#   bash benchmarks/gpu/vllm_bundle.sh stash     # there, each call that carries pieces (.carry/vllm):
#                                                #   moves them to $STASH, which outlives the call on a warm machine
#   bash benchmarks/gpu/vllm_bundle.sh install   # there, once every piece is stashed: sha256, reassemble,
#                                                #   unpack into $SITE, write $SITE/env.sh, smoke test
#   source "$SITE/env.sh"                        # the environment vLLM runs in (below)
#
# The wheels and their sha256 are pinned in benchmarks/gpu/vllm-wheels.txt (pip --require-hashes). vLLM's
# wheel pins torch 2.14, but its extensions use torch's stable C ABI and run on the image's torch 2.11, so
# no dependency is resolved (--no-deps): the image has torch, transformers, numpy, triton and the rest.
# Slimmed for a dense Llama on Hopper: FlashAttention-2's library, DeepGEMM, the SM100 FMHA, the Rust
# front-end (vllm-rs), the MoE ops and the FlashMLA / qutlass / KDA / deepselect kernels go; FA3 and
# _C_stable_libtorch stay (vllm_flash_attn's __init__ raises on CUDA with neither FA library).
# PIECE_MB (default 48) keeps one piece and the slimmed tree (benchmarks/device_tree.sh slim) within a
# device call's 64 MiB.
#
# The environment (env.sh): PYTHONPATH=$SITE:<repo> exported, so vLLM's engine-core and worker processes
# see the same packages; VLLM_USE_FLASHINFER_SAMPLER=0 (the sampler probes flashinfer, not carried);
# HF_HUB_OFFLINE=1 and TRANSFORMERS_OFFLINE=1 (nothing outside the machine can be reached);
# VLLM_NO_USAGE_STATS=1.
set -euo pipefail
cd "$(dirname "$0")/../.."
PINS=benchmarks/gpu/vllm-wheels.txt
OUTDIR=${OUTDIR:-.carry/vllm}
PIECE_MB=${PIECE_MB:-48}
STASH=${STASH:-/root/stash/vllm}
SITE=${SITE:-/root/vllm-site}
NAME=vllm-bundle.tar.xz
PLATFORMS="manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 manylinux_2_24_x86_64
manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64 linux_x86_64"
# What a dense Llama on Hopper does not load (paths under vllm/).
SLIM="vllm_flash_attn/_vllm_fa2_C.abi3.so vllm-rs third_party/deep_gemm third_party/fmha_sm100
_moe_C_stable_libtorch.abi3.so _flashmla_C.abi3.so _qutlass_C.abi3.so _flashkda_C.abi3.so _deepselect_C.abi3.so"

target_flags() {
    local f="--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none"
    for p in $PLATFORMS; do f="$f --platform $p"; done
    echo "$f"
}

build() {
    local dl=$OUTDIR/wheels stage=$OUTDIR/stage
    mkdir -p "$dl"
    python3 -m pip download -q --no-deps --require-hashes $(target_flags) -d "$dl" -r $PINS
    rm -rf "$stage" && mkdir -p "$stage"
    python3 -m pip install -q --no-deps --no-index --no-compile --target "$stage/site" $(target_flags) "$dl"/*.whl
    for p in $SLIM; do
        [ -e "$stage/site/vllm/$p" ] || { echo "slim: vllm/$p is not in the wheel" >&2; exit 3; }
        rm -rf "$stage/site/vllm/$p"
    done
    rm -rf "$stage/site/bin"   # console scripts with this machine's interpreter in their first line
    echo "site: $(du -sh "$stage/site" | cut -f1) unpacked"
    rm -f "$OUTDIR/$NAME" "$OUTDIR/$NAME".?? "$OUTDIR/SHA256SUMS"
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$stage" -cf - site \
        | xz -6 -T"${XZ_THREADS:-2}" > "$OUTDIR/$NAME"
    split -b "${PIECE_MB}M" -d -a 2 "$OUTDIR/$NAME" "$OUTDIR/$NAME."
    (cd "$OUTDIR" && sha256sum $NAME.?? $NAME > SHA256SUMS && rm $NAME)
    rm -rf "$stage"
    ls -l "$OUTDIR"
}

unxz() {  # xz, or Python's lzma where the machine has no xz
    if command -v xz > /dev/null; then xz -dc; else
        python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)"; fi
}

stash() {
    mkdir -p "$STASH"
    local moved=0
    for f in "$OUTDIR"/$NAME.?? "$OUTDIR"/SHA256SUMS; do
        [ -f "$f" ] && mv -f "$f" "$STASH/" && moved=$((moved + 1))
    done
    echo "stash: $moved file(s) moved; $STASH holds $(ls "$STASH" | tr '\n' ' ')"
}

install() {
    stash >/dev/null 2>&1 || true
    (cd "$STASH" && grep " $NAME\.[0-9][0-9]\$" SHA256SUMS | sha256sum -c --quiet -) \
        || { echo "install: a piece is missing or damaged in $STASH" >&2; exit 3; }
    local whole; whole=$(grep " $NAME\$" "$STASH/SHA256SUMS" | cut -c1-64)
    rm -rf "$SITE" && mkdir -p "$(dirname "$SITE")"
    local got; got=$(cat "$STASH"/$NAME.?? | sha256sum | cut -c1-64)
    [ "$got" = "$whole" ] || { echo "install: reassembled tarball sha256 $got, expected $whole" >&2; exit 3; }
    cat "$STASH"/$NAME.?? | unxz | tar -x -C "$(dirname "$SITE")" --transform "s,^site,$(basename "$SITE"),"
    cat > "$SITE/env.sh" <<EOF
export PYTHONPATH="$SITE:$PWD\${PYTHONPATH:+:\$PYTHONPATH}"
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1
EOF
    echo "install: $SITE ($(du -sh "$SITE" | cut -f1)); source $SITE/env.sh"
    smoke "${1:-}"
}

# import vllm; with a model folder, generate a few tokens greedily (full CUDA graphs, no torch.compile).
smoke() {
    # shellcheck disable=SC1091
    source "$SITE/env.sh"
    python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    [ -n "${1:-}" ] && python3 -m benchmarks.gpu.texts smoke --model "$1"
    return 0
}

case "${1:-}" in
build) build ;;
stash) stash ;;
install) install "${2:-}" ;;
smoke) smoke "${2:-}" ;;
*) echo "usage: $0 build | stash | install [MODEL_DIR] | smoke [MODEL_DIR]" >&2; exit 2 ;;
esac
