#!/usr/bin/python
"""The NVIDIA driver of one node, as data: what the running kernel has loaded, what rpm has installed (and which
nvidia-driver module stream is enabled), and which nvidia.ko modules are built for a given kernel.

Read-only, so it runs in check mode too. "No driver" (nothing loaded, nothing installed, no module) is an answer,
not a failure: empty strings and empty lists. The kernel defaults to the running one; pass the kernel a node will
boot to ask whether the driver is built for it before rebooting into it.

It runs on the node's own Python: EL7's 2.7 and EL8's platform-python 3.6 included (tests/ansible/test_target_python.py
holds every module under library/ to that): no annotations, f-strings, star-unpacking displays, open(encoding=) or
os.uname().release.
"""

from __future__ import absolute_import, division, print_function

import io
import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.six import string_types

DOCUMENTATION = r"""
module: nvidia_driver_facts
short_description: The NVIDIA driver loaded, installed and built for a kernel (read-only)
description:
  - Reads the loaded driver (/proc/driver/nvidia/version names version and flavour), the installed driver packages
    (rpm) and enabled nvidia-driver module stream, and the nvidia.ko modules built for O(kernel) (modinfo).
  - A node without any driver gets empty values, never a failure.
options:
  kernel:
    description: Kernel (uname -r form) whose built modules are read; default the running kernel (required when root is not /).
    type: str
  root:
    description: Root of the system (an image directory in image builds).
    type: path
    default: /
  loaded_version_file:
    description: File in /proc/driver/nvidia/version's format naming the loaded driver.
    type: path
    default: /proc/driver/nvidia/version
  kmod_packages:
    description: Kernel module package of each flavour (keys open and proprietary, both required).
    type: dict
  package_patterns:
    description: rpm name patterns of the driver's packages.
    type: list
    elements: str
    default: ["nvidia-*", "kmod-nvidia*", "libnvidia-*"]
"""

RETURN = r"""
kernel: {description: The kernel the modules were looked for., type: str, returned: always}
loaded: {description: "Loaded driver: version and flavour (open or proprietary); empty when none.", type: dict, returned: always}
installed: {description: "Installed kernel module package: version, flavour, and whether nvidia-fabric-manager is installed.", type: dict, returned: always}
driver_version: {description: "Version of the driver's userspace package (nvidia-driver-cuda; EL7 nvidia-driver-branch-N-cuda or nvidia-driver).", type: str, returned: always}
stream: {description: The enabled nvidia-driver module stream, or empty., type: str, returned: always}
packages: {description: "Installed packages matching package_patterns: name -> version.", type: dict, returned: always}
modules: {description: "nvidia.ko modules built for the kernel: path, version, flavour, signer and sig_key (\"\" when unsigned).", type: list, returned: always}
built: {description: "The same modules as 'version flavour' strings, for messages.", type: list, returned: always}
module_built: {description: Whether a module of the installed version and flavour is built for the kernel., type: bool, returned: always}
version_mismatch: {description: The kernel module package and the userspace driver are installed at different versions., type: bool, returned: always}
precompiled: {description: "NVIDIA's precompiled kernel module packages installed (kmod-nvidia-<driver>-<kernel>), which DKMS does not build.", type: list, returned: always}
how:
  description: >-
    How the driver was installed (stackhpc gpu_info.py's "what is installed and how" as data): method is nvidia-dkms
    (NVIDIA's DKMS packages, what this role installs), nvidia-el7-latest-dkms (EL7's nvidia-driver-latest-dkms*),
    nvidia-precompiled, elrepo-kmod (ELRepo's kmod-nvidia and nvidia-x11-drv), runfile (NVIDIA's .run installer) or ''
    (no driver); version and flavour of that install; packages, the rpm packages that belong to it; evidence, what
    told the method (package names, or the .run installer's files).
  type: dict
  returned: always
"""

KMOD_PACKAGES = {"open": "kmod-nvidia-open-dkms", "proprietary": "kmod-nvidia-latest-dkms"}
# Files NVIDIA's .run installer leaves (nvidia-installer --uninstall is what removes it; nvidia-uninstall is its link).
RUNFILE_FILES = ("usr/bin/nvidia-uninstall", "usr/bin/nvidia-installer")
MODULE_FILES = ("nvidia.ko", "nvidia.ko.xz", "nvidia.ko.zst", "nvidia.ko.gz")
# MODULE_LICENSE of the two flavours.
LICENSE_FLAVOR = {"Dual MIT/GPL": "open", "NVIDIA": "proprietary"}
# "NVIDIA UNIX Open Kernel Module for x86_64  570.172.08  Release Build ..." (open) or
# "NVIDIA UNIX x86_64 Kernel Module  570.172.08  ..." (proprietary).
LOADED_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+([0-9]+\.[0-9.]+)")
# A kernel release as uname -r prints it: one path component, never "." or "..".
KERNEL_RELEASE = re.compile(r"^[0-9][A-Za-z0-9._+~-]*$")


def parse_loaded(text):
    """The loaded driver from /proc/driver/nvidia/version's text ('' when no driver is loaded). The flavour is only
    in this file: /sys/module/nvidia/version has the version alone, so a flavour switch would look loaded. A text
    that names no version has no flavour either ('' rather than a guess)."""
    match = LOADED_VERSION.search(text)
    if not match:
        return {"version": "", "flavor": ""}
    return {"version": match.group(1), "flavor": "open" if "Open Kernel Module" in text else "proprietary"}


def parse_stream(text):
    """The enabled stream from /etc/dnf/modules.d/nvidia-driver.module ('' when the module is not enabled)."""
    match = re.search(r"^stream=(\S+)", text, re.M)
    return match.group(1) if match and "state=enabled" in text else ""


def parse_modinfo(text):
    """version and flavour of one module from `modinfo <file>` (its license tells the flavour)."""
    fields = dict(re.findall(r"(?m)^(version|license|signer|sig_key):\s+(.*?)\s*$", text))
    licence = fields.get("license", "")
    # signer and sig_key: what kmod reads from the appended PKCS#7 signature (the certificate's issuer CN and serial),
    # "" for an unsigned module; the role compares sig_key with the site's enrolled certificate under Secure Boot.
    return {"version": fields.get("version", ""), "flavor": LICENSE_FLAVOR.get(licence, licence),
            "signer": fields.get("signer", ""), "sig_key": fields.get("sig_key", "")}


def installed_driver(packages, kmod_packages):
    """The installed kernel module package's version and flavour (open first, as NVIDIA names it), and fabric manager."""
    flavor = next((f for f in ("open", "proprietary") if kmod_packages[f] in packages), "")
    return {"version": packages[kmod_packages[flavor]] if flavor else "", "flavor": flavor,
            "fabricmanager": "nvidia-fabric-manager" in packages}


def driver_version(packages):
    """The driver's userspace version: nvidia-driver-cuda (EL8/9), else EL7's per-branch meta package, else nvidia-driver."""
    meta = sorted(name for name in packages if re.match(r"^nvidia-driver-branch-[0-9]+-cuda$", name))
    for name in ["nvidia-driver-cuda"] + meta + ["nvidia-driver"]:
        if name in packages:
            return packages[name]
    return ""


def precompiled_kmods(packages, kmod_packages):
    """NVIDIA's precompiled (signed) kernel module packages, kmod-nvidia[-open]-<driver>-<kernel>: not DKMS's."""
    dkms = set(kmod_packages.values())
    # Not ELRepo's legacy kmod-nvidia-470xx (a branch, no kernel in its name).
    return sorted(name for name in packages if re.match(r"^kmod-nvidia(-open)?-[0-9]", name) and name not in dkms
                  and not re.match(r"^kmod-nvidia(-open)?-[0-9]+xx$", name))


def el7_latest_dkms(packages):
    """EL7's nvidia-driver-latest-dkms flavour (NVIDIA's yum-packaging-nvidia-driver, rhel7 branch): its userspace
    packages nvidia-driver-latest-dkms*, its kernel module kmod-nvidia-latest-dkms."""
    return sorted(n for n in packages if n.startswith("nvidia-driver-latest-dkms") or n == "kmod-nvidia-latest-dkms")


def elrepo_packages(packages):
    """ELRepo's driver: kmod-nvidia (or a legacy kmod-nvidia-470xx) and its userspace nvidia-x11-drv*."""
    return sorted(n for n in packages if re.match(r"^kmod-nvidia(-open)?(-[0-9]+xx)?$", n) or n.startswith("nvidia-x11-drv"))


def runfile_evidence(root, packages, loaded, modules):
    """Signs of NVIDIA's .run installer: the files it installs (nvidia-uninstall, nvidia-installer), or a module built
    (or, on the live root, a driver loaded) while no kernel module package of any kind is installed: the .run puts
    nvidia.ko under /lib/modules/<kernel>/kernel/drivers/video, owned by no package. (An image root's "loaded" driver
    is the build host's, so it says nothing there.)"""
    found = ["/" + f for f in RUNFILE_FILES if os.path.lexists(os.path.join(root, f))]
    kmods = [n for n in packages if n.startswith("kmod-nvidia")]
    live_loaded = loaded["version"] if os.path.normpath(root) == "/" else ""
    if not kmods and (live_loaded or modules):
        found.append("nvidia module %s with no kernel module package" % (live_loaded or modules[0]["version"]))
    return found


def install_method(root, packages, kmod_packages, loaded, modules):
    """What is installed and how (see RETURN's how). A .run install wins over anything else found: packages installed
    next to it conflict with its files."""
    none = {"method": "", "version": "", "flavor": "", "packages": [], "evidence": []}
    runfile = runfile_evidence(root, packages, loaded, modules)
    if runfile:
        version = loaded["version"] or (modules[0]["version"] if modules else "")
        flavor = loaded["flavor"] or (modules[0]["flavor"] if modules else "")
        return dict(none, method="runfile", version=version, flavor=flavor, evidence=runfile)
    elrepo = elrepo_packages(packages)
    if elrepo:
        kmod = next((n for n in elrepo if n.startswith("kmod-nvidia")), elrepo[0])
        flavor = "open" if kmod.startswith("kmod-nvidia-open") else "proprietary"
        return dict(none, method="elrepo-kmod", version=packages[kmod], flavor=flavor, packages=elrepo, evidence=[kmod])
    if "nvidia-driver-latest-dkms" in packages or "nvidia-driver-latest-dkms-cuda" in packages:
        name = "nvidia-driver-latest-dkms" if "nvidia-driver-latest-dkms" in packages else "nvidia-driver-latest-dkms-cuda"
        return dict(none, method="nvidia-el7-latest-dkms", version=packages[name], flavor="proprietary",
                    packages=el7_latest_dkms(packages), evidence=[name])
    precompiled = precompiled_kmods(packages, kmod_packages)
    if precompiled:
        return dict(none, method="nvidia-precompiled", version=packages[precompiled[0]], packages=precompiled, evidence=precompiled)
    installed = installed_driver(packages, kmod_packages)
    if installed["flavor"]:
        kmod = kmod_packages[installed["flavor"]]
        return dict(none, method="nvidia-dkms", version=driver_version(packages) or installed["version"],
                    flavor=installed["flavor"], evidence=[kmod])
    return none


def read_text(path):
    try:
        with io.open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except (IOError, OSError):  # not there: no driver loaded, no module stream enabled
        return ""


def read_packages(module, root, patterns):
    argv = [module.get_bin_path("rpm", required=True), "--root", root, "-qa", "--queryformat", "%{NAME} %{VERSION}\\n"] + patterns
    rc, out, err = module.run_command(argv)
    if rc != 0:
        module.fail_json(msg="nvidia_driver_facts: rpm could not list the installed packages under %s: %s" % (root, err.strip()))
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def built_modules(module, root, kernel):
    """Every nvidia.ko under <root>/lib/modules/<kernel> (extra/, updates/, DKMS's own dirs) that modinfo can read."""
    found = []
    for directory, _, files in os.walk(os.path.join(root, "lib/modules", kernel)):
        found += [os.path.join(directory, name) for name in files if name in MODULE_FILES]
    modules = []
    for path in sorted(found):
        rc, out, _ = module.run_command([module.get_bin_path("modinfo", required=True), path])
        info = parse_modinfo(out) if rc == 0 else {"version": ""}
        if info["version"]:
            modules.append(dict(info, path=path))
    return modules


def check_params(module):
    """Bad arguments are refused with one line: a kernel that is not one path component, a root other than / without
    a kernel (the build host's own kernel means nothing for an image), kmod_packages without both flavours."""
    params = module.params
    kernel, root = params["kernel"], params["root"]
    if kernel is not None and not KERNEL_RELEASE.match(kernel):
        module.fail_json(msg="nvidia_driver_facts: kernel must be a kernel release as uname -r prints it, got %r" % kernel)
    if not kernel and os.path.normpath(root) != "/":
        module.fail_json(msg="nvidia_driver_facts: root %s is not /, so kernel must be given (the running kernel is this "
                             "host's, not the root's)" % root)
    kmods = params["kmod_packages"] or KMOD_PACKAGES
    if sorted(kmods) != ["open", "proprietary"] or not all(isinstance(v, string_types) and v for v in kmods.values()):
        module.fail_json(msg="nvidia_driver_facts: kmod_packages must name the package of both flavours "
                             "(keys open and proprietary), got %r" % (kmods,))
    return kernel or os.uname()[2], kmods


def main():
    module = AnsibleModule(
        argument_spec={
            "kernel": {"type": "str"},
            "root": {"type": "path", "default": "/"},
            "loaded_version_file": {"type": "path", "default": "/proc/driver/nvidia/version"},
            "kmod_packages": {"type": "dict"},
            "package_patterns": {"type": "list", "elements": "str", "default": ["nvidia-*", "kmod-nvidia*", "libnvidia-*"]},
        },
        supports_check_mode=True,
    )
    params = module.params
    kernel, kmod_packages = check_params(module)
    packages = read_packages(module, params["root"], params["package_patterns"])
    installed = installed_driver(packages, kmod_packages)
    userspace = driver_version(packages)
    modules = built_modules(module, params["root"], kernel)
    loaded = parse_loaded(read_text(params["loaded_version_file"]))
    module.exit_json(
        changed=False, kernel=kernel, loaded=loaded, installed=installed,
        how=install_method(params["root"], packages, kmod_packages, loaded, modules),
        driver_version=userspace, packages=packages,
        # The kernel module package and the userspace driver at different versions (a half-done change by hand).
        version_mismatch=bool(installed["version"] and userspace and installed["version"] != userspace),
        precompiled=precompiled_kmods(packages, kmod_packages),
        stream=parse_stream(read_text(os.path.join(params["root"], "etc/dnf/modules.d/nvidia-driver.module"))),
        modules=modules, built=["%s %s" % (m["version"], m["flavor"]) for m in modules],
        # modules without a version were left out, so "no driver installed" is never "built"
        module_built=any((m["version"], m["flavor"]) == (installed["version"], installed["flavor"]) for m in modules),
    )


if __name__ == "__main__":
    main()
