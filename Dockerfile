# bertdemo with bert-base-uncased baked in: starts and serves on port 7860 without internet access.
#   docker build -t bertdemo .
#   docker run --rm -p 7860:7860 bertdemo                 # then open http://127.0.0.1:7860
#   docker run --rm -p 7860:7860 -e BERTDEMO_AUTH=ann:s3cret bertdemo   # with a login
#   several behind nginx: deploy/docker-compose.yml; on Kubernetes: deploy/kubernetes.yaml
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 GRADIO_ANALYTICS_ENABLED=False

# Where pip also looks for torch==2.13.0. PyPI's Linux torch wheel is the CUDA build (GBs of CUDA
# libraries); PyTorch's CPU index has the same version as 2.13.0+cpu, which pip then prefers.
# For a CUDA image take PyPI's: docker build --build-arg TORCH_INDEX=https://pypi.org/simple .
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

WORKDIR /app
# jemalloc: app.py runs under it where installed, which keeps the server's memory level as
# fine-tunes and traffic overlap (bertdemo/memory.py; measured by bench/soak.py).
RUN apt-get update && apt-get install -y --no-install-recommends libjemalloc2 \
    && rm -rf /var/lib/apt/lists/*
# README's install command (plus the torch index above).
COPY requirements.txt .
RUN pip install --extra-index-url "$TORCH_INDEX" -r requirements.txt

# Bake the default model in at build time: config, safetensors and tokenizer only, then a test load.
# (This layer reruns when bertdemo/ changes; the download is about 440 MB.)
COPY bertdemo/ bertdemo/
RUN python -m bertdemo download bert-base-uncased --dir /models/bert-base-uncased

COPY . .
# Its ONNX Runtime export made ahead, read at start and never evicted: a container's first request
# takes the fast path and no export runs at start (docs/operations.md, "A warm start").
RUN python -m bertdemo warm /models/bert-base-uncased --into /models/warm
RUN useradd --create-home --uid 1000 bertdemo
USER bertdemo

# The image needs no hub access; GRADIO_SERVER_NAME/PORT are what the app (and Gradio) read.
# MALLOC_ARENA_MAX: for anything started in the container without jemalloc (app.py preloads it
# itself, or caps glibc's arenas where it is missing: bertdemo/memory.py).
ENV BERTDEMO_MODEL=/models/bert-base-uncased BERTDEMO_WARM_DIR=/models/warm HF_HUB_OFFLINE=1 \
    GRADIO_SERVER_NAME=0.0.0.0 GRADIO_SERVER_PORT=7860 MALLOC_ARENA_MAX=2
EXPOSE 7860
# /healthz: 200 once the model is loaded, 503 and why if it could not be
HEALTHCHECK --interval=30s --timeout=5s --start-period=90s --retries=3 \
    CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ['GRADIO_SERVER_PORT'] + '/healthz', timeout=4)"
CMD ["python", "app.py"]
