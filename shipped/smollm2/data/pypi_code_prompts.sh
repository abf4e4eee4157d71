#!/usr/bin/env bash
# More function stubs people wrote, for `drafter data` beside code_prompts.jsonl.gz (whose 22,000 took
# nearly all 22,375 documented functions the Python 3.11 standard library and this project's
# virtualenvs hold): the same `drafter code-prompts` over the wheels of sixteen permissively licensed
# packages that are not in those virtualenvs (BSD, MIT, Apache-2.0, PSF-style, HPND): 10,244 usable
# stubs. Downloaded from PyPI and written under runs/, not committed:
# carry the file to a device call as the ShareGPT prompts are carried.
#   bash shipped/smollm2/data/pypi_code_prompts.sh [OUT]   # default runs/pypi_code_prompts.jsonl.gz
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
OUT=${1:-runs/pypi_code_prompts.jsonl.gz}
W=runs/pypi_code; mkdir -p "$W/whl" "$W/src"
PACKAGES="django==5.2.9 pandas==3.1.1 scikit-learn==1.9.1 sqlalchemy==2.1.9 astropy==8.0.2 statsmodels==0.15.0
twisted==26.10.0 sphinx==9.0.4 docutils==0.23.1 nltk==3.10.4 dask==2026.8.0 xarray==2026.9.0 bokeh==3.9.2
tornado==6.6.1 flask==3.1.3 pillow==13.0.0"
for p in $PACKAGES; do
    .venv/bin/pip download -q --no-deps --only-binary=:all: --python-version 3.11 -d "$W/whl" "$p"
done
for w in "$W"/whl/*.whl; do
    d="$W/src/$(basename "$w" | cut -d- -f1)"; [ -d "$d" ] || unzip -q "$w" '*.py' -d "$d"
done
.venv/bin/python -m drafter code-prompts $(for d in "$W"/src/*; do echo --src "$d"; done) \
    --out "${OUT%.gz}" --num 10000 --seed 1
gzip -f "${OUT%.gz}"
