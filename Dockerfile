# The single berth image: `berth controller`, `berth agent` and the other subcommands.
#
#   docker build -t ghcr.io/berth-dev/berth:dev .
#
# Build stage: the workspace in release mode. Runtime stage: Debian slim with the tools the agent
# runs (iptables and ip6tables, both the nft and legacy variants; conntrack; nft for the nftables
# backend). The image's user is non-root (65532), which the controller runs as; the chart runs
# the agent as root with only NET_ADMIN and NET_RAW. `make test` proves that the COPY lines below
# are enough to build the binary (scripts/image-context.sh); it does not pull a base image.

FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
# The root manifest declares the benches: cargo reads their files before it builds anything.
COPY benches benches
COPY crates crates
COPY src src
RUN cargo build --release --locked --bin berth \
 && install -D -m 0755 target/release/berth /out/berth

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables conntrack nftables ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/berth /usr/local/bin/berth
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/berth"]
CMD ["--help"]
