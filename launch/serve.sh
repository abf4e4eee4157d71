#!/usr/bin/env bash
# Thin shell over the Python entry point (launch/cli.py): all logic lives there.
# Uses the python on PATH (or $PYTHON), so it works in any venv; `exec` makes Python the
# process that receives SIGTERM, so the server drains and exits 0.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="${root}${PYTHONPATH:+:${PYTHONPATH}}"
exec "${PYTHON:-python}" -m launch.cli "$@"
