"""The roles' own modules (ansible/roles/*/library/*.py) run on the node's Python, not the controller's: EL7's 2.7 and
EL8's platform-python 3.6 (ansible-core 2.16 still targets both, docs/ansible.md). A module that does not compile
there is a MODULE FAILURE on every such node. The filter plugins (roles/*/filter_plugins/) run on the controller
(Python 3.10-3.12 for ansible-core 2.16) and are not held to this.

Three checks, from the cheapest and always available to the strongest:
  grammar   parso 0.7.1's Python 2.7 and 3.6 grammars and its error rules (future imports included), which run.sh
            installs (pure Python, in .cache/); plus ast.parse(feature_version=(3, 6)) of this Python. Shows: syntax
            (f-strings, annotations, star displays, keyword-only arguments, `from __future__ import annotations`).
            Cannot show: what a name means at run time.
  api       a short list of calls this code base used that 2.7 lacks (open(encoding=), os.uname().release,
            subprocess.run, ...), read from the AST. Shows: those calls. Cannot show: any other API difference.
  run       each module run by ansible-core 2.16 (AnsiballZ, as on a node) under a real Python 2.7 and 3.6, where this
            machine has them (pyenv's, or python2.7/python3.6 on PATH). Shows: the modules work there. On a machine
            without those interpreters only the two checks above run (they are what CI is guaranteed).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ANSIBLE = HERE.parent.parent / "ansible"
TARGET_MODULES = sorted((ANSIBLE / "roles").glob("*/library/*.py"))
CACHE = HERE / ".cache"
PARSO_DIR = Path(os.environ.get("HPC_TRAIN_PARSO_DIR", CACHE / "parso-0.7.1"))
CORE_216 = Path(os.environ.get("HPC_TRAIN_CORE_216", CACHE / "core-2.16"))
TARGET_PYTHONS = ("2.7", "3.6")
# Calls that Python 2.7 lacks (or that mean something else there), as the AST spells them.
PY2_MISSING_CALLS = {"subprocess.run", "shutil.which", "os.makedirs(exist_ok)", "open(encoding)", "os.uname().attr",
                     "str.removeprefix", "str.removesuffix", "math.isclose", "os.scandir"}


def parso():
    if str(PARSO_DIR) not in sys.path:
        sys.path.insert(0, str(PARSO_DIR))
    try:
        import parso as module
    except ImportError:
        pytest.fail(f"parso 0.7.1 is not in {PARSO_DIR}: tests/ansible/run.sh installs it (pip install --target)")
    assert module.__version__ == "0.7.1", f"parso {module.__version__} in {PARSO_DIR}: 0.7.1 is the last with a 2.7 grammar"
    return module


def grammar_errors(source: str, version: str) -> list[str]:
    grammar = parso().load_grammar(version=version)
    return [f"line {e.start_pos[0]}: {e.message}" for e in grammar.iter_errors(grammar.parse(source))]


def api_problems(source: str) -> list[str]:
    """Uses of PY2_MISSING_CALLS in the source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = ast.unparse(func)
            keywords = {k.arg for k in node.keywords}
            if name == "open" and "encoding" in keywords:
                found.append(f"line {node.lineno}: open(encoding=...) (io.open)")
            elif name == "os.makedirs" and "exist_ok" in keywords:
                found.append(f"line {node.lineno}: os.makedirs(exist_ok=...)")
            elif name in PY2_MISSING_CALLS:
                found.append(f"line {node.lineno}: {name}()")
            elif isinstance(func, ast.Attribute) and func.attr in ("removeprefix", "removesuffix"):
                found.append(f"line {node.lineno}: .{func.attr}()")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "os.uname":
            found.append(f"line {node.lineno}: os.uname().{node.attr} (a tuple on 2.7: os.uname()[2])")
    return found


@pytest.mark.parametrize("version", TARGET_PYTHONS)
@pytest.mark.parametrize("path", TARGET_MODULES, ids=lambda p: p.name)
def test_target_module_parses_as_the_nodes_python(path: Path, version: str) -> None:
    source = path.read_text()
    assert grammar_errors(source, version) == [], f"{path.name} does not compile on Python {version}"
    if version == "3.6":
        ast.parse(source, feature_version=(3, 6))


@pytest.mark.parametrize("path", TARGET_MODULES, ids=lambda p: p.name)
def test_target_module_uses_no_call_python_2_7_lacks(path: Path) -> None:
    assert api_problems(path.read_text()) == []


def test_there_are_target_modules_and_the_checks_catch_what_broke_el7_and_el8() -> None:
    """The code issue 22 shipped: each line is refused by the check that must refuse it."""
    assert len(TARGET_MODULES) >= 2, TARGET_MODULES
    for version in TARGET_PYTHONS:
        assert grammar_errors("from __future__ import annotations\n", version) == [
            "line 1: SyntaxError: future feature annotations is not defined"]
        assert grammar_errors("from __future__ import absolute_import, division, print_function\nimport os\n", version) == []
    for line in ("def f(code: int) -> str:\n    return ''\n", "x = f'{a} ({b})'\n", "x = [*a, 'b']\n", "x = {'a': 1, **b}\n"):
        assert grammar_errors(line, "2.7"), line
    assert api_problems("with open(path, encoding='utf-8') as f:\n    pass\n")
    assert api_problems("k = os.uname().release\n") and not api_problems("k = os.uname()[2]\n")
    assert api_problems("subprocess.run(['x'])\n") and api_problems("'ab'.removeprefix('a')\n")


# ------------------------------------------------------------------------------------------------ run on a real 2.7/3.6


def real_interpreter(version: str) -> str | None:
    pyenv = sorted((Path.home() / ".pyenv" / "versions").glob(f"{version}.*/bin/python{version}"))
    return str(pyenv[-1]) if pyenv else shutil.which(f"python{version}")


FOUND = [v for v in TARGET_PYTHONS if real_interpreter(v)]

PLAYBOOK = """
- hosts: all
  gather_facts: false
  tasks:
    - name: The driver facts
      nvidia_driver_facts:
        root: "{{ root }}"
        kernel: 5.14.0-427.13.1.el9_4.x86_64
        loaded_version_file: "{{ loaded }}"
      environment: {PATH: "{{ stand_ins }}:{{ ansible_env_path }}"}
      register: facts
    - name: A CUDA context on every GPU
      nvidia_cuda_context:
        libcuda: "{{ libcuda }}"
      register: cuda
    - name: Save both
      ansible.builtin.copy:
        content: "{{ {'facts': facts, 'cuda': cuda, 'python': ansible_python_interpreter} | to_json }}"
        dest: "{{ out }}"
        mode: "0644"
"""


@pytest.mark.parametrize("version", FOUND)
def test_target_modules_run_under_a_real_old_python(tmp_path: Path, version: str) -> None:
    sys.path.insert(0, str(HERE / "fake_gpu"))
    import libcuda_elf

    assert (CORE_216 / "bin" / "ansible-playbook").exists(), f"no ansible-core 2.16 venv at {CORE_216} (run.sh makes it)"
    root, stand_ins = tmp_path / "root", tmp_path / "bin"
    (root / "lib" / "modules" / "5.14.0-427.13.1.el9_4.x86_64" / "extra").mkdir(parents=True)
    (root / "lib" / "modules" / "5.14.0-427.13.1.el9_4.x86_64" / "extra" / "nvidia.ko.xz").write_text("stand-in\n")
    stand_ins.mkdir()
    canned = HERE / "fixtures" / "driver_facts"
    (stand_ins / "rpm").write_text("#!/bin/sh\nprintf 'kmod-nvidia-open-dkms 570.172.08\\nnvidia-driver-cuda 570.172.08\\n'\n")
    (stand_ins / "modinfo").write_text(f"#!/bin/sh\ncat {canned / 'modinfo-open.txt'}\n")
    for tool in ("rpm", "modinfo"):
        (stand_ins / tool).chmod(0o755)
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    out = tmp_path / "out.json"
    extra = {"root": str(root), "loaded": str(canned / "proc-version-open.txt"), "stand_ins": str(stand_ins),
             "ansible_env_path": os.environ["PATH"], "out": str(out),
             "libcuda": str(libcuda_elf.build(tmp_path / "libcuda.so.1", devices=2)),
             "ansible_python_interpreter": real_interpreter(version)}
    env = {**os.environ, "ANSIBLE_LIBRARY": str(ANSIBLE / "roles" / "nvidia_driver" / "library"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "ANSIBLE_DEPRECATION_WARNINGS": "false",
           "ANSIBLE_PYTHON_INTERPRETER": real_interpreter(version)}
    (tmp_path / "ansible.cfg").write_text("[defaults]\n")
    env["ANSIBLE_CONFIG"] = str(tmp_path / "ansible.cfg")
    env.pop("ANSIBLE_CALLBACKS_ENABLED", None)
    result = subprocess.run([str(CORE_216 / "bin" / "ansible-playbook"), "-i", "node,", "-c", "local", "-e", json.dumps(extra),
                             str(tmp_path / "play.yml")], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    said = json.loads(out.read_text())
    assert said["python"].endswith(f"python{version}")
    facts = said["facts"]
    assert facts["installed"] == {"version": "570.172.08", "flavor": "open", "fabricmanager": False}
    assert facts["loaded"] == {"version": "570.172.08", "flavor": "open"} and facts["module_built"] is True
    assert facts["built"] == ["570.172.08 open"] and facts["version_mismatch"] is False
    assert said["cuda"]["ok"] is True and said["cuda"]["contexts"] == [0, 0]
