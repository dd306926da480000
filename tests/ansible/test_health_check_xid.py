"""gpu_health's HealthCheckProgram after an Xid drain (issue 29), run for real: the rendered script under bash, with
stand-in scontrol, nvidia-smi and dcgmi that record their calls, and a boot-id file the test changes to stand for the
admin's reboot. What the real slurmd makes of the check (and the path without DCGM) is the real_slurm rung's; this is
the DCGM path: after a reboot, `dcgmi diag -r 1` decides whether an Xid drain is resumed.
Stand-ins cannot show: a real GPU reset, the real kernel log (the script's own `dmesg` runs, and finds no Xid here)."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import jinja2
import yaml

ROLE = Path(__file__).resolve().parent.parent.parent / "ansible" / "roles" / "gpu_health"
XID = "gpu_health: Xid 79 in the kernel log"

SCONTROL = """#!/bin/bash
# Records its calls; "show node" prints the node line from the state file, "update ... state=resume" puts it in service.
echo "$*" >>{state}/scontrol.calls
case "$1 $*" in
  --oneliner*) cat {state}/node ;;
  *state=resume*) echo "NodeName=gpu01 State=IDLE Gres=gpu:h100:4" >{state}/node ;;
esac
"""
NVIDIA_SMI = """#!/bin/bash
for i in 0 1 2 3; do echo "$i, 570.172.08, 0, No, No, No"; done
"""
DCGMI = """#!/bin/bash
echo "$*" >>{state}/dcgmi.calls
exit "$(cat {state}/dcgmi.rc)"
"""


def render_check(**variables: object) -> str:
    """The template as the template module renders it (trim_blocks, StrictUndefined), with Ansible's quote and bool."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(ROLE / "templates")), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, keep_trailing_newline=True)
    env.filters["quote"] = shlex.quote
    env.filters["bool"] = lambda value: value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes", "on")
    return env.get_template("gpu-health-check.j2").render(ansible_managed="Ansible managed", **variables)


def stand_in(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def check_script(tmp_path: Path) -> Path:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    variables = {key: value for key, value in defaults.items() if key.startswith("gpu_health_") and "{{" not in str(value)}
    variables.update(
        gpu_health_expected_gpus=4, gpu_health_driver="570", gpu_health_slurm_node_name="gpu01", __gpu_health_dcgm=True,
        __gpu_health_reason_prefix="gpu_health:", __gpu_health_reboot_reason_prefix="hpc-train: reboot (slurm_asap)",
        __gpu_health_scontrol=str(stand_in(tmp_path / "scontrol", SCONTROL.format(state=tmp_path))),
        gpu_health_nvidia_smi=str(stand_in(tmp_path / "nvidia-smi", NVIDIA_SMI)),
        gpu_health_dcgmi=str(stand_in(tmp_path / "dcgmi", DCGMI.format(state=tmp_path))),
        gpu_health_expected_driver_file=str(tmp_path / "installed"), gpu_health_state_dir=str(tmp_path / "run"),
        gpu_health_boot_id_file=str(tmp_path / "boot_id"), gpu_health_xid_boot_file=str(tmp_path / "var" / "xid-drain-boot"))
    script = tmp_path / "gpu-health-check"
    script.write_text(render_check(**variables))
    return script


def run_check(tmp_path: Path, script: Path, boot: str, dcgmi_rc: int = 0) -> list[str]:
    """One run of the check as slurmd would start it; the scontrol calls it made."""
    (tmp_path / "boot_id").write_text(boot + "\n")
    (tmp_path / "dcgmi.rc").write_text(str(dcgmi_rc))
    (tmp_path / "scontrol.calls").unlink(missing_ok=True)
    subprocess.run(["bash", str(script)], env={"SLURMD_NODENAME": "gpu01"}, capture_output=True, text=True, timeout=60)
    calls = tmp_path / "scontrol.calls"
    return [line for line in calls.read_text().splitlines() if line.startswith("update")] if calls.exists() else []


def test_an_xid_drain_is_resumed_only_after_a_reboot_and_dcgm_diagnostics(tmp_path: Path) -> None:
    script = check_script(tmp_path)
    (tmp_path / "node").write_text(f"NodeName=gpu01 State=IDLE+DRAIN Gres=gpu:h100:4 Reason={XID} [root@2026-12-04T11:00:00]\n")
    dcgmi_calls = tmp_path / "dcgmi.calls"
    # Healthy GPUs, same boot: the Xid drain waits for a reset; no diagnostics run.
    assert run_check(tmp_path, script, "boot-1") == []
    assert not dcgmi_calls.exists() and (tmp_path / "var" / "xid-drain-boot").read_text().strip() == "boot-1"
    # Rebooted, dcgmi diag fails: still drained, the failure added to the reason and the Xid kept.
    assert run_check(tmp_path, script, "boot-2", dcgmi_rc=1) == [
        "update nodename=gpu01 state=drain reason=gpu_health: dcgmi diag -r 1 failed; Xid 79 in the kernel log"]
    assert dcgmi_calls.read_text().splitlines() == ["diag -r 1"]
    (tmp_path / "node").write_text(f"NodeName=gpu01 State=IDLE+DRAIN Gres=gpu:h100:4 Reason=gpu_health: dcgmi diag -r 1 failed; "
                                   f"Xid 79 in the kernel log [root@2026-12-04T11:05:00]\n")
    # dcgmi diag passes: resumed, and the kept boot forgotten at the next run.
    assert run_check(tmp_path, script, "boot-2") == ["update nodename=gpu01 state=resume"]
    assert dcgmi_calls.read_text().splitlines() == ["diag -r 1", "diag -r 1"]
    run_check(tmp_path, script, "boot-2")
    assert not (tmp_path / "var" / "xid-drain-boot").exists()
