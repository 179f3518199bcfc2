#!/usr/bin/env bash
# Installs what the tests and the demo need, only when it is missing.
# Each line of the lists (default scripts/apt-deps.txt) is "<command-or-path> <debian-package>".
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
lists=("$@")
((${#lists[@]})) || lists=("$here/apt-deps.txt")
missing=()
while read -r probe pkg; do
    [[ -z "${probe:-}" || "$probe" == \#* ]] && continue
    if [[ "$probe" == /* ]]; then
        [[ -e "$probe" ]] && continue
    else
        command -v "$probe" >/dev/null 2>&1 && continue
    fi
    missing+=("$pkg")
done < <(cat "${lists[@]}")
if ((${#missing[@]})); then
    echo "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Rust toolchain and cargo are the machine's; nothing to fetch here.
command -v cargo >/dev/null || { echo "cargo is required (rustup)"; exit 1; }
