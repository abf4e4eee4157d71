#!/usr/bin/env bash
# The tree a device call carries (at most 64 MiB with what it names in `carry`): `slim` takes the
# binaries that ship (fixture pairs, drafters) and the data files under benchmarks/results out of
# the index and ignores them (.git/info/exclude), leaving ~9 MB; the scripts under
# benchmarks/results (*.sh, *.py) stay, so a results folder's run.sh runs there. `unslim` puts
# everything back. Never commit while slimmed.
#   bash benchmarks/device_tree.sh slim|unslim
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
BINARIES="shipped/target/model.safetensors shipped/target/tokenizer.json
shipped/deepseek_tiny/target/model.safetensors shipped/deepseek_tiny/target/tokenizer.json
shipped/deepseek_tiny/drafter/model.safetensors shipped/drafter/model.safetensors
shipped/smollm2/drafter/model.safetensors"
EXCLUDE=.git/info/exclude
BEGIN="# device_tree.sh slim: begin"
END="# device_tree.sh slim: end"
drop_block() { [ -f $EXCLUDE ] && sed -i "/^$BEGIN\$/,/^$END\$/d" $EXCLUDE || true; }
case "${1:-}" in
slim)
    git rm -q --cached $BINARIES
    git ls-files benchmarks/results | grep -vE '\.(sh|py)$' | git rm -q --cached --pathspec-from-file=-
    drop_block
    { echo "$BEGIN"; for p in $BINARIES; do echo "/$p"; done
      printf '%s\n' '/benchmarks/results/**' '!/benchmarks/results/**/' '!/benchmarks/results/**/*.sh' \
        '!/benchmarks/results/**/*.py' "$END"; } >> $EXCLUDE
    echo "slim: $(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) bytes tracked" ;;
unslim)
    drop_block
    git reset -q -- $BINARIES benchmarks/results
    git status --short | head ;;
*) echo "usage: $0 slim|unslim" >&2; exit 2 ;;
esac
