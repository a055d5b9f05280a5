#!/usr/bin/env bash
# Wall time of playbooks/validate.yml over 3 namespace hosts (real sshd in
# each, its own hostname, /etc/hosts and remote directory, as in
# tests/services/ansible.rs) beside Ansible's own floor: a play that runs only
# `ansible.builtin.command: /bin/true` on the same hosts. The difference
# is what preflight adds (copying the binary when it changed, the
# checklist, fetching the reports, the summary play). ROUNDS runs of each,
# interleaved; the median is reported. Needs root; installs openssh-server
# and an ansible-core virtual environment (/opt/preflight-ansible, as
# .ci/run does) if missing.
#
#   bench/ansible-validate.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
n=3
tag=pa$$
br=${tag}br
net=10.231.78
venv=${PREFLIGHT_ANSIBLE_VENV:-/opt/preflight-ansible}
[ -x /usr/sbin/sshd ] || DEBIAN_FRONTEND=noninteractive apt-get install -y openssh-server >/dev/null
if ! "$venv/bin/python" -c 'import ansible' 2>/dev/null; then
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install -q 'ansible-core==2.19.14'
fi
. bench/binary.sh
bin=$(preflight_bin)
work=$(mktemp -d)
pids=()
cleanup() {
    for i in $(seq 0 $((n - 1))); do
        # sshd and the sessions it started, all inside our namespaces.
        for p in $(ip netns pids "${tag}_$i" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
        ip netns del "${tag}_$i" 2>/dev/null || true
    done
    ip link del "$br" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
ip link add "$br" type bridge && ip link set "$br" up
ip addr add $net.254/24 dev "$br"
mkdir -p /run/sshd "$work/remote" "$work/reports" "$work/home"
ssh-keygen -q -t ed25519 -N '' -f "$work/hostkey"
ssh-keygen -q -t ed25519 -N '' -f "$work/id"
cp "$work/id.pub" "$work/authorized_keys"
{
    echo "[nodes]"
    for i in $(seq 0 $((n - 1))); do echo "h$i ansible_host=$net.$((i + 1))"; done
    echo "[nodes:vars]"
    echo "ansible_user=root"
    echo "ansible_ssh_private_key_file=$work/id"
    echo "ansible_ssh_common_args='-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR'"
    echo "ansible_python_interpreter=/usr/bin/python3"
} >"$work/inventory"
for i in $(seq 0 $((n - 1))); do
    ns=${tag}_$i
    ip netns add "$ns"
    ip link add "v${tag}$i" type veth peer name eth0 netns "$ns"
    ip link set "v${tag}$i" master "$br" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add $net.$((i + 1))/24 dev eth0
    ip -n "$ns" link set eth0 up
    mkdir -p "$work/disk$i"
    { echo "127.0.0.1 localhost"; for o in $(seq 0 $((n - 1))); do echo "$net.$((o + 1)) h$o"; done; } >"$work/hosts$i"
    cat >"$work/sshd$i.conf" <<CONF
ListenAddress $net.$((i + 1)):22
HostKey $work/hostkey
PidFile none
PermitRootLogin prohibit-password
PasswordAuthentication no
AuthorizedKeysFile $work/authorized_keys
StrictModes no
UsePAM no
UseDNS no
Subsystem sftp internal-sftp
CONF
    ip netns exec "$ns" unshare --uts --mount sh -c \
        'hostname "$1" && mount --bind "$2" /etc/hosts && mount --bind "$3" "$4" && shift 4 && exec "$@"' \
        sh "h$i" "$work/hosts$i" "$work/disk$i" "$work/remote" /usr/sbin/sshd -D -E "$work/sshd$i.log" -f "$work/sshd$i.conf" &
    disown
done
for i in $(seq 0 $((n - 1))); do
    for _ in $(seq 100); do
        (exec 3<>/dev/tcp/$net.$((i + 1))/22) 2>/dev/null && break
        sleep 0.1
    done
done
cat >"$work/floor.yml" <<'PLAY'
---
- name: Ansible's floor
  hosts: all
  gather_facts: false
  tasks:
    - name: Nothing
      ansible.builtin.command: /bin/true
      changed_when: false
PLAY
export HOME=$work/home ANSIBLE_HOST_KEY_CHECKING=False ANSIBLE_NOCOLOR=1
play() {
    local start end
    start=$(date +%s.%N)
    "$venv/bin/ansible-playbook" -i "$work/inventory" "$@" >"$work/last.log" 2>&1 || {
        cat "$work/last.log" >&2
        exit 1
    }
    end=$(date +%s.%N)
    echo "$end - $start" | bc
}
vars=(-e "preflight_binary=$bin" -e "preflight_remote_dir=$work/remote" -e "preflight_report_dir=$work/reports")
# The first validate run copies the binary; later runs find it in place, as
# a periodic validation would.
play playbooks/validate.yml "${vars[@]}" >/dev/null
validate=()
floor=()
for _ in $(seq "$rounds"); do
    validate+=("$(play playbooks/validate.yml "${vars[@]}")")
    floor+=("$(play "$work/floor.yml")")
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
v=$(median "${validate[@]}")
f=$(median "${floor[@]}")
echo "hosts: $n, rounds: $rounds"
echo "validate.yml: median ${v}s (runs: ${validate[*]})"
echo "/bin/true play: median ${f}s (runs: ${floor[*]})"
echo "preflight adds: $(echo "$v - $f" | bc)s"
ls "$work/reports"
