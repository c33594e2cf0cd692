# Two stages: the builder has a C compiler and builds the package into a virtual environment,
# with the native CPU kernels compiled for each portable level (x86-64-v3 and v4; armv8-a on
# ARM: the engine loads the best the CPU runs, and the torch path below v3); the runtime image
# gets the environment and no compiler. Where a compiler does exist at run time, the engine builds kernels tuned for the
# host's own CPU and prefers them (backend/native/build.py).
#
# TORCH_INDEX: the package index torch is installed from. The default is PyTorch's CPU index;
# for the CUDA build name a CUDA one (docker-compose.gpu.yml uses
# https://download.pytorch.org/whl/cu126), or, where the build host cannot reach
# download.pytorch.org, a mirror or an index of your own (e.g. https://pypi.org/simple, whose
# Linux torch wheels are the CUDA build: larger, and they run on CPUs too):
#   docker compose build --build-arg TORCH_INDEX=https://pypi.org/simple
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN pip install --no-cache-dir torch --index-url ${TORCH_INDEX}
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY providers providers
COPY backend backend
COPY plumbing plumbing
# The kernels are built by the installed package (run from /tmp, not /src), into its own
# backend/native/prebuilt/.
RUN pip install --no-cache-dir . && cd /tmp && python -m backend.native.build --portable

FROM ${PYTHON_IMAGE}
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/*
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
COPY settings.toml /etc/gateway/settings.toml
ENV GATEWAY_CONFIG=/etc/gateway/settings.toml HF_HUB_OFFLINE=1
EXPOSE 8000
CMD ["python", "-m", "gateway", "serve", "--host", "0.0.0.0", "--port", "8000"]
