# syntax=docker/dockerfile:1
#
# The kpng image: the controller (kpng, with its in-process backends
# to-nft, to-iptables, to-userspace, to-json), kpng-json, kpng-callout,
# kpng-userspace, kpng-allip and the blog's all-IP callout script.
#
#   docker build -t registry.example/kpng:latest .     # or: make image IMAGE=...
#
# The programs are built by `make image-binaries`, the target the deploy
# package's test runs too (static, -trimpath, stripped: see the Makefile and
# docs/operating.md, "Image"). The runtime stage is Debian because
# `to-local to-iptables` runs Debian's iptables binaries (iptables-legacy and
# iptables-nft, their -save and -restore; util-linux's nsenter for --netns is
# in every Debian image) and the all-IP script needs bash and jq; to-nft
# speaks netlink and needs no binary.

ARG GO_VERSION=1.27.3
ARG DEBIAN_RELEASE=bookworm

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}-${DEBIAN_RELEASE} AS build
ARG TARGETARCH
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    make image-binaries IMAGE_GOARCH=${TARGETARCH} IMAGE_BIN_DIR=/out

FROM debian:${DEBIAN_RELEASE}-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends iptables jq \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/kpng /out/kpng-json /out/kpng-callout /out/kpng-userspace /out/kpng-allip /usr/local/bin/
COPY examples/allip/kpng-example-allip /usr/local/bin/kpng-example-allip
LABEL org.opencontainers.image.source="https://sigs.k8s.io/kpng" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.description="kpng: the Kubernetes side of specialized service proxiers, and its reference backends"
CMD ["kpng", "--help"]
