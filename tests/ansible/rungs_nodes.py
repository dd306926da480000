"""Ladder rungs for one role each on this machine, with stand-ins for what cannot exist here:
gpu_validate (validate.yml: stand-in nvidia-smi, a fake EL root with the driver packages) and pytorch_env (the role
for real from stand-in wheels, two nodes sharing a venv, an http:// index; the offline recipe of docs/ansible.md).
The Slurm side is rungs_slurm.py's, against the real Slurm."""

from __future__ import annotations

import http.server
import json
import shlex
import shutil
import subprocess
import threading
from functools import partial
from pathlib import Path

import fake_wheels
import ladder_lib as lib
from fake_repos import build as fake_repos
from rungs_packages import IMAGE_KERNEL

# ------------------------------------------------------------------------------------------------ gpu_validate


def gpu_validate(ladder, venv: Path) -> None:
    """validate.yml (gpu_preflight, then gpu_validate) on a node whose GPUs are a stand-in nvidia-smi."""
    repos = lib.ensure_repos("repos")
    node_dir = lib.WORK / "gpu-validate"
    shutil.rmtree(node_dir, ignore_errors=True)
    lib.build_fixture_machine(json.loads((lib.HERE / "fixtures" / "facts" / "el9.json").read_text()), node_dir)
    node = lib.make_image_root("gpu-validate/node", repos)
    lib.set_running_kernel(node["root"], IMAGE_KERNEL)
    loaded = node_dir / "proc-driver-nvidia-version"
    gpu_state = node_dir / "gpu.json"
    version = fake_repos.DRIVER_VERSIONS[0]
    cuda = repos / "cuda"
    # The driver installed without the running kernel's kernel-devel: the kmod's %post fails to build, quietly.
    lib.rpm_install(node["root"], sorted((repos / "epel").glob("dkms-*.rpm")))
    lib.rpm_install(node["root"], sorted(cuda.glob(f"kmod-nvidia-open-dkms-{version}-*.rpm")) + sorted(cuda.glob(f"nvidia-kmod-common-{version}-*.rpm")))

    # Runs that check the GPU count run gpu_preflight (it counts the GPUs on the PCI bus); the others only gpu_validate.
    def play(label: str, gpus: int = 8, driver: str | None = version, tags: str = "preflight,validate", *extra: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
        if driver is None:
            loaded.unlink(missing_ok=True)
        else:
            loaded.write_text(f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {driver}  Release Build  (stand-in)\n")
        lib.write_state(gpu_state, {"loaded_version_file": str(loaded), "gpus": gpus})
        record = lib.WORK / f"gpu-validate-{label}.jsonl"
        env = lib.with_stand_ins(lib.ansible_env(venv, record, HPC_TRAIN_FAKE_GPU=str(gpu_state)), "fake_gpu")
        result = lib.run([str(venv / "bin" / "ansible-playbook"), "-i", str(lib.EXAMPLE), "-i", str(lib.HERE / "inventories" / "validate" / "hosts.yml"),
                          "--limit", "validate-node", "--tags", tags, "--skip-tags", "packages", "-e", f"fixtures_dir={lib.HERE / 'fixtures'}",
                          "-e", f"node_dir={node_dir}", *extra, "validate_node.yml"], env, lib.WORK / "logs" / f"gpu-validate-{label}.log")
        return result, lib.read_records(record)

    # The inventories ask for 0.1 GB free (stand-in packages); a node short of the role's figure is refused before anything.
    result, records = play("0-disk-short", 8, version, "preflight", "-e", "gpu_preflight_min_free_gb=1000000")
    failure = lib.first_failure(records, "validate-node") or {}
    ladder.check("gpu_preflight/a filesystem with less free space than gpu_preflight_min_free_gb is refused, naming both figures",
                 result.returncode != 0 and failure.get("msg", "").startswith("gpu_preflight: only ")
                 and "need about 1000000 GB" in failure.get("msg", ""), failure.get("msg", "") or lib.tail(result.stdout))

    result, records = play("1-dkms-build-failed", driver=None, tags="validate")
    failure = lib.first_failure(records, "validate-node") or {}
    ladder.check("gpu_validate/driver not loaded after a failed DKMS build: reported, not taken for a pending reboot",
                 failure.get("msg", "").startswith(f"gpu_validate: the NVIDIA driver is not loaded on validate-node, and no nvidia module of "
                                                   f"driver {version} (open) is built for the kernel the node boots, {IMAGE_KERNEL}"),
                 failure.get("msg", "") or lib.tail(result.stdout))

    lib.rpm_install(node["root"], sorted((repos / "baseos").glob(f"kernel-devel-{IMAGE_KERNEL}.rpm")))
    subprocess.run(["chroot", str(node["root"]), "dkms", "autoinstall", "-k", IMAGE_KERNEL], check=True, capture_output=True)
    result, records = play("2-reboot-pending", driver=None, tags="validate")
    notes = [r["msg"] for r in records if r["task"].endswith("Note that the GPU checks wait for the reboot")]
    ladder.check("gpu_validate/driver built but not loaded: says the checks wait for the reboot, does not fail",
                 result.returncode == 0 and notes == ["validate-node: the NVIDIA driver is not loaded yet (reboot pending); GPU checks skipped."],
                 str(notes) + "\n" + lib.tail(result.stdout))

    result, records = play("3-good")
    checked = [r for r in records if r["task"].endswith("Check the driver branch, the GPU count and persistence mode")]
    ladder.check("gpu_validate/8 GPUs on branch 570 in persistence mode pass",
                 result.returncode == 0 and [r["status"] for r in checked] == ["ok"], lib.tail(result.stdout, 15))

    result, records = play("4-gpu-off-the-bus", gpus=7)
    failure = lib.first_failure(records, "validate-node") or {}
    ladder.check("gpu_validate/a GPU off the bus (7 answer, 8 on the PCI bus per gpu_preflight) is reported",
                 failure.get("msg", "").endswith("expected 8 GPU(s) on driver branch 570 in persistence mode.")
                 and failure.get("msg", "").count(f", {version}, Enabled") == 7, failure.get("msg", "") or lib.tail(result.stdout))

    result, records = play("5-wrong-branch", driver="550.127.08", tags="validate")
    failure = lib.first_failure(records, "validate-node") or {}
    ladder.check("gpu_validate/a driver of another branch is reported",
                 failure.get("msg", "").startswith("gpu_validate: nvidia-smi on validate-node says ['0, NVIDIA H100 80GB HBM3, 550.127.08, Enabled'")
                 and failure.get("msg", "").endswith("GPU(s) on driver branch 570 in persistence mode."), failure.get("msg", ""))


# ------------------------------------------------------------------------------------------------ pytorch_env


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # the ladder's output is its PASS/FAIL lines
        pass


def offline_recipe(doc: Path) -> list[str]:
    """The `pip download` command of docs/ansible.md's offline mirror recipe, as argv."""
    lines = doc.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("pip download "))
    command = []
    for line in lines[start:]:
        command.append(line.rstrip("\\").strip())
        if not line.endswith("\\"):
            break
    return shlex.split(" ".join(command))


def pytorch_env(ladder, venv: Path) -> None:
    repos = lib.ensure_repos("repos")
    base = lib.WORK / "pytorch-env"
    shutil.rmtree(base, ignore_errors=True)
    wheels, wheels_cpu_only = base / "wheels", base / "wheels-without-cu128"
    fake_wheels.build(wheels)
    fake_wheels.build(wheels_cpu_only, with_cuda_build=False)
    simple = fake_wheels.index(wheels, base / "index")
    roots = base / "nodes"
    for host in ("node-a", "node-b"):
        lib.make_image_root(f"pytorch-env/nodes/{host}", repos, base_os=False)
    shared_venv = base / "shared-venv"

    def play(label: str, target: Path, *extra: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
        record = lib.WORK / f"pytorch-{label}.jsonl"
        result = lib.run([str(venv / "bin" / "ansible-playbook"), "-i", str(lib.HERE / "inventories" / "pytorch" / "hosts.yml"),
                          "-e", f"fixtures_dir={lib.HERE / 'fixtures'}", "-e", f"roots_dir={roots}", "-e", f"torch_venv={target}",
                          *extra, "pytorch_env.yml"], lib.ansible_env(venv, record), lib.WORK / "logs" / f"pytorch-{label}.log")
        return result, lib.read_records(record)

    result, records = play("1-shared", shared_venv, "-e", f"wheel_dir={wheels}", "-e", "pytorch_env_shared_venv=true")
    ladder.check("pytorch_env/builds the shared venv", result.returncode == 0, lib.tail(result.stdout, 25))
    with_python = [h for h in ("node-a", "node-b") if f"{fake_repos.PYTHON_PACKAGE}-3.11.9-1.el9" in lib.rpm_packages(roots / h / "root")]
    venv_hosts = sorted({r["host"] for r in records if r["task"].endswith("Create the venv") and r["status"] != "skipped"})
    ladder.check("pytorch_env/shared venv: python3.11 installed on every node, the venv built from the first only",
                 with_python == ["node-a", "node-b"] and venv_hosts == ["node-a"], f"python on {with_python}, venv from {venv_hosts}")
    installed = subprocess.run([str(shared_venv / "bin" / "python"), "-c",
                                "import importlib.metadata as m; print(m.version('torch'), m.version('torchvision'), m.version('hpc-train'))"],
                               capture_output=True, text=True).stdout.split()
    ladder.check("pytorch_env/the +cu128 builds were chosen over +cpu and plain ones", installed == ["2.7.1+cu128", "0.22.1+cu128", "0.1.0"],
                 str(installed))
    result, records = play("2-rerun", shared_venv, "-e", f"wheel_dir={wheels}", "-e", "pytorch_env_shared_venv=true")
    ladder.check("pytorch_env/second run changes nothing", result.returncode == 0 and lib.counts(records)[0] == 0,
                 "changed: " + ", ".join(r["task"] for r in records if r["changed"]))
    result, records = play("3-no-cuda-build", base / "venv-no-cuda", "--limit", "node-a", "-e", f"wheel_dir={wheels_cpu_only}")
    failure = lib.first_failure(records, "node-a") or {}
    ladder.check("pytorch_env/a mirror without the cu128 wheels: refused with a clear message",
                 failure.get("msg", "").startswith("pytorch_env: pip could not install torch==2.7.1+cu128 (and the rest of ")
                 and "must carry the cu128 wheels" in failure.get("msg", ""), failure.get("msg", ""))

    # An internal mirror over plain HTTP (docs/ansible.md's example): pip ignores it unless its host is trusted.
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietHandler, directory=str(simple.parent)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/simple/"
        result, records = play("4-http-index", base / "venv-http", "--limit", "node-a", "-e", f"index_url={url}")
    finally:
        server.shutdown()
    ladder.check("pytorch_env/an http:// mirror index works (its host is trusted automatically)",
                 result.returncode == 0 and (base / "venv-http" / "bin" / "python").exists(), lib.tail(result.stdout, 15))

    # docs/ansible.md's offline recipe, run as written against a local copy of the indexes.
    argv = offline_recipe(lib.REPO / "docs" / "ansible.md")
    for option, value in (("--index-url", simple.as_uri() + "/"), ("--extra-index-url", simple.as_uri() + "/"), ("-d", str(base / "download"))):
        if option in argv:
            argv[argv.index(option) + 1] = value
    result = subprocess.run([str(venv / "bin" / "python"), "-m", *argv], capture_output=True, text=True,
                            env=lib.ansible_env(venv))
    downloaded = sorted(p.name.split("-")[0] for p in (base / "download").glob("*.whl"))
    ladder.check("pytorch_env/docs/ansible.md's pip download recipe fetches torch and its manylinux2014 dependencies",
                 result.returncode == 0 and downloaded == ["hpc_train", "nvidia_nccl_cu12", "torch", "torchvision"],
                 f"{' '.join(argv)}\n{downloaded}\n{lib.tail(result.stdout + result.stderr, 6)}")
