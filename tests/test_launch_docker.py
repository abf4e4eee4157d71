"""The Dockerfile (not buildable here: no daemon) stays consistent with the project: its base
image is the SGLang release the `sglang` extra pins, it starts serve.sh (exec, so `docker
stop` drains), checks /health on the port the reference profile serves, and the build
context keeps what the image needs."""
from __future__ import annotations

import re
from pathlib import Path

from launch.profiles import resolve

ROOT = Path(__file__).resolve().parent.parent


def test_dockerfile_matches_the_pinned_sglang_and_the_reference_profile():
    text = (ROOT / "Dockerfile").read_text()
    pinned = re.search(r'"sglang==([0-9.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert f"ARG SGLANG_TAG=v{pinned}" in text and "FROM lmsysorg/sglang:${SGLANG_TAG}" in text
    assert f"sglang.__version__ == '{pinned}'" in text
    assert 'ENTRYPOINT ["/opt/specserve/launch/serve.sh"]' in text
    port = resolve("reference", environ={}).profile.server.port
    assert f"EXPOSE {port}" in text
    assert re.search(rf"HEALTHCHECK .*\n?.*curl -fsS http://localhost:{port}/health", text)
    assert "pip install --no-cache-dir --no-deps ." in text


def test_docker_context_keeps_sources_and_profiles():
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    for needed in ("launch", "server", "engine", "models", "shipped", "pyproject.toml", "README.md"):
        assert needed not in ignored
