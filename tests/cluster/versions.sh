# shellcheck shell=bash disable=SC2034  # the settings below are used by the scripts that source this
# The Slurm versions the harness runs, and every difference between them, in one place (sourced by common.sh).
#
#   22.05  Debian 12 (bookworm) 22.05.8: the host's own packages, daemons and clients run on the host
#   24.11  Debian 13 (trixie)   24.11.x: a chroot made by tests/cluster/slurm-chroot from Debian's archive
#   26.05  Debian sid           26.05.x: likewise
#
# Chosen by `slurm-up --slurm VERSION` (exported as HPCTRAIN_SLURM_VERSION) or HPCTRAIN_SLURM_VERSION;
# 22.05 by default. Why each difference exists: docs/test-cluster.md, "Slurm versions".

SLURM_VERSION=${HPCTRAIN_SLURM_VERSION:-22.05}
SLURM_VERSIONS=(22.05 24.11 26.05)

# slurm_suite VERSION: the Debian suite that ships it ("host": the machine's own packages).
slurm_suite() {
    case $1 in
        22.05) echo host ;;
        24.11) echo trixie ;;
        26.05) echo sid ;;
        *) return 1 ;;
    esac
}

# The packages of a chroot (mmdebstrap --include): Slurm, its accounting database, munge, and what
# hpc-train's CLI needs from Debian (its venv sees them with --system-site-packages; submitit comes as
# a wheel, tests/cluster/slurm-chroot).
CHROOT_PACKAGES=(slurmctld slurmd slurm-client slurmdbd mariadb-server munge
    python3 python3-venv python3-setuptools python3-wheel python3-click python3-jinja2 python3-yaml
    python3-cloudpickle python3-typing-extensions procps iproute2 util-linux ca-certificates)

# Where a version's chroot lives (git-ignored; rebuilt when its recipe changes) and its hpc-train venv inside.
CHROOT_CACHE=${HPCTRAIN_SLURM_CHROOT_CACHE:-$REPO_ROOT/.cache/slurm-chroots}
CHROOT_VENV=/opt/hpctrain-venv

# slurm_conf_version_lines VERSION: the slurm.conf lines that differ between versions.
slurm_conf_version_lines() {
    case $1 in
        22.05)
            echo "TaskPlugin=task/none"
            echo "SlurmctldParameters=preempt_send_user_signal"
            ;;
        *)
            # task/none no longer exists: TaskPlugin stays unset. The user-signal-on-preemption switch moved
            # to PreemptParameters (23). cgroup.conf: cgroup_conf_version_lines.
            echo "PreemptParameters=send_user_signal"
            ;;
    esac
}

# cgroup_conf_version_lines VERSION: cgroup.conf. From 24 a cgroup plugin is loaded unless disabled, and the
# harness's nodes do not own a delegated cgroup subtree.
cgroup_conf_version_lines() {
    case $1 in
        22.05) ;;
        *) echo "CgroupPlugin=disabled" ;;
    esac
}

# mariadbd_version_args VERSION: MariaDB 11.8 (trixie, sid) refuses slurmdbd's write pattern under snapshot
# isolation (slurmdbd warns it will die on write conflicts): it is turned off there.
mariadbd_version_args() {
    case $1 in
        22.05) ;;
        *) echo "--innodb-snapshot-isolation=OFF" ;;
    esac
}

# chroot_run CMD...: CMD inside $CHROOT_DIR, with the checkout and the state dir shared (tests/cluster/in-chroot).
chroot_run() {
    "$HARNESS_DIR/in-chroot" "$CHROOT_DIR" "$(chroot_shared_dirs)" "$@"
}

# chroot_shared_dirs: the host directories a chroot sees at the same path (colon-separated).
chroot_shared_dirs() {
    local dirs=$REPO_ROOT
    [[ $BASE == "$REPO_ROOT"/* ]] || dirs+=":$BASE"
    echo "$dirs"
}

# What a version keeps apart from the others (a newer Slurm's state and database are not an older one's):
# 22.05 keeps the paths it always had.
version_suffix() { [[ $1 == 22.05 ]] || echo "-$1"; }
STATE_DIR=$BASE/state$(version_suffix "$SLURM_VERSION")
SPOOL_DIR=$BASE/spool$(version_suffix "$SLURM_VERSION")
DB_DATA_DIR=$BASE/mysql/data$(version_suffix "$SLURM_VERSION")

# The commands a chroot version runs through wrappers: every daemon and client slurm-up, slurm-down and the
# tests call by name, hpc-train and the chroot venv's python.
CHROOT_COMMANDS=(sbatch squeue sacct scontrol scancel sinfo srun salloc sstat sacctmgr sprio sshare
    slurmctld slurmd slurmdbd munged mungekey munge unmunge mariadb mariadbd mariadb-install-db
    hpc-train python python3)

# client_bin VERSION: the directory of that version's wrappers.
client_bin() { echo "$BASE/bin/$1"; }

# write_client_wrappers VERSION CHROOT: one small script per command of CHROOT_COMMANDS that runs it in CHROOT.
write_client_wrappers() {
    local dir cmd
    dir=$(client_bin "$1")
    rm -rf "$dir"
    mkdir -p "$dir"
    for cmd in "${CHROOT_COMMANDS[@]}"; do
        printf '#!/bin/sh\n# Slurm %s: %s inside %s (written by tests/cluster/slurm-up)\nexport HPCTRAIN_CHROOT_HOSTS=%q\nexec %q %q %q %q "$@"\n' \
            "$1" "$cmd" "$2" "$BASE/etc/hosts" "$HARNESS_DIR/in-chroot" "$2" "$(chroot_shared_dirs)" "$cmd" >"$dir/$cmd"
        chmod 755 "$dir/$cmd"
    done
}

# running_version: the version of the cluster slurm-up last started here (22.05 when none is recorded).
running_version() {
    local v=22.05
    [[ -s $BASE/run/slurm-version ]] && v=$(<"$BASE/run/slurm-version")
    echo "$v"
}

# use_running_clients: the running cluster's own client commands first on PATH (a 22.05 client cannot talk
# to a 26.05 slurmctld, nor the reverse).
use_running_clients() {
    local v
    v=$(running_version)
    if [[ -d $(client_bin "$v") ]]; then PATH=$(client_bin "$v"):$PATH; fi
}
