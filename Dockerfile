# The whole course, Triton included, for machines where Triton does not install (macOS, Windows, Arm Linux).
# Triton ships wheels for Linux x86-64 only, so the image is built for linux/amd64 (emulated on Apple silicon):
#   docker build --platform linux/amd64 -t loops-to-kernels .
#   docker run --rm -it --platform linux/amd64 -p 8888:8888 -v "$PWD":/course loops-to-kernels
# then open the http://127.0.0.1:8888/lab?token=... address it prints. `make test` runs the test suite inside.
FROM python:3.11-slim

RUN apt-get update && apt-get install -y --no-install-recommends make git && rm -rf /var/lib/apt/lists/*
WORKDIR /course
# Install first from the package definition alone, so that editing a notebook does not reinstall.
COPY pyproject.toml README.md Makefile ./
COPY course_utils/__init__.py course_utils/__init__.py
# The CPU build of PyTorch (a plain `pip install torch` pulls the multi-GB CUDA build).
ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_INDEX="https://download.pytorch.org/whl/cpu"
RUN python -m venv .venv \
    && .venv/bin/pip install --quiet --index-url "$TORCH_INDEX" "$TORCH_SPEC" \
    && .venv/bin/pip install --quiet -e ".[dev]" \
    && touch .venv/.installed
COPY . .
EXPOSE 8888
# `make lab` with the address reachable from the host.
CMD ["make", "lab", "LAB_ARGS=--ip=0.0.0.0 --no-browser"]
