#!/usr/bin/env bash
# The release binary: x86_64 Linux, starting on glibc 2.17 and later
# (RHEL/CentOS 7, Rocky/RHEL 8 with 2.28, Ubuntu 18.04+), built with
# `cargo zigbuild` against glibc 2.17's symbol versions. It stays
# dynamically linked: libnccl and libccl are loaded with dlopen at run
# time, which a static (musl) binary cannot do.
#
# Needs zig (the `ziglang` package on PyPI, in the venv PREFLIGHT_ZIG_VENV,
# default /opt/preflight-zig) and cargo-zigbuild (`cargo install
# cargo-zigbuild`); `.ci/install` installs both. Writes dist/preflight,
# its .deb and .rpm (tools/package.sh: dpkg-deb and rpmbuild) and
# dist/SHA256SUMS of all three, and says the highest GLIBC symbol version
# the binary needs.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${PREFLIGHT_ZIG_VENV:-/opt/preflight-zig}
# cargo-zigbuild runs `python3 -m ziglang` when no `zig` is on PATH.
export PATH="$venv/bin:$HOME/.cargo/bin:$PATH"
target=x86_64-unknown-linux-gnu
# Said plainly on a fresh machine, rather than cargo's "no such command".
if ! command -v cargo-zigbuild >/dev/null; then
    echo "tools/release.sh needs cargo-zigbuild (cargo install cargo-zigbuild) and zig (pip install ziglang into $venv, or zig on PATH); .ci/install installs both" >&2
    exit 2
fi
if ! command -v zig >/dev/null && ! python3 -c 'import ziglang' 2>/dev/null; then
    echo "tools/release.sh needs zig: pip install ziglang into $venv (python3 -m venv $venv), or zig on PATH; .ci/install installs it" >&2
    exit 2
fi
cargo zigbuild --release --quiet --locked --target "$target.2.17" --bin preflight
mkdir -p dist
cp "target/$target/release/preflight" dist/preflight
rm -f dist/preflight_*.deb dist/preflight-*.rpm
packages=$(BIN=dist/preflight OUT=dist tools/package.sh)
(cd dist && sha256sum preflight $(for p in $packages; do basename "$p"; done) > SHA256SUMS)
highest=$(objdump -T dist/preflight | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
echo "dist/preflight: needs $highest at most; $(head -1 dist/SHA256SUMS | cut -c1-16)… (dist/SHA256SUMS)"
echo "packages: $(echo $packages)"
