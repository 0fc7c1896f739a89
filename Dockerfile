# ortrain for GPU clusters (docs/examples/ortrain-pytorchjob.yaml uses it):
# ortrain and its worker built against the CUDA libtorch of a PyTorch image
# (torch, NCCL and CUDA from the wheel; the worker's rpath points there, so
# the runtime stage is the same image family without the compilers).
#
#   docker build -t ortrain .
#   docker build --build-arg TORCH_TAG=2.5.1-cuda12.4-cudnn9 -t ortrain .
#   docker run --gpus all -v $HOME/.cache/huggingface:/hf ortrain doctor
#
# Its steps are `make install PREFIX=/opt/ortrain` and the installed
# binary finding its worker; scripts/check-install runs the same on a CPU
# machine (CI does, on Debian's libtorch). Models are never downloaded at
# run time: mount a Hugging Face cache at /hf (HF_HOME), or pass a
# directory with --model.
ARG TORCH_TAG=2.5.1-cuda12.4-cudnn9
ARG GO_IMAGE=golang:1.26-bookworm

FROM ${GO_IMAGE} AS go

FROM pytorch/pytorch:${TORCH_TAG}-devel AS build
RUN apt-get update && apt-get install -y --no-install-recommends make g++ git ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=go /usr/local/go /usr/local/go
ENV PATH=/usr/local/go/bin:$PATH GOFLAGS=-mod=readonly
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# install-libtorch.sh finds the image's pip torch and installs nothing;
# build-worker.sh builds against it (C++20 for torch 2.x, NCCL and Gloo).
RUN make install PREFIX=/opt/ortrain && /opt/ortrain/bin/ortrain version

FROM pytorch/pytorch:${TORCH_TAG}-runtime
COPY --from=build /opt/ortrain /opt/ortrain
ENV PATH=/opt/ortrain/bin:$PATH HF_HOME=/hf
WORKDIR /work
# doctor fails the build when the worker cannot be found or opened.
RUN ortrain doctor || (echo "the installed worker does not load in the runtime image" >&2; exit 1)
ENTRYPOINT ["ortrain"]
CMD ["--help"]
