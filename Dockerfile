# syntax=docker/dockerfile:1.7
# ec2-topology-labeler: a static (musl) binary on an empty image, running as non-root.
#   docker buildx build --platform linux/amd64,linux/arm64 -t ec2-topology-labeler .
# Each platform builds natively (QEMU under buildx for the other one); Graviton nodes (hpc7g)
# need arm64.

FROM rust:1.95-bookworm AS build
ARG TARGETARCH
# The same file builds the test double for the kind path: --build-arg PACKAGE=mock-ec2.
ARG PACKAGE=ec2-topology-labeler
RUN apt-get update && apt-get install -y --no-install-recommends musl-tools && rm -rf /var/lib/apt/lists/*
RUN case "${TARGETARCH:-amd64}" in \
      amd64) echo x86_64-unknown-linux-musl > /rust-target ;; \
      arm64) echo aarch64-unknown-linux-musl > /rust-target ;; \
      *) echo "unsupported TARGETARCH ${TARGETARCH}" >&2; exit 1 ;; \
    esac && rustup target add "$(cat /rust-target)"
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --target "$(cat /rust-target)" -p "${PACKAGE}" --bin "${PACKAGE}" \
 && cp "target/$(cat /rust-target)/release/${PACKAGE}" /app

FROM scratch
# TLS roots for the EC2 endpoint (the in-cluster API server's CA comes from the ServiceAccount).
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /app /app
USER 65532:65532
ENTRYPOINT ["/app"]
