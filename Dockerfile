FROM python:3.11-slim
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY providers providers
COPY backend backend
COPY plumbing plumbing
# CPU torch by default; build with --build-arg TORCH_INDEX=... for a CUDA build.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN pip install --no-cache-dir torch --index-url ${TORCH_INDEX} && pip install --no-cache-dir .
COPY settings.toml /etc/gateway/settings.toml
ENV GATEWAY_CONFIG=/etc/gateway/settings.toml HF_HUB_OFFLINE=1
EXPOSE 8000
CMD ["python", "-m", "gateway", "serve", "--host", "0.0.0.0", "--port", "8000"]
