#!/usr/bin/env bash
# CI: on a fresh Debian machine, as root, install what the tests need, then
# run exactly the README's test command.
set -euo pipefail
cd "$(dirname "$0")/.."

# The machine's one Rust toolchain (rustup's stable) is what builds the
# project; Debian's cargo is too old for edition 2024, and no other
# toolchain can be fetched here, so say so plainly instead of failing later.
if ! command -v cargo >/dev/null 2>&1; then
    [ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
fi
command -v cargo >/dev/null 2>&1 || { echo ".ci/run: cargo (Rust >= 1.85) is required" >&2; exit 1; }

export DEBIAN_FRONTEND=noninteractive
apt_packages=(
    build-essential  # cc and the linker for crates with C parts (ring)
    iproute2      # network namespaces and veth pairs: the test hosts
    iptables      # DROP/REJECT faults inside a test host; the firewall check reads them back
    nftables      # the same with nft, the other backend found in the field
    procps        # sysctl and ps for the tests' own process bookkeeping
    util-linux    # unshare and mount: a hostname and /etc/hosts per test host
    bsdutils      # script: a real terminal (pty) for the colour and progress test
    python3       # small listeners and port holders inside the test hosts
    python3-pip   # fetches the real oneCCL and NCCL libraries from PyPI
    unzip         # unpacks those wheels
    libfabric1    # oneCCL's transport library (the wheels do not ship it)
    python3-torch # the torch_distributed check's real torch (CPU, Gloo)
    openssh-server # sshd in each test host, for the Ansible playbooks
    openssh-client # ssh and ssh-keygen: Ansible's transport
    python3-venv  # the virtual environment ansible-core and ansible-lint live in
    openssl       # a site's own CA and a server certificate for the https test
)
missing=()
for p in "${apt_packages[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The real collective libraries (oneCCL on CPU, libnccl.so.2), cached in
# PREFLIGHT_LIB_CACHE between runs and fetched from PyPI when absent.
tests/setup/collective-libs.sh

# ansible-core and ansible-lint for tests/ansible.rs, in a virtual
# environment of Debian's python3 (the managed hosts' interpreter too),
# pinned to the versions the playbooks were written against.
ANSIBLE_VENV="${PREFLIGHT_ANSIBLE_VENV:-/opt/preflight-ansible}"
if ! "$ANSIBLE_VENV/bin/python" -c 'import ansible, ansiblelint' >/dev/null 2>&1; then
    /usr/bin/python3 -m venv "$ANSIBLE_VENV"
    "$ANSIBLE_VENV/bin/pip" install -q 'ansible-core==2.19.14' 'ansible-lint==26.10.1'
fi
export PREFLIGHT_ANSIBLE_VENV="$ANSIBLE_VENV"

# Tests that need namespaces, root or those libraries skip with a reason on
# a developer's machine; in CI a skip would hide a regression, so they must
# run.
export PREFLIGHT_REQUIRE_NETNS=1
export PREFLIGHT_REQUIRE_LIBS=1

