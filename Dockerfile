# syntax=docker/dockerfile:1
# Multi-stage build: dependencies are cached in their own layer (cargo-chef), the
# runtime image is slim Debian with CA certificates, running as a non-root user (UID 10001).
# Migrations are embedded into the binary at compile time, so migrations/ must be in
# the build context (see .dockerignore).

FROM rust:1.95-slim-bookworm AS chef
RUN cargo install cargo-chef --locked --version 0.1.78
WORKDIR /app

FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS builder
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
COPY --from=planner /app/recipe.json recipe.json
RUN cargo chef cook --release --locked --recipe-path recipe.json --bin x402-router
COPY . .
RUN cargo build --release --locked --bin x402-router

FROM debian:bookworm-slim AS runtime
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 router \
    && useradd --system --uid 10001 --gid 10001 --no-create-home router
COPY --from=builder /app/target/release/x402-router /usr/local/bin/x402-router
# Numeric, so that Kubernetes can check `runAsNonRoot` without reading /etc/passwd.
USER 10001:10001
ENV BIND=0.0.0.0:8080
EXPOSE 8080
ENTRYPOINT ["x402-router"]
CMD ["serve"]
