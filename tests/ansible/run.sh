#!/usr/bin/env bash
# The Ansible test ladder: `make test-ansible`. On a fresh Debian 12 machine (root, PyPI and Debian mirrors only)
# it installs what it needs, runs every rung (see ladder.py) and ends with "N passed, N failed".
# A missing prerequisite is a failure, never a skip. Venvs are cached in tests/ansible/.cache/ (git-ignored).
set -uo pipefail
cd "$(dirname "$0")"
HERE=$(pwd)
CACHE=$HERE/.cache
# Pinned: the EL8-compatible line (EL7/EL8 need it, see docs/ansible.md) and the current release; one lint version.
CORE_216=ansible-core==2.16.19
CORE_CURRENT=ansible-core==2.19.14
LINT=ansible-lint==26.10.1
# The last parso with a Python 2.7 grammar: the roles' own modules must compile on EL7's 2.7 and EL8's 3.6
# (test_target_python.py); pure Python, installed apart from the venvs (ansible-lint's deps never see it).
PARSO=parso==0.7.1
# busybox-static: the shell rpm runs scriptlets with inside the fake EL roots; kmod: the real modinfo; linux-kbuild-6.1:
# the kernel's real sign-file, which the secure_boot rung's dkms stand-in signs modules with (openssl: its keys).
APT_PACKAGES="rpm createrepo-c dnf python3-dnf dnf-plugins-core python3-venv busybox-static kmod linux-kbuild-6.1 openssl"
mkdir -p "$CACHE"
start=$(date +%s)
# `run.sh --setup-only`: install what the ladder needs and stop (.ci/run does it in the background while the Python
# suites run). The setup holds a lock, so a ladder started meanwhile waits for it instead of installing beside it.
setup_only=false
if [ "${1:-}" = "--setup-only" ]; then
    setup_only=true
    shift
fi
exec 8>"$CACHE/setup.lock"
flock 8

fail_setup() {  # the ladder could not even start: report it in the ladder's own format
    echo "FAIL  setup: $1"
    echo "0 passed, 1 failed"
    exit 1
}

phase_start=$(date +%s)
missing=""
for tool in rpm rpmbuild createrepo_c modifyrepo_c dnf modinfo chroot openssl /usr/lib/linux-kbuild-6.1/scripts/sign-file; do
    command -v "$tool" >/dev/null || missing="$missing $tool"
done
# A static busybox (Debian's dynamic one would need a libc inside the fake roots).
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q "install ok installed" || missing="$missing busybox-static"
[ -f /usr/lib/python3/dist-packages/dnf-plugins/versionlock.py ] || missing="$missing versionlock-plugin"
python3 -c "import ensurepip, venv" 2>/dev/null || missing="$missing python3-venv"
if [ -n "$missing" ]; then
    echo "--- setup: installing Debian packages ($APT_PACKAGES) for:$missing"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends $APT_PACKAGES >/dev/null; } \
        || fail_setup "apt-get install $APT_PACKAGES failed (needed for the fake EL repositories, their scriptlets and the dnf converge)"
fi
# dnf's Python bindings must be importable by the interpreter Ansible's dnf module respawns into.
/usr/bin/python3 -c "import dnf, hawkey" 2>/dev/null || fail_setup "python3-dnf is not importable by /usr/bin/python3"
echo "--- setup: system packages: $(( $(date +%s) - phase_start )) s"

make_venv() {  # make_venv DIR REQUIREMENT...: create once, reuse while the pins match
    local dir=$1; shift
    local stamp="$dir/.hpc-train-pins"
    if [ -x "$dir/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$*" ]; then
        return 0
    fi
    rm -rf "$dir"
    local log="$CACHE/pip-$(basename "$dir").log"
    if python3 -m venv "$dir" && "$dir/bin/pip" install -q --disable-pip-version-check "$@" pytest >"$log" 2>&1; then
        echo "$*" > "$stamp"
    else
        tail -20 "$log"
        return 1
    fi
}
phase_start=$(date +%s)
make_venv "$CACHE/core-2.16" "$CORE_216" "$LINT" || fail_setup "could not install $CORE_216 $LINT from PyPI"
make_venv "$CACHE/core-current" "$CORE_CURRENT" "$LINT" || fail_setup "could not install $CORE_CURRENT $LINT from PyPI"
if [ "$(cat "$CACHE/parso-0.7.1/.hpc-train-pins" 2>/dev/null)" != "$PARSO" ]; then
    rm -rf "$CACHE/parso-0.7.1"
    "$CACHE/core-current/bin/pip" install -q --disable-pip-version-check --no-deps --target "$CACHE/parso-0.7.1" "$PARSO" \
        >"$CACHE/pip-parso.log" 2>&1 && echo "$PARSO" > "$CACHE/parso-0.7.1/.hpc-train-pins" \
        || { tail -20 "$CACHE/pip-parso.log"; fail_setup "could not install $PARSO from PyPI (the 2.7/3.6 grammar check)"; }
fi
echo "--- setup: venvs ($CORE_216, $CORE_CURRENT, $LINT) and $PARSO: $(( $(date +%s) - phase_start )) s"
exec 8>&-  # the setup is done: release its lock
if $setup_only; then
    exit 0
fi

# The ladder prints the total time (from $HPC_TRAIN_LADDER_START) and then its "N passed, N failed" line last.
HPC_TRAIN_LADDER_START=$start exec "$CACHE/core-2.16/bin/python" "$HERE/ladder.py" \
    --core-216 "$CACHE/core-2.16" --core-current "$CACHE/core-current" "$@"
