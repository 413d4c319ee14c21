# syntax=docker/dockerfile:1
#
# The carma image: one binary, /usr/bin/carma. Every component runs a subcommand of it (the chart's
# device-plugin DaemonSet runs `carma device-plugin`, the extender Deployment `carma scheduler-extender`,
# the operator Deployment `carma operator`). Build it with
#
#   tools/build-image.sh            # tags it exactly as charts/carma references it by default
#
# which runs `docker build` (or `podman build`) on this file with the repository as context; the root
# .dockerignore keeps target/, .tools/ and the like out of the context.
#
# User: the image runs as the unprivileged UID/GID 65532 ("nonroot"), as the extender, the operator and
# the chart's pod security context expect. The device plugin cannot: the kubelet's device-plugin
# directory and socket belong to root, so its DaemonSet sets its own securityContext (UID 0 without any
# capability, no privilege escalation, read-only root filesystem) over this default.

# Base images: build arguments whose defaults are the public images, which is what users get.
#   RUST_IMAGE     the build stage: the rust image of RUST_VERSION on Debian 12. The project is tested
#                  with 1.95 (workspace minimum: 1.91).
#   RUNTIME_IMAGE  what the binary runs in: distroless cc on Debian 12, user nonroot (65532).
# Either can be pinned by digest (--build-arg RUNTIME_IMAGE=gcr.io/distroless/cc-debian12@sha256:...).
# CI reaches no container registry: ci/image.sh makes equivalents of both from Debian packages, names
# them localhost/carma-ci/..., and passes those names here, so CI builds this very file
# (docs/image-build.md).
ARG RUST_VERSION=1.95
ARG RUST_IMAGE=docker.io/library/rust:${RUST_VERSION}-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY . .
# Cache mounts keep the crate registry and the build directory between builds (BuildKit, Buildah).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p carma \
 && install -D -m 0755 target/release/carma /out/usr/bin/carma

# glibc, libgcc and CA certificates, nothing else: no shell, no package manager. Debian 12 like the
# build stage, so the binary finds the glibc it was linked against. NVML (libnvidia-ml.so) is not in the
# image: the NVIDIA container runtime injects it into the device plugin's container.
FROM ${RUNTIME_IMAGE}
ARG VERSION=dev
LABEL org.opencontainers.image.title="carma" \
      org.opencontainers.image.description="Collocation-aware GPU sharing for deep-learning training on Kubernetes: device plugin, scheduler extender and operator in one binary" \
      org.opencontainers.image.source="https://github.com/carma-io/carma" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /out/usr/bin/carma /usr/bin/carma
USER 65532:65532
ENTRYPOINT ["/usr/bin/carma"]
CMD ["--help"]
