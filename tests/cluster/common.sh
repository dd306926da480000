# shellcheck shell=bash disable=SC2034  # the settings below are used by the scripts that source this
# Shared settings and helpers for tests/cluster/slurm-up, slurm-down and check-clean.
# Sourced, never run. Callers set -euo pipefail themselves.
#
# Everything the cluster owns lives under $BASE (default <repo>/.slurm, git-ignored):
#   etc/      slurm.conf, gres.conf, slurmdbd.conf, hosts (the nodes' /etc/hosts view)
#   munge/    key, seed, pid file and socket (run/munge.socket.2)
#   mysql/    mariadb datadir and socket        state/  slurmctld StateSaveLocation
#   spool/    one SlurmdSpoolDir per node        dev/    fake GPU character devices
#   log/      every daemon's log                 run/    pid files, config fingerprint
#   env.sh    `source` it to use the client commands
#   cluster.json  the cluster's shape for the Python harness (tests/cluster/harness.py)

HARNESS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$HARNESS_DIR/../.." && pwd)

# ---- parameters (environment overrides; the tests rely on the defaults) ----
BASE=${HPCTRAIN_SLURM_DIR:-$REPO_ROOT/.slurm}
# The Slurm version to run and what differs between versions.
# shellcheck source-path=SCRIPTDIR source=versions.sh
source "$HARNESS_DIR/versions.sh"
NNODES=${HPCTRAIN_SLURM_NODES:-2}
NET=${HPCTRAIN_SLURM_NET:-10.77.0}          # an unused /24: controller .1, node i .(10+i)
# Up to 244 nodes fit that /24; a larger cluster (benchmarks/scale_cluster.py: 256) takes a /22 from the same start
# (its third octet a multiple of 4), node i at host number 10+i counted across it (gpu256: 10.77.1.10).
NET_PREFIX=24
if ((${HPCTRAIN_SLURM_NODES:-2} > 244)); then NET_PREFIX=22; fi
# Past 64 nodes every host's ARP table is written by slurm-up and Slurm's TCP and RPC timeouts are longer (slurm-up).
STATIC_NEIGHBOURS=0
if ((${HPCTRAIN_SLURM_NODES:-2} > 64)); then STATIC_NEIGHBOURS=1; fi
BR=${HPCTRAIN_SLURM_BRIDGE:-br-hpctrain}
DB_PORT=${HPCTRAIN_SLURM_DB_PORT:-16033}    # mariadb on 127.0.0.1 only (not 3306: leave a site's own DB alone)
CLUSTER=hpctrain
CPUS_PER_NODE=8                             # oversubscribed (SlurmdParameters=config_overrides)
GPUS_PER_NODE=4                             # fake GPUs: gres gpu backed by mknod char devices
MEM_PER_NODE=16000                          # MB, so --mem=4G fits (not consumable: CR_Core)
CRED_EXPIRE=${HPCTRAIN_SLURM_CRED_EXPIRE:-5}   # requeue hold: cred_expire + 1 s (Slurm default 120; minimum 5)
MAX_ARRAY_SIZE=${HPCTRAIN_SLURM_MAX_ARRAY_SIZE:-}  # unset: Slurm's default (1001); the sweep-split test lowers it
ACCOUNT=research
DEFAULT_PARTITION=gpu
PARTITIONS=(gpu debug)                     # gpu is the default
CTLD_PORT=6817
SLURMD_PORT=6818
DBD_PORT=6819

CTL_IP=$NET.1
CTL_HOST=$(hostname -s)
SOCK=$BASE/munge/run/munge.socket.2
export SLURM_CONF=$BASE/etc/slurm.conf

NODES=()
for ((i = 1; i <= NNODES; i++)); do NODES+=("$(printf 'gpu%02d' "$i")"); done
NODELIST="gpu[01-$(printf '%02d' "$NNODES")]"

# Every node a stop must clear: this shape's, and any gpuNN namespace a start of another shape left (the
# 3-node shape of slurm_cluster_3 stopped by a 2-node slurm-down must not leave gpu03's netns and veth).
stop_nodes() {
    local ns
    {
        printf '%s\n' "${NODES[@]}"
        while read -r ns _; do
            if [[ $ns =~ ^hpctrain-(gpu[0-9]+)$ ]]; then echo "${BASH_REMATCH[1]}"; fi
        done < <(ip netns list 2>/dev/null || true)
    } | sort -u
}

netns_of() { echo "hpctrain-$1"; }   # netns name of node $1
veth_of() { echo "veth-$1"; }        # host side of node $1's veth pair (<= 15 chars)
mac_of() {                           # MAC of node $1's eth0 (or of the bridge: controller), from its host number
    local host=1
    [[ $1 == controller ]] || host=$((10 + 10#${1#gpu}))
    printf '02:68:74:00:%02x:%02x\n' $((host / 256)) $((host % 256))
}
ip_of() {                            # IP of node $1 (gpuNN -> $NET.(10+NN); past .255 into the /22's next octet)
    local host=$((10 + 10#${1#gpu}))
    echo "${NET%.*}.$((${NET##*.} + host / 256)).$((host % 256))"
}

# ---- logging and timing ----
_T0=${EPOCHREALTIME//[.,]/}
now_us() { echo "${EPOCHREALTIME//[.,]/}"; }
elapsed() { # seconds since the script started, 3 decimals
    local d=$(($(now_us) - _T0))
    printf '%d.%03d' $((d / 1000000)) $((d % 1000000 / 1000))
}
log() { printf '[%s %7ss] %s\n' "${LOG_TAG:-slurm}" "$(elapsed)" "$*"; }

# poll TIMEOUT_S WHAT GIVE_UP CMD...: re-run CMD every 0.1 s until it succeeds; GIVE_UP (a command run
# between tries) ends the wait early when it succeeds.
poll() {
    local timeout=$1 what=$2 give_up=$3
    shift 3
    local deadline=$(($(now_us) + timeout * 1000000))
    until "$@" >/dev/null 2>&1; do
        if $give_up; then
            return 1
        fi
        if (($(now_us) > deadline)); then
            log "TIMEOUT after ${timeout}s waiting for $what"
            return 1
        fi
        sleep 0.1
    done
}

# wait_for TIMEOUT_S WHAT CMD...: re-run CMD every 0.1 s until it succeeds.
wait_for() {
    local timeout=$1 what=$2
    shift 2
    poll "$timeout" "$what" false "$@"
}

# wait_daemon TIMEOUT_S NAME PIDFILE CMD...: wait_for, but fail at once when the daemon died
# (e.g. slurmctld's "fatal: ... Address already in use" after it daemonized).
wait_daemon() {
    local timeout=$1 name=$2 pidfile=$3 daemon_pid=
    shift 3
    poll "$timeout" "$name" "daemon_died $name $pidfile" "$@"
}

# daemon_died NAME PIDFILE: the daemon wrote its pid file and that process is gone (says so). The pid is
# kept in the caller's daemon_pid once read: a daemon deletes its pid file when it exits.
daemon_died() {
    [[ -n $daemon_pid ]] || daemon_pid=$(read_pid "$2")
    if [[ -n $daemon_pid ]] && ! pid_alive "$daemon_pid"; then
        log "$1 (pid $daemon_pid) died while starting: see $BASE/log/"
        return 0
    fi
    return 1
}

# port_listening PORT: something listens on TCP PORT in this network namespace.
port_listening() {
    local hex
    hex=$(printf '%04X' "$1")
    awk -v p=":$hex" '$2 ~ p"$" && $4 == "0A" {found = 1} END {exit !found}' /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# ---- processes, by PID only ----
pid_alive() { [[ -n ${1:-} && -d /proc/$1 ]]; }

# comm PID: the kernel's name of the process (its executable's name, unaffected by argv rewriting
# such as slurmstepd's "slurmstepd: [3.batch]" or slurmctld's ": slurmscriptd").
comm() {
    local c=
    { IFS= read -r c <"/proc/$1/comm"; } 2>/dev/null || true
    printf '%s' "$c"
}

# The executables a cluster runs, as comm names.
DAEMON_COMMS="munged mariadbd mysqld slurmdbd slurmctld slurmscriptd slurmd slurmstepd"
is_daemon_comm() { [[ " $DAEMON_COMMS " == *" $1 "* ]]; }

# pid_is PID NAME: PID is alive and is the executable NAME.
pid_is() {
    pid_alive "${1:-}" && [[ $(comm "$1") == "$2" ]]
}

read_pid() { [[ -s $1 ]] && tr -dc '0-9' <"$1"; return 0; }

# Every daemon this cluster starts, as "pidfile:name".
daemon_pidfiles() {
    local n
    echo "$BASE/munge/munged.pid:munged"
    echo "$BASE/mysql/run/mysqld.pid:mariadbd"
    echo "$BASE/run/slurmdbd.pid:slurmdbd"
    echo "$BASE/run/slurmctld.pid:slurmctld"
    for n in $(stop_nodes); do echo "$BASE/run/slurmd-$n.pid:slurmd"; done
}

# PIDs of processes that belong to this cluster even when their pid file is gone:
# a Slurm/munge/mariadb executable whose command line or environment names $BASE.
stray_pids() {
    local d
    for d in /proc/[0-9]*; do
        is_daemon_comm "$(comm "${d#/proc/}")" || continue
        if grep -qaF "$BASE/" "$d/cmdline" 2>/dev/null ||
            tr '\0' '\n' <"$d/environ" 2>/dev/null | grep -qxF "SLURM_CONF=$SLURM_CONF"; then
            echo "${d#/proc/}"
        fi
    done
}

# stop_pids PID...: SIGTERM all, wait up to 15 s for them to exit, then SIGKILL.
stop_pids() {
    local pid left i
    (($# > 0)) || return 0
    for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
    for ((i = 0; i < 150; i++)); do
        left=0
        for pid in "$@"; do pid_alive "$pid" && left=1; done
        ((left)) || return 0
        sleep 0.1
    done
    for pid in "$@"; do
        if pid_alive "$pid"; then
            log "pid $pid did not exit after SIGTERM: SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    sleep 0.2
}

# ---- network leftovers ----
have_netns() { [[ -e /run/netns/$1 ]]; }
have_link() { ip link show "$1" >/dev/null 2>&1; }

anything_left() {
    local n spec
    have_link "$BR" && return 0
    for n in $(stop_nodes); do
        have_netns "$(netns_of "$n")" && return 0
        have_link "$(veth_of "$n")" && return 0
    done
    while IFS= read -r spec; do
        pid_alive "$(read_pid "${spec%%:*}")" && pid_is "$(read_pid "${spec%%:*}")" "${spec##*:}" && return 0
    done < <(daemon_pidfiles)
    [[ -n $(stray_pids) ]]
}

# ---- stop everything (used by slurm-down, and by slurm-up before a restart) ----
stop_cluster() {
    local spec pid n ns t pids=() node_pids=() ctl=() dbd=() munge=() db=()
    local PATH=$PATH
    use_running_clients # versions.sh

    # 1. Let running jobs end cleanly so slurmctld's saved state holds no orphans.
    if [[ -r $SLURM_CONF ]] && timeout 3 scontrol ping 2>/dev/null | grep -q 'is UP'; then
        mapfile -t pids < <(timeout 5 squeue -h -o %A 2>/dev/null || true)
        if ((${#pids[@]} > 0)); then
            log "cancelling ${#pids[@]} job(s): ${pids[*]}"
            timeout 5 scancel "${pids[@]}" 2>/dev/null || true
            t=$(($(now_us) + 10000000))
            while [[ -n $(timeout 3 squeue -h -o %A 2>/dev/null) ]] && (($(now_us) < t)); do sleep 0.2; done
        fi
    fi

    # Read every PID before killing anything: the daemons delete their pid files on exit.
    while IFS= read -r spec; do
        pid=$(read_pid "${spec%%:*}")
        pid_is "$pid" "${spec##*:}" || continue
        case ${spec##*:} in
            slurmd) node_pids+=("$pid") ;;
            slurmctld) ctl+=("$pid") ;;
            slurmdbd) dbd+=("$pid") ;;
            munged) munge+=("$pid") ;;
            mariadbd) db+=("$pid") ;;
        esac
    done < <(daemon_pidfiles)

    # 2. slurmd and slurmctld together (each daemon takes about 2 s to exit after SIGTERM, so
    #    stopping in three waves instead of five saves about 3 s), then whatever still runs inside
    #    the node namespaces (slurmstepd, job tasks).
    pids=("${node_pids[@]}" "${ctl[@]}")
    if ((${#pids[@]} > 0)); then stop_pids "${pids[@]}"; log "slurmd + slurmctld stopped (${pids[*]})"; fi
    for n in $(stop_nodes); do
        ns=$(netns_of "$n")
        have_netns "$ns" || continue
        mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null || true)
        if ((${#pids[@]} > 0)); then
            log "killing ${#pids[@]} leftover process(es) in $ns: ${pids[*]}"
            kill -KILL "${pids[@]}" 2>/dev/null || true
        fi
    done

    # 3. slurmdbd (with munged, which nothing needs any more), and only then mariadbd: slurmdbd
    #    still commits while it shuts down ("mysql_commit failed: Lost connection" otherwise).
    pids=("${dbd[@]}" "${munge[@]}")
    if ((${#pids[@]} > 0)); then stop_pids "${pids[@]}"; log "slurmdbd + munged stopped (${pids[*]})"; fi
    if ((${#db[@]} > 0)); then stop_pids "${db[@]}"; log "mariadbd stopped (${db[*]})"; fi

    # Anything of ours whose pid file was missing (a crashed start, a stale daemon).
    mapfile -t pids < <(stray_pids)
    if ((${#pids[@]} > 0)); then
        log "stopping stray process(es) of this cluster: ${pids[*]}"
        stop_pids "${pids[@]}"
    fi

    # 4. Network: veth first (synchronous), then the namespaces and the bridge.
    for n in $(stop_nodes); do
        have_link "$(veth_of "$n")" && ip link del "$(veth_of "$n")"
        have_netns "$(netns_of "$n")" && ip netns del "$(netns_of "$n")"
    done
    if have_link "$BR"; then ip link del "$BR"; fi
    return 0
}
