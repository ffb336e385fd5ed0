#!/usr/bin/env bash
# Makes sure a Rust toolchain is there: the machine's own `cargo` when it has one, else rustup's
# minimal stable toolchain installed for this user (in ~/.cargo), as rustup.rs documents. berth needs
# Rust 1.89 or newer (Cargo.toml's rust-version); Debian's own cargo package is older.
set -euo pipefail

cargo=${CARGO:-cargo}
if command -v "$cargo" >/dev/null 2>&1; then
    exit 0
fi
if [[ -x $HOME/.cargo/bin/cargo ]]; then
    exit 0
fi
echo "deps: no cargo found; installing Rust with rustup (stable, minimal profile) into $HOME/.cargo"
if ! command -v curl >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl ca-certificates gcc libc6-dev >/dev/null
fi
curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs |
    sh -s -- -y --profile minimal --default-toolchain stable --no-modify-path
"$HOME/.cargo/bin/rustup" component add rustfmt clippy
