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
RUN cargo chef cook --release --locked --recipe-path recipe.json
COPY . .
RUN cargo build --release --locked --bin x402-router --bin x402-test-upstream

# The pinned local chain of the demo stack (tools/package-lock.json: anvil's npm package).
FROM node:20-bookworm-slim AS tools
WORKDIR /tools
COPY tools/package.json tools/package-lock.json tools/.npmrc ./
RUN npm ci --ignore-scripts --no-audit --no-fund \
    && cp node_modules/@foundry-rs/anvil-linux-*/bin/anvil /usr/local/bin/anvil

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

# The demo stack of docker-compose.yml: a local chain (anvil) and the project's x402 test
# upstream, for development only (never real money). Build with --target demo.
FROM debian:bookworm-slim AS demo
RUN groupadd --system --gid 10001 demo && useradd --system --uid 10001 --gid 10001 --no-create-home demo
COPY --from=tools /usr/local/bin/anvil /usr/local/bin/anvil
COPY --from=builder /app/target/release/x402-test-upstream /usr/local/bin/x402-test-upstream
USER 10001:10001

# The service image (the default target): last, so that `docker build .` builds it.
FROM runtime
