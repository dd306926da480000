"""Build fake EL9 repositories for the real dnf converge: baseos, epel and cuda (with nvidia-driver module streams).

The packages are stand-ins built with rpmbuild: right names, epochs, versions, Requires/Provides/Conflicts (modelled
on NVIDIA's EL packaging) and a few marker files. Where behaviour matters the stand-ins carry it:
  * the kmod packages carry NVIDIA's scriptlets (%post: dkms add/build/install for the running kernel, failures
    ignored; %preun: dkms remove) and a prebuilt stand-in nvidia.ko (kmod_elf.py) that the dkms stand-in
    (stand_ins/dkms) "builds" only for a kernel whose kernel-devel is installed;
  * "bash" is a static busybox, so rpm can run those scriptlets inside the root;
  * kernel-core owns /lib/modules/<kernel>, as on EL, and its %posttrans makes the kernel GRUB's default through the
    grubby stand-in (stand_ins/grubby), as kernel-install does on EL; each kernel has EL9's kernel-devel-matched, and
    dkms requires it as EPEL's dkms spec does ("(kernel-devel-matched if kernel-core)"); kernel-core and
    kernel-devel are install-only as on EL; kernel-modules-extra requires its own kernel-core;
  * baseos-moved-on is BaseOS after the next minor release (no package of KERNEL): dkms's requirement can then only be
    met by the newer kernel's kernel-devel-matched, which brings its kernel-core. Cannot show: which
    kernel-devel-matched EL9's dnf picks for dkms when the installed kernel's own is available (Debian's dnf 4.14
    takes that one);
  * nvidia-persistenced's unit has no [Install] section, as NVIDIA packages it.
The cuda repository carries modulemd v2 metadata for streams <branch>-open and <branch>-dkms, one module version per
driver release, so dnf's modular filtering and `dnf module switch-to` work as on a real EL9 host.

    python build.py OUT_DIR        ->  OUT_DIR/{baseos,baseos-moved-on,epel,cuda}/ with repodata; prints a JSON summary
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import kmod_elf  # noqa: E402

KERNEL = "5.14.0-427.13.1.el9_4"  # the kernel the image is built for (version-release)
NEWER_KERNEL = "5.14.0-503.11.1.el9_5"  # also on the mirror: what a node runs after a deliberate kernel update
DRIVER_BRANCH = "570"
DRIVER_VERSIONS = ["570.172.08", "570.195.03"]  # the older one is what the converge pins
ROLLBACK_VERSION = "550.163.01"  # an older branch on the mirror, for the rollback on a live node
DRIVER_EPOCH = 3
DKMS_VERSION = "3.1.8"
CUDA_VERSION = "12.8"
NCCL_VERSION, NCCL_RELEASE = "2.26.5", "1+cuda12.8"
NEWER_NCCL = ("2.27.3", "1+cuda12.9")  # on the mirror too: built for a newer CUDA than the stack's
DCGM_VERSION = "4.2.3"  # DCGM 4, split as NVIDIA ships it: -core and -cuda<major>
DCGM3_VERSION = "3.3.9"  # the last DCGM 3 (datacenter-gpu-manager), still on the mirror as on NVIDIA's
CONTAINER_TOOLKIT_VERSIONS = ["1.17.7", "1.17.8"]  # not part of the driver: its security fixes must not be locked out
PYTHON_PACKAGE = "python3.11"
# Scriptlets run under this shell inside the root; the applets the dkms stand-in and the scriptlets use.
BUSYBOX_APPLETS = ["basename", "cat", "cmp", "cp", "cut", "dirname", "find", "grep", "head", "ln", "ls", "mkdir", "mv",
                   "rm", "sed", "sleep", "tail", "touch", "tr", "uname"]


@dataclass
class SubPackage:
    name: str
    requires: list[str] = field(default_factory=list)
    provides: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # path -> text content
    binaries: dict[str, bytes] = field(default_factory=dict)  # path -> binary content
    symlinks: dict[str, str] = field(default_factory=dict)  # path -> target
    dirs: list[str] = field(default_factory=list)  # directories the package owns
    post: str = ""  # %post scriptlet (/bin/sh)
    preun: str = ""  # %preun scriptlet (/bin/sh)
    posttrans: str = ""  # %posttrans scriptlet (/bin/sh): after the whole transaction


@dataclass
class Spec:
    name: str
    version: str
    release: str
    epoch: int | None
    arch: str
    packages: list[SubPackage]


def spec_text(spec: Spec, staging: Path) -> str:
    """The spec file; binary payloads are copied from `staging` (written there first)."""
    lines = [
        f"Name: {spec.name}",
        f"Version: {spec.version}",
        f"Release: {spec.release}",
        *([f"Epoch: {spec.epoch}"] if spec.epoch is not None else []),
        "Summary: hpc-train test stand-in",
        "License: MIT",
        # No automatic /bin/sh or library requirements: the image root has no base system.
        "AutoReqProv: no",
        *(["BuildArch: noarch"] if spec.arch == "noarch" else []),
        "%global debug_package %{nil}",
        "%global __os_install_post %{nil}",
        "%description",
        "Stand-in package for the hpc-train ansible tests.",
    ]
    install = ["%install"]
    files: list[str] = []
    for package in spec.packages:
        lines += [f"%package -n {package.name}", "Summary: hpc-train test stand-in", "AutoReqProv: no"]
        lines += [f"Requires: {r}" for r in package.requires]
        if package.post or package.preun or package.posttrans:
            lines += ["Requires(post): /bin/sh", "Requires(preun): /bin/sh"]
        lines += [f"Provides: {p}" for p in package.provides]
        lines += [f"Conflicts: {c}" for c in package.conflicts]
        lines += [f"%description -n {package.name}", f"Stand-in for {package.name}."]
        if package.post:
            lines += [f"%post -n {package.name}", package.post.rstrip()]
        if package.preun:
            lines += [f"%preun -n {package.name}", package.preun.rstrip()]
        if package.posttrans:
            lines += [f"%posttrans -n {package.name}", package.posttrans.rstrip()]
        files.append(f"%files -n {package.name}")
        for directory in package.dirs:
            install.append(f"mkdir -p %{{buildroot}}{directory}")
            files.append(f"%dir {directory}")
        for path, content in package.files.items():
            install.append(f"mkdir -p %{{buildroot}}{Path(path).parent}")
            install.append(f"cat > %{{buildroot}}{path} <<'HPC_TRAIN_EOF'\n{content}HPC_TRAIN_EOF")
            mode = "0755" if "/bin/" in path or content.startswith("#!") else "0644"
            install.append(f"chmod {mode} %{{buildroot}}{path}")
            files.append(path)
        for path, content in package.binaries.items():
            source = staging / path.lstrip("/")
            source.parent.mkdir(parents=True, exist_ok=True)
            source.write_bytes(content)
            mode = "0755" if "/bin/" in path else "0644"
            install.append(f"install -D -m {mode} {source} %{{buildroot}}{path}")
            files.append(path)
        for path, target in package.symlinks.items():
            install.append(f"mkdir -p %{{buildroot}}{Path(path).parent}")
            install.append(f"ln -s {target} %{{buildroot}}{path}")
            files.append(path)
    return "\n".join(lines + install + files) + "\n"


def build_rpms(spec: Spec, workdir: Path) -> list[Path]:
    topdir = workdir / spec.name
    (topdir / "SPECS").mkdir(parents=True)
    spec_path = topdir / "SPECS" / f"{spec.name}.spec"
    spec_path.write_text(spec_text(spec, topdir / "STAGING"))
    target = [] if spec.arch == "noarch" else ["--target", spec.arch]
    subprocess.run(
        ["rpmbuild", "-bb", "--quiet", "--nodeps", "--define", f"_topdir {topdir}", *target, str(spec_path)],
        check=True, stdout=subprocess.DEVNULL,
    )
    return sorted((topdir / "RPMS").rglob("*.rpm"))


def kmod_package(name: str, dkms_module: str, other: str, version: str, flavor: str, evr: str) -> SubPackage:
    """A kmod-*-dkms package with NVIDIA's scriptlets (NVIDIA/yum-packaging-dkms-nvidia): build for `uname -r` only,
    every failure ignored."""
    source = f"/usr/src/{dkms_module}-{version}"
    return SubPackage(
        name, requires=[f"dkms >= {DKMS_VERSION}", f"nvidia-kmod-common = {evr}"], provides=[f"nvidia-kmod = {evr}"],
        conflicts=[other],
        files={f"{source}/dkms.conf": f'PACKAGE_NAME="{dkms_module}"\nPACKAGE_VERSION="{version}"\nAUTOINSTALL="yes"\n'},
        binaries={f"{source}/hpc-train-stand-in/nvidia.ko": kmod_elf.nvidia_module(version, flavor)},
        post=textwrap.dedent(f"""\
            dkms add -m {dkms_module} -v {version} -q || :
            # Rebuild and make available for the currently running kernel
            dkms build -m {dkms_module} -v {version} -q || :
            dkms install -m {dkms_module} -v {version} -q --force || :
            """),
        preun=f"dkms remove -m {dkms_module} -v {version} -q --all || :\n",
    )


def driver_spec(version: str) -> Spec:
    evr = f"{DRIVER_EPOCH}:{version}-1.el9"
    # As NVIDIA's CUDA repository packages it: no [Install] section, so `systemctl enable` does nothing with it.
    persistenced_unit = textwrap.dedent("""\
        [Unit]
        Description=NVIDIA Persistence Daemon (test stand-in)
        Wants=syslog.target
        [Service]
        Type=forking
        ExecStart=/usr/bin/nvidia-persistenced --verbose
        ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced
        """)
    unit = textwrap.dedent("""\
        [Unit]
        Description=NVIDIA Fabric Manager (test stand-in)
        [Service]
        Type=forking
        ExecStart=/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg
        [Install]
        WantedBy=multi-user.target
        """)
    smi = f"#!/bin/sh\necho 'NVIDIA-SMI stand-in, driver {version}'\n"
    packages = [
        SubPackage("nvidia-driver-cuda", requires=[f"nvidia-driver-cuda-libs = {evr}", f"nvidia-kmod-common = {evr}"],
                   files={"/usr/bin/nvidia-smi": smi}),
        SubPackage("nvidia-driver-cuda-libs", files={f"/usr/lib64/libcuda.so.{version}": "stand-in\n"}),
        SubPackage("nvidia-kmod-common", requires=[f"nvidia-kmod = {evr}"],
                   files={"/usr/lib/modprobe.d/nvidia.conf": "# stand-in\n"}),
        SubPackage("nvidia-persistenced", requires=[f"nvidia-kmod-common = {evr}"],
                   files={"/usr/lib/systemd/system/nvidia-persistenced.service": persistenced_unit}),
        kmod_package("kmod-nvidia-open-dkms", "nvidia-open", "kmod-nvidia-latest-dkms", version, "open", evr),
        kmod_package("kmod-nvidia-latest-dkms", "nvidia", "kmod-nvidia-open-dkms", version, "proprietary", evr),
        SubPackage("nvidia-fabric-manager", files={"/usr/lib/systemd/system/nvidia-fabricmanager.service": unit}),
    ]
    return Spec("fake-nvidia-driver", version, "1.el9", DRIVER_EPOCH, "x86_64", packages)


def modulemd(driver_rpms: dict[str, list[str]]) -> str:
    """modulemd v2 documents: for each driver release, streams <branch>-open and <branch>-dkms."""
    docs = []
    for index, (version, nevras) in enumerate(driver_rpms.items()):
        branch = version.split(".")[0]
        for suffix, kmod, other in (("open", "kmod-nvidia-open-dkms", "kmod-nvidia-latest-dkms"),
                                    ("dkms", "kmod-nvidia-latest-dkms", "kmod-nvidia-open-dkms")):
            artifacts = [n for n in nevras if not n.startswith(other + "-")]
            base = ["nvidia-driver-cuda", "nvidia-persistenced", kmod]
            docs.append({
                "document": "modulemd", "version": 2,
                "data": {
                    "name": "nvidia-driver", "stream": f"{branch}-{suffix}",
                    "version": 20250101000000 + index, "context": "b2c4a6e8", "arch": "x86_64",
                    "summary": "NVIDIA driver (test stand-in)", "description": "NVIDIA driver (test stand-in).",
                    "license": {"module": ["MIT"]},
                    "dependencies": [{"requires": {"platform": ["el9"]}}],
                    "profiles": {"default": {"rpms": base}, "fm": {"rpms": base + ["nvidia-fabric-manager"]}},
                    "artifacts": {"rpms": artifacts},
                },
            })
    # modulemd is YAML; JSON is valid YAML, one document per "---".
    return "".join("---\n" + json.dumps(doc, indent=1) + "\n...\n" for doc in docs)


def nevra(rpm: Path) -> str:
    return subprocess.run(
        ["rpm", "-qp", "--queryformat", "%{NAME}-%|EPOCH?{%{EPOCH}}:{0}|:%{VERSION}-%{RELEASE}.%{ARCH}", str(rpm)],
        check=True, capture_output=True, text=True,
    ).stdout.strip()


def kernel_spec(kernel: str) -> Spec:
    version, release = kernel.split("-", 1)
    modules = f"/lib/modules/{kernel}.x86_64"
    # EL's kernel-core %posttrans (kernel-install) puts vmlinuz in /boot and, with UPDATEDEFAULT=yes in
    # /etc/sysconfig/kernel (EL's default), makes the new kernel GRUB's default: the node boots it next time.
    posttrans = textwrap.dedent(f"""\
        mkdir -p /boot && cp {modules}/vmlinuz /boot/vmlinuz-{kernel}.x86_64
        [ -x /usr/sbin/grubby ] && /usr/sbin/grubby --set-default /boot/vmlinuz-{kernel}.x86_64 || :
        """)
    # installonlypkg(...): as EL's kernel.spec provides them, dnf installs a newer build next to the installed one
    # instead of replacing it (both kernels stay, GRUB's default moves to the new one).
    return Spec("fake-kernel", version, release, None, "x86_64", [
        SubPackage("kernel-core", dirs=[modules], files={f"{modules}/vmlinuz": "stand-in\n"}, posttrans=posttrans,
                   provides=["installonlypkg(kernel)"]),
        SubPackage("kernel-devel", files={f"/usr/src/kernels/{kernel}.x86_64/Makefile": "# stand-in\n"},
                   provides=["installonlypkg(kernel)"]),
        # A site's extra package that brings a kernel-core in: asked for by its bare name, dnf takes the newest
        # build, which requires its own (newer) kernel-core (on EL: kernel-modules-extra without -$(uname -r)).
        SubPackage("kernel-modules-extra", requires=[f"kernel-core = {version}-{release}"],
                   files={f"{modules}/extra/hpc-train-stand-in.ko": "stand-in\n"}, provides=["installonlypkg(kernel-module)"]),
        SubPackage("kernel-headers", files={f"/usr/include/linux/hpc-train-stand-in-{release}.h": "/* stand-in */\n"}),
        # EL9's meta package: the devel files of exactly this kernel-core (which it requires: asked for by name alone,
        # the newest one brings the newest kernel-core with it).
        SubPackage("kernel-devel-matched", requires=[f"kernel-core = {version}-{release}", f"kernel-devel = {version}-{release}"]),
    ])


def shell_spec() -> Spec:
    busybox = shutil.which("busybox")
    if busybox is None:
        raise SystemExit("busybox is missing: install Debian's busybox-static (run.sh does)")
    return Spec("fake-bash", "5.1.8", "9.el9", None, "x86_64", [
        SubPackage("bash", provides=["/bin/sh"], binaries={"/usr/bin/busybox": Path(busybox).read_bytes()},
                   symlinks={"/bin/sh": "/usr/bin/busybox",
                             **{f"/usr/bin/{applet}": "busybox" for applet in BUSYBOX_APPLETS}}),
    ])


def main(out_dir: Path) -> dict:
    if out_dir.exists():
        shutil.rmtree(out_dir)
    repos = {name: out_dir / name for name in ("baseos", "epel", "cuda")}
    for repo in repos.values():
        repo.mkdir(parents=True)
    specs = {
        "baseos": [
            shell_spec(),
            kernel_spec(KERNEL),
            kernel_spec(NEWER_KERNEL),
            Spec("fake-grubby", "8.40", "64.el9", None, "x86_64",
                 [SubPackage("grubby", files={"/usr/sbin/grubby": (HERE / "stand_ins" / "grubby").read_text()})]),
            Spec("fake-dnf-plugins", "4.3.0", "13.el9", None, "noarch", [
                SubPackage("python3-dnf-plugin-versionlock",
                           files={"/etc/dnf/plugins/versionlock.conf": "[main]\nenabled = 1\nlocklist = /etc/dnf/plugins/versionlock.list\n",
                                  "/etc/dnf/plugins/versionlock.list": "# stand-in: the real package ships it empty\n"}),
            ]),
            Spec("fake-rdma-core", "48.0", "1.el9", None, "x86_64", [SubPackage("rdma-core", files={"/etc/rdma/rdma.conf": "# stand-in\n"})]),
            # Only its name matters; a marker file, so that a test installing it into the wrong root could never
            # replace this machine's own /usr/bin/python3.11.
            Spec("fake-python3.11", "3.11.9", "1.el9", None, "x86_64",
                 [SubPackage(PYTHON_PACKAGE, files={"/usr/share/hpc-train-stand-in/python3.11": "stand-in\n"})]),
        ],
        "epel": [Spec("fake-dkms", DKMS_VERSION, "1.el9", None, "noarch",
                      # EPEL's dkms spec (EL9): Requires: (kernel-devel-matched if kernel-core). The roles name the
                      # target kernel's kernel-devel-matched themselves (issue 29 item 6).
                      [SubPackage("dkms", requires=["(kernel-devel-matched if kernel-core)"],
                                  files={"/usr/sbin/dkms": (HERE / "stand_ins" / "dkms").read_text()})])],
        "cuda": [driver_spec(v) for v in DRIVER_VERSIONS + [ROLLBACK_VERSION]] + [
            Spec("fake-cuda-toolkit", CUDA_VERSION + ".1", "1", None, "x86_64", [
                SubPackage(f"cuda-toolkit-{CUDA_VERSION.replace('.', '-')}",
                           files={f"/usr/local/cuda-{CUDA_VERSION}/bin/nvcc": "#!/bin/sh\necho 'nvcc stand-in'\n"}),
            ]),
        ] + [
            # The pinned NCCL, and a newer build for a newer CUDA that a plain `dnf update` would bring.
            Spec("fake-nccl", version, release, None, "x86_64", [
                SubPackage("libnccl", files={f"/usr/lib64/libnccl.so.{version}": "stand-in\n"}),
                SubPackage("libnccl-devel", requires=[f"libnccl = {version}-{release}"],
                           files={"/usr/include/nccl.h": "/* stand-in */\n"}),
            ])
            for version, release in ((NCCL_VERSION, NCCL_RELEASE), NEWER_NCCL)
        ] + [
            Spec("fake-dcgm3", DCGM3_VERSION, "1", 1, "x86_64", [
                SubPackage("datacenter-gpu-manager", files={"/usr/bin/dcgmi": "#!/bin/sh\necho 'dcgmi 3 stand-in'\n"}),
            ]),
            Spec("fake-dcgm", DCGM_VERSION, "1", 1, "x86_64", [
                SubPackage("datacenter-gpu-manager-4-cuda12", requires=[f"datacenter-gpu-manager-4-core = 1:{DCGM_VERSION}-1"],
                           files={"/usr/share/datacenter-gpu-manager-4/cuda12": "stand-in\n"}),
                SubPackage("datacenter-gpu-manager-4-core", files={
                    "/usr/bin/dcgmi": "#!/bin/sh\necho 'dcgmi stand-in'\n",
                    "/usr/lib/systemd/system/nvidia-dcgm.service": textwrap.dedent("""\
                        [Unit]
                        Description=NVIDIA DCGM service (test stand-in)
                        [Service]
                        ExecStart=/usr/bin/nv-hostengine -n --service-account nvidia-dcgm
                        [Install]
                        WantedBy=multi-user.target
                        """)}),
            ]),
        ] + [
            Spec("fake-nvidia-container-toolkit", version, "1", None, "x86_64", [
                SubPackage("nvidia-container-toolkit", requires=[f"libnvidia-container1 = {version}-1"],
                           files={"/usr/bin/nvidia-ctk": f"#!/bin/sh\necho 'nvidia-ctk stand-in {version}'\n"}),
                SubPackage("libnvidia-container1", files={f"/usr/lib64/libnvidia-container.so.{version}": "stand-in\n"}),
            ])
            for version in CONTAINER_TOOLKIT_VERSIONS
        ],
    }
    driver_rpms: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="hpc-train-rpmbuild-") as workdir:
        for repo_name, repo_specs in specs.items():
            for spec in repo_specs:
                rpms = build_rpms(spec, Path(workdir) / f"{spec.name}-{spec.version}-{spec.release}")
                for rpm in rpms:
                    shutil.copy2(rpm, repos[repo_name] / rpm.name)
                if spec.name == "fake-nvidia-driver":
                    driver_rpms[spec.version] = [nevra(rpm) for rpm in rpms]
    # BaseOS after the mirror moved on to the next minor release (Rocky and Alma keep only the current minor's
    # packages in BaseOS/AppStream; the older ones go to their vault): the newer kernel's packages only.
    repos["baseos-moved-on"] = out_dir / "baseos-moved-on"
    repos["baseos-moved-on"].mkdir()
    for rpm in repos["baseos"].glob("*.rpm"):
        if KERNEL not in rpm.name:
            shutil.copy2(rpm, repos["baseos-moved-on"] / rpm.name)
    for repo in repos.values():
        subprocess.run(["createrepo_c", "--quiet", str(repo)], check=True)
    modules_file = out_dir / "modules.yaml"
    modules_file.write_text(modulemd(driver_rpms))
    subprocess.run(["modifyrepo_c", "--mdtype=modules", str(modules_file), str(repos["cuda"] / "repodata")],
                   check=True, stdout=subprocess.DEVNULL)
    summary = {"kernel": KERNEL + ".x86_64", "driver_branch": DRIVER_BRANCH, "driver_versions": DRIVER_VERSIONS,
               "repos": {name: str(path) for name, path in repos.items()},
               "packages": sorted(p.name for repo in repos.values() for p in repo.glob("*.rpm"))}
    return summary


def base_os_rpms(repos: Path, kernel: str = KERNEL) -> list[Path]:
    """The rpms a test root gets as its "base OS" before the roles run: the shell, grubby and the kernel it runs (its
    %posttrans makes it GRUB's default)."""
    baseos = repos / "baseos"
    return sorted(baseos.glob("bash-*.rpm")) + sorted(baseos.glob("grubby-*.rpm")) + sorted(baseos.glob(f"kernel-core-{kernel}.*.rpm"))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: build.py OUT_DIR")
    print(json.dumps(main(Path(sys.argv[1]).resolve()), indent=1))
