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
# The release profile keeps line tables (file:line in panics), 235 MB; the image carries the
# symbols but not the debug sections, 47 MB. `--build-arg CARGO_FEATURES=--no-default-features`
# leaves out `berth lab` (the in-memory API server and the netns lab), which production never runs.
ARG CARGO_FEATURES=""
RUN cargo build --release --locked --bin berth $CARGO_FEATURES \
 && mkdir -p /out && objcopy --strip-debug target/release/berth /out/berth

# trixie, Debian's stable release: nftables 1.1.3, whose `nft` reads only the chains a command
# names (1.1.1, "populate chains on demand"), where bookworm's 1.0.6 reads every chain of the
# ruleset first; and iptables 1.8.11. The binary built on bookworm (glibc 2.36) runs on trixie's
# glibc 2.41. `make image` builds the same root filesystem from Debian's archive with mmdebstrap
# (scripts/image.sh), for machines without a registry; keep the package lists alike.
FROM debian:trixie-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables conntrack nftables ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/berth /usr/local/bin/berth
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/berth"]
CMD ["--help"]
