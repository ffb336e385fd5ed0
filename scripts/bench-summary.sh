#!/usr/bin/env bash
# Prints, for each benchmark log given, its last `<name>: k=v ...` line: the result line every
# berth benchmark ends with. A log without one is reported, and makes the summary fail.
set -euo pipefail

status=0
echo "== bench summary =="
for log in "$@"; do
    line=$(grep -E '^[A-Za-z0-9_.-]+: [A-Za-z0-9_.-]+=[^ ]+( [A-Za-z0-9_.-]+=[^ ]+)*$' "$log" | tail -n 1 || true)
    if [[ -n $line ]]; then
        echo "$line"
    else
        echo "$(basename "$log" .log): no result line" >&2
        status=1
    fi
done
exit "$status"
