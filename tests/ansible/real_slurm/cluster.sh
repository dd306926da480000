#!/usr/bin/env bash
# The ladder's real Slurm (rung real_slurm): tests/cluster's recipe — Debian's Slurm 22.05, munge with its own
# socket, one network + UTS + mount namespace per host on a bridge — in its own state directory, with its own
# bridge, network and cluster name, and a shape of its own: a controller, GPU nodes and a login host, each a
# "holder" process whose namespaces see that host's root: /etc/slurm, /run and /etc/hosts are bind-mounted from
# it, GPU nodes get a private /dev with fake GPUs (char devices 195:N). Commands enter a host with bin/in-host.
# slurmctld and slurmd are started by the role's own `systemctl` calls (bin/systemctl) or by the rung.
#
#   cluster.sh up BASE HOSTS_FILE    HOSTS_FILE lines: NAME KIND ROOT GPUS  (KIND: controller, node or login)
#   cluster.sh down BASE             every daemon, holder, namespace and link of BASE; safe when nothing runs
#
# Never two clusters at once on one machine: the rung stops the Python suites' cluster (tests/cluster) first.
set -euo pipefail
cmd=${1:?usage: cluster.sh up|down BASE [HOSTS_FILE]}
export HPCTRAIN_SLURM_DIR=${2:?state directory}
export HPCTRAIN_SLURM_NET=${HPCTRAIN_REAL_SLURM_NET:-10.79.0}
export HPCTRAIN_SLURM_BRIDGE=br-hpct-ans
export HPCTRAIN_SLURM_NODES=2   # gpu01, gpu02: common.sh's node names, namespaces, links and pid files
LOG_TAG=real-slurm
# shellcheck source-path=SCRIPTDIR source=../../cluster/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../cluster/common.sh"
export -n SLURM_CONF  # not exported: every host reads its own /etc/slurm/slurm.conf (or fetches it): none is the harness's

login_ns() { echo "hpctrain-$1"; }
login_veth() { echo "veth-$1"; }

holder() { # NAME NETNS ROOT GPUS: the process whose namespaces are the host
    local name=$1 ns=$2 root=$3 gpus=$4 enter=()
    [[ $ns != - ]] && enter=(nsenter "--net=/run/netns/$ns")
    mkdir -p "$root/etc/slurm" "$root/run/munge"
    # Clients and a configless slurmd (before it has a slurm.conf) use munge's default socket.
    ln -sfn "$SOCK" "$root/run/munge/munge.socket.2"
    # shellcheck disable=SC2016 # expanded by the inner shell
    "${enter[@]}" unshare --uts --mount --propagation private sh -c '
        set -e
        hostname "$1"
        mount --bind "$2/etc/slurm" /etc/slurm
        mount --bind "$2/run" /run
        mount --bind "$3" /etc/hosts
        if [ "$4" -gt 0 ]; then
            mount -t tmpfs -o mode=755 hpctrain-dev /dev
            mknod -m 666 /dev/null c 1 3; mknod -m 666 /dev/zero c 1 5; mknod -m 666 /dev/full c 1 7
            mknod -m 666 /dev/random c 1 8; mknod -m 666 /dev/urandom c 1 9; mknod -m 666 /dev/tty c 5 0
            ln -s /proc/self/fd /dev/fd; ln -s /proc/self/fd/0 /dev/stdin
            ln -s /proc/self/fd/1 /dev/stdout; ln -s /proc/self/fd/2 /dev/stderr
            mkdir /dev/shm /dev/pts; mount -t tmpfs hpctrain-shm /dev/shm
            i=0; while [ "$i" -lt "$4" ]; do mknod -m 666 "/dev/nvidia$i" c 195 "$i"; i=$((i + 1)); done
            mknod -m 666 /dev/nvidiactl c 195 255
        fi
        exec sleep infinity' holder "$name" "$root" "$BASE/etc/hosts" "$gpus" \
        </dev/null >>"$BASE/log/holders.out" 2>&1 9>&- &
    echo $! >"$BASE/run/holder-$name.pid"
}

up() {
    local hosts_file=${1:?hosts file} name kind root gpus ns ip i=0 pid
    if ((EUID != 0)); then echo "cluster.sh: needs root" >&2; exit 2; fi
    if have_link "$BR" || [[ -n $(stray_pids) ]]; then log "a cluster of $BASE is still up: stopping it"; down; fi
    mkdir -p "$BASE"/{etc,munge/run,run,log,spool}
    chmod 711 "$BASE/munge" "$BASE/munge/run"
    {
        echo "127.0.0.1 localhost"
        while read -r name kind root gpus; do
            case $kind in controller) ip=$CTL_IP ;; node) ip=$(ip_of "$name") ;; login) i=$((i + 1)); ip=$NET.$((20 + i)) ;; esac
            echo "$ip $name"
        done <"$hosts_file"
    } >"$BASE/etc/hosts"
    [[ -s $BASE/munge/munge.key ]] || mungekey -c -k "$BASE/munge/munge.key"
    munged -S "$SOCK" --key-file="$BASE/munge/munge.key" --pid-file="$BASE/munge/munged.pid" \
        --log-file="$BASE/log/munged.log" --seed-file="$BASE/munge/munged.seed" </dev/null >>"$BASE/log/daemons.out" 2>&1 9>&-
    wait_daemon 10 munged "$BASE/munge/munged.pid" sh -c "munge -S '$SOCK' -n | unmunge -S '$SOCK'"
    ip link add "$BR" type bridge
    ip addr add "$CTL_IP/24" dev "$BR"
    ip link set "$BR" up
    while read -r name kind root gpus; do
        ns=-
        if [[ $kind != controller ]]; then
            ip=$(awk -v n="$name" '$2 == n {print $1}' "$BASE/etc/hosts")
            if [[ $kind == node ]]; then ns=$(netns_of "$name"); link=$(veth_of "$name"); else ns=$(login_ns "$name"); link=$(login_veth "$name"); fi
            ip netns add "$ns"
            ip link add "$link" type veth peer name eth0 netns "$ns"
            ip link set "$link" master "$BR" up
            ip -n "$ns" addr add "$ip/24" dev eth0
            ip -n "$ns" link set eth0 up
            ip -n "$ns" link set lo up
        fi
        holder "$name" "$ns" "$root" "$gpus"
        echo "$ns" >"$BASE/run/holder-$name.netns"
    done <"$hosts_file"
    for f in "$BASE"/run/holder-*.pid; do
        pid=$(read_pid "$f")
        wait_for 10 "holder $f" sh -c "[ \"\$(cat /proc/$pid/comm 2>/dev/null)\" = sleep ]"
    done
    log "munged, bridge $BR ($CTL_IP) and $(ls "$BASE"/run/holder-*.pid | wc -l) hosts up"
}

down() {
    local f pid ns pids=()
    [[ -d $BASE/run ]] || return 0
    # Daemons the rung or the systemctl stand-in started in the hosts (pid files by host name).
    for f in "$BASE"/run/slurmctld.pid "$BASE"/run/slurmd-*.pid; do
        pid=$(read_pid "$f" 2>/dev/null) || continue
        pid_alive "$pid" && pids+=("$pid")
    done
    if ((${#pids[@]} > 0)); then stop_pids "${pids[@]}"; log "slurm daemons stopped (${pids[*]})"; fi
    pids=()
    for f in "$BASE"/run/holder-*.pid; do
        [[ -e $f ]] || continue
        pid=$(read_pid "$f")
        pid_is "$pid" sleep && pids+=("$pid")
        ns=$(cat "${f%.pid}.netns" 2>/dev/null || echo -)
        if [[ $ns != - ]] && have_netns "$ns"; then
            mapfile -t left < <(ip netns pids "$ns" 2>/dev/null || true)
            ((${#left[@]} == 0)) || kill -KILL "${left[@]}" 2>/dev/null || true
        fi
    done
    if ((${#pids[@]} > 0)); then stop_pids "${pids[@]}"; fi
    for f in "$BASE"/run/holder-*.netns; do
        [[ -e $f ]] || continue
        ns=$(cat "$f")
        name=$(basename "$f" .netns); name=${name#holder-}
        [[ $ns == - ]] && continue
        for link in "$(veth_of "$name")" "$(login_veth "$name")"; do have_link "$link" && ip link del "$link"; done
        have_netns "$ns" && ip netns del "$ns"
    done
    rm -f "$BASE"/run/holder-*
    # The rest is tests/cluster's own teardown: munged, strays naming $BASE, veths, namespaces, the bridge.
    stop_cluster
}

case $cmd in
    up) up "${3:-}" ;;
    down) down ;;
    *) echo "usage: cluster.sh up BASE HOSTS_FILE | down BASE" >&2; exit 2 ;;
esac
