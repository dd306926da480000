"""Secure Boot stand-ins for the live rung, with real cryptography so they cannot agree with the roles by construction.

  * install_tools(root): the real openssl and the kernel's real `sign-file` (Debian's linux-kbuild-6.1, the same
    program EL's kernel-devel ships as scripts/sign-file) copied into the fake EL root with the libraries they link,
    behind wrappers at /usr/bin/openssl and /usr/src/kernels/<kernel>/scripts/sign-file, so the dkms stand-in signs as
    real dkms does and the roles' openssl calls (under chroot) run the real thing; the mokutil stand-in at
    /usr/bin/mokutil.
  * set_mok_state(root, ...): shim's lists as the mokutil stand-in reads them (enrolled, pending, SecureBoot).
  * make_key_pair(dir, name): a Machine Owner Key as sites and `dkms generate_mok` make one (RSA 2048, self-signed,
    certificate in DER).
  * module_loads(module, root): what a kernel with CONFIG_MODULE_SIG_FORCE (Secure Boot's lockdown) decides: the
    module's appended PKCS#7 signature must verify (openssl cms) against a certificate on the enrolled list. The fake
    reboot (fake_slurm) calls it.

Cannot show: shim, MokManager, the firmware's db/dbx, the kernel's own keyring (.platform/.machine), lockdown itself.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIGN_FILE = Path("/usr/lib/linux-kbuild-6.1/scripts/sign-file")  # Debian's linux-kbuild-6.1 (run.sh installs it)
TOOLS = "/opt/hpc-train-stand-in/crypto"  # inside the root
MOK_STATE = Path("var/lib/hpc-train-stand-in/mok")
MAGIC = b"~Module signature appended~\n"  # the kernel's MODULE_SIG_STRING
PKEY_ID_PKCS7 = 2


def _libraries(binary: Path) -> list[Path]:
    out = subprocess.run(["ldd", str(binary)], check=True, capture_output=True, text=True).stdout
    return [Path(part) for line in out.splitlines() for part in line.split() if part.startswith("/")]


def install_tools(root: Path) -> None:
    if not SIGN_FILE.exists():
        raise SystemExit(f"{SIGN_FILE} is missing: install Debian's linux-kbuild-6.1 (run.sh does)")
    tools = root / TOOLS.lstrip("/")
    tools.mkdir(parents=True, exist_ok=True)
    openssl = Path(shutil.which("openssl") or "/usr/bin/openssl")
    loader = None
    for binary in (openssl, SIGN_FILE):
        shutil.copy2(binary, tools / binary.name)
        for library in _libraries(binary):
            shutil.copy2(library, tools / library.name)
            loader = library.name if library.name.startswith("ld-linux") else loader
    conf = root / "usr/lib/ssl/openssl.cnf"  # openssl req reads its configuration from there
    conf.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2("/usr/lib/ssl/openssl.cnf", conf)

    def wrapper(path: Path, program: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'#!/bin/sh\nexec {TOOLS}/{loader} --library-path {TOOLS} {TOOLS}/{program} "$@"\n')
        path.chmod(0o755)

    wrapper(root / "usr/bin/openssl", openssl.name)
    for kernel_dir in (root / "usr/src/kernels").iterdir():
        wrapper(kernel_dir / "scripts" / "sign-file", "sign-file")
    shutil.copy2(HERE / "mokutil", root / "usr/bin/mokutil")


def set_mok_state(root: Path, secure_boot: bool, enrolled: list[Path] = (), pending: list[Path] = ()) -> None:
    state = root / MOK_STATE
    shutil.rmtree(state, ignore_errors=True)
    for kind, certificates in (("enrolled", enrolled), ("pending", pending)):
        (state / kind).mkdir(parents=True)
        for index, certificate in enumerate(certificates):
            shutil.copy2(certificate, state / kind / f"{index}.der")
    (state / "sb-state").write_text("enabled\n" if secure_boot else "disabled\n")


def secure_boot_on(root: Path) -> bool:
    path = root / MOK_STATE / "sb-state"
    return path.exists() and path.read_text().strip() == "enabled"


def make_key_pair(directory: Path, name: str) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    key, certificate = directory / f"{name}.key", directory / f"{name}.der"
    subprocess.run(["openssl", "req", "-new", "-x509", "-nodes", "-days", "36500", "-subj", f"/CN={name} module signing key/",
                    "-newkey", "rsa:2048", "-keyout", str(key), "-outform", "DER", "-out", str(certificate)],
                   check=True, capture_output=True)
    key.chmod(0o600)
    return key, certificate


def split_signature(module: bytes) -> tuple[bytes, bytes] | None:
    """(signed content, PKCS#7 DER) of a module signed as the kernel's sign-file does, or None when it is unsigned."""
    if not module.endswith(MAGIC):
        return None
    info_end = len(module) - len(MAGIC)
    # struct module_signature: algo, hash, id_type, signer_len, key_id_len, pad[3], sig_len (big endian)
    _, _, id_type, _, _, sig_len = struct.unpack(">BBBBB3xI", module[info_end - 12:info_end])
    if id_type != PKEY_ID_PKCS7 or sig_len > info_end - 12:
        return None
    sig_start = info_end - 12 - sig_len
    return module[:sig_start], module[sig_start:info_end - 12]


def module_loads(module: Path, root: Path) -> bool:
    """Secure Boot off: any module loads. On: only one whose signature an enrolled certificate verifies."""
    if not secure_boot_on(root):
        return True
    parts = split_signature(module.read_bytes())
    if parts is None:
        return False
    content, signature = parts
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        (work / "content").write_bytes(content)
        (work / "signature").write_bytes(signature)
        for certificate in sorted((root / MOK_STATE / "enrolled").glob("*.der")):
            pem = work / "enrolled.pem"
            subprocess.run(["openssl", "x509", "-inform", "DER", "-in", str(certificate), "-out", str(pem)], check=True,
                           capture_output=True)
            verified = subprocess.run(["openssl", "cms", "-verify", "-binary", "-inform", "DER", "-in", str(work / "signature"),
                                       "-content", str(work / "content"), "-certfile", str(pem), "-nointern", "-noverify",
                                       "-out", "/dev/null"], capture_output=True)
            if verified.returncode == 0:
                return True
    return False
