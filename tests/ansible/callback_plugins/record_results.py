"""Test-only callback: append one JSON line per task result to $HPC_TRAIN_RECORD (host, task, status, diff, facts).

The ladder reads these records to check per-host decisions, diffs and failure messages without parsing the
human output. Works with ansible-core 2.16 (``result._result``) and 2.19 (``result.result``).
"""

from __future__ import annotations

import json
import os
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: record_results
type: aggregate
short_description: write task results as JSON lines for the hpc-train ansible test ladder
description: Appends one JSON object per task result to the file named by $HPC_TRAIN_RECORD.
"""


def _plain(value):
    """Turn Ansible's tagged/unsafe strings and other wrappers into JSON-safe plain values."""
    return json.loads(json.dumps(value, default=str))


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "record_results"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._path = os.environ.get("HPC_TRAIN_RECORD", "")

    def _write(self, result, status: str) -> None:
        if not self._path:
            return
        payload = getattr(result, "result", None)
        if not isinstance(payload, dict):
            payload = result._result
        host = getattr(result, "host", None) or result._host
        task = getattr(result, "task", None) or result._task
        role = task._role.get_name() if getattr(task, "_role", None) else ""
        module_args = (payload.get("invocation") or {}).get("module_args") or {}
        diffs = payload.get("diff", [])
        if isinstance(diffs, dict):
            diffs = [diffs]
        record = {
            "host": host.get_name(),
            "time": time.time(),
            "task": task.get_name(),
            "role": role,
            "status": status,
            "changed": bool(payload.get("changed", False)),
            "msg": payload.get("msg", ""),
            "dest": payload.get("dest") or payload.get("path") or module_args.get("dest") or module_args.get("path") or "",
            "diff": diffs,
            "facts": payload.get("ansible_facts", {}),
            "results": [
                {"changed": bool(item.get("changed", False)), "diff": item.get("diff", []), "item": item.get("item")}
                for item in payload.get("results", [])
                if isinstance(item, dict)
            ],
        }
        with open(self._path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(_plain(record)) + "\n")

    def v2_runner_on_ok(self, result, **kwargs) -> None:
        self._write(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False, **kwargs) -> None:
        self._write(result, "ignored" if ignore_errors else "failed")

    def v2_runner_on_skipped(self, result, **kwargs) -> None:
        self._write(result, "skipped")

    def v2_runner_on_unreachable(self, result, **kwargs) -> None:
        self._write(result, "unreachable")
