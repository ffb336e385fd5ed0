#!/usr/bin/env bash
# Proves that the Dockerfile's build stage copies enough of the repository to build the binary:
# exactly what its COPY lines name is copied into an empty directory, and `cargo build --locked
# --bin berth` runs there, as `docker build` would. A file the build needs but the Dockerfile
# does not copy (a bench the root manifest declares, a path dependency) fails here, not in the
# first user's `docker build`.
#
# The build shares the repository's target directory: cargo keys a workspace's artifacts by paths
# relative to the workspace root, so an unchanged tree builds nothing again.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cargo=${CARGO:-cargo}
target=${CARGO_TARGET_DIR:-$repo/target}
dockerfile=$repo/Dockerfile

context=$(mktemp -d "${TMPDIR:-/tmp}/berth-image-context.XXXXXX")
trap 'rm -rf "$context"' EXIT

# The build stage is everything before the second FROM; its COPY lines without --from copy from
# the build context. Each is `COPY <source>... <destination>` relative to WORKDIR.
copies=$(awk '/^FROM /{ n++ } n == 1 && /^COPY / && !/--from/' "$dockerfile")
if [[ -z $copies ]]; then
    echo "image-context: no COPY lines in the Dockerfile's build stage" >&2
    exit 1
fi
while read -r _ words; do
    read -r -a args <<<"$words"
    dest=${args[-1]}
    unset 'args[-1]'
    for source in "${args[@]}"; do
        if [[ ! -e $repo/$source ]]; then
            echo "image-context: the Dockerfile copies $source, which does not exist" >&2
            exit 1
        fi
        if [[ $dest == */ || ${#args[@]} -gt 1 ]]; then
            mkdir -p "$context/$dest"
            cp -a "$repo/$source" "$context/$dest"
        else
            mkdir -p "$(dirname "$context/$dest")"
            cp -a "$repo/$source" "$context/$dest"
        fi
    done
done <<<"$copies"

echo "image-context: built from $(cd "$context" && echo *)"
cd "$context"
CARGO_TARGET_DIR=$target "$cargo" build --locked --bin berth
echo "image-context: the Dockerfile's build context builds berth"
