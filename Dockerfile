# syntax=docker/dockerfile:1
#
# kpng's images, one per use, each with what it runs and nothing more:
#
#   docker build --target nft -t registry.example/kpng-nft:latest .
#       kpng alone, on no base (to-nft and to-userspace speak netlink and
#       run no program): deploy/kpng-nft.yaml, deploy/kpng-default-nft.yaml,
#       deploy/kpng-default-userspace.yaml
#   docker build --target iptables -t registry.example/kpng-iptables:latest .
#       kpng and Debian's iptables (to-iptables runs iptables-legacy and
#       iptables-nft, their -save and -restore; util-linux's nsenter for
#       --netns is in every Debian image): deploy/kpng-iptables.yaml,
#       deploy/kpng-default-iptables.yaml
#   docker build -t registry.example/kpng:latest .
#       every program (kpng, kpng-json, kpng-callout, kpng-userspace,
#       kpng-allip) and the blog's all-IP callout script, with iptables and
#       jq (the script needs bash and jq): the examples' manifests
#
#   make image (IMAGE, IMAGE_NFT, IMAGE_IPTABLES name them)
#
# The programs are built by `make image-binaries`, the target the deploy
# package's test runs too (static, -trimpath, stripped: see the Makefile and
# docs/operating.md, "Image"). The bases are named by tag: where a registry
# is reachable, pin them by digest with the build arguments (for example
# --build-arg DEBIAN_IMAGE=debian:bookworm-slim@sha256:…).

ARG GO_VERSION=1.27.3
ARG DEBIAN_RELEASE=bookworm
ARG GO_IMAGE=golang:${GO_VERSION}-${DEBIAN_RELEASE}
ARG DEBIAN_IMAGE=debian:${DEBIAN_RELEASE}-slim

FROM --platform=$BUILDPLATFORM ${GO_IMAGE} AS build
ARG TARGETARCH
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    make image-binaries IMAGE_GOARCH=${TARGETARCH} IMAGE_BIN_DIR=/out

FROM scratch AS nft
COPY --from=build /out/kpng /usr/local/bin/kpng
ENV PATH=/usr/local/bin
LABEL org.opencontainers.image.source="https://sigs.k8s.io/kpng" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.description="kpng's nftables proxier: kpng alone"
CMD ["kpng", "--help"]

FROM ${DEBIAN_IMAGE} AS iptables
RUN apt-get update \
    && apt-get install -y --no-install-recommends iptables \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/kpng /usr/local/bin/kpng
LABEL org.opencontainers.image.source="https://sigs.k8s.io/kpng" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.description="kpng's iptables proxier: kpng and Debian's iptables"
CMD ["kpng", "--help"]

FROM ${DEBIAN_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends iptables jq \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/kpng /out/kpng-json /out/kpng-callout /out/kpng-userspace /out/kpng-allip /usr/local/bin/
COPY examples/allip/kpng-example-allip /usr/local/bin/kpng-example-allip
LABEL org.opencontainers.image.source="https://sigs.k8s.io/kpng" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.description="kpng: the Kubernetes side of specialized service proxiers, and its reference backends"
CMD ["kpng", "--help"]
