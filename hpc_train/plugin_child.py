"""The plug-in probe run in a child process with a deadline (issue 28, item 6): ``submit --dry-run`` imports the
job's own modules, and a module may call ``sys.exit`` at import, print forever, block, or leave a non-daemon thread
that keeps an interpreter from ending. Run in hpc-train's own process, each of those ended or hung the dry run
with no word of why; here each is exit 2 saying what the plug-in did.

The parent hands the child the resolved job on stdin, reads the child's answer (JSON) from a pipe of its own, and
drains the child's stdout/stderr (the plug-in's prints) keeping only the first few KiB; at the deadline it kills
the child's process group. The child (``python -m hpc_train.plugin_child``) runs :func:`~.plugin_probe.probe_plugins`
and writes its lines or its one-line error before it lets the interpreter end, and names any non-daemon thread
still alive then. Torch is imported only in the child (a loss plug-in is called on a probe batch there).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from .errors import ConfigError

DEADLINE_S = 60.0
"""Import and a probe call take seconds (torch's import included); a plug-in that takes longer is doing more
than defining functions at import."""
KEPT_OUTPUT_BYTES = 4096


def _one_line(text: str, limit: int = 300) -> str:
    first = (text.strip().splitlines() or [""])[0]
    return first if len(first) <= limit else first[:limit] + "..."


def probe_in_child(job_yaml: str, deadline_s: float = DEADLINE_S) -> list[str]:
    """The probe's lines for the resolved job ``job_yaml``; ConfigError (exit 2) in one line for a plug-in that
    fails, exits, overruns the deadline, or leaves a thread running."""
    answer_read, answer_write = os.pipe()
    try:
        child = subprocess.Popen([sys.executable, "-m", __name__, str(answer_write)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, pass_fds=(answer_write,),
                                 start_new_session=True)
    finally:
        os.close(answer_write)
    printed = bytearray()
    printed_bytes = [0]

    def drain() -> None:  # the plug-in's prints: counted, the first few KiB kept, never held whole
        assert child.stdout is not None
        while chunk := child.stdout.read1(65536):
            printed_bytes[0] += len(chunk)
            if len(printed) < KEPT_OUTPUT_BYTES:
                printed.extend(chunk[:KEPT_OUTPUT_BYTES - len(printed)])

    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    answer: dict[str, Any] | None = None
    try:
        assert child.stdin is not None
        try:
            child.stdin.write(job_yaml.encode("utf-8"))
            child.stdin.close()
        except BrokenPipeError:
            pass
        answer = _read_answer(answer_read, time.monotonic() + deadline_s)
    finally:
        os.close(answer_read)
        _end(child)
        drainer.join(timeout=5)
    return _lines_or_refusal(answer, child.returncode, bytes(printed), printed_bytes[0], deadline_s)


def _read_answer(fd: int, deadline: float) -> dict[str, Any] | None:
    """The child's answer, or None when it ended or the deadline passed before it gave a whole one."""
    import select

    data = bytearray()
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data.extend(chunk)
        if data.endswith(b"\n"):
            try:
                return json.loads(data)
            except ValueError:
                return None
    return None


def _end(child: subprocess.Popen) -> None:
    """The child and whatever it started: ended (its process group), and waited for."""
    if child.poll() is None:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    child.wait()


def _lines_or_refusal(answer: dict[str, Any] | None, code: int | None, printed: bytes, printed_bytes: int,
                      deadline_s: float) -> list[str]:
    if answer is not None and answer.get("error"):
        raise ConfigError(answer["error"])
    if answer is not None and answer.get("threads"):
        raise ConfigError(f"a plug-in left non-daemon thread(s) running after import ({', '.join(answer['threads'])}):"
                          " a rank would never exit; make them daemon threads or start them when called")
    if answer is not None:
        return [str(line) for line in answer.get("lines", [])]
    said = _one_line(printed.decode("utf-8", errors="replace"))
    output = f"; it printed {printed_bytes:,} bytes" + (f", first: {said!r}" if said else "") if printed_bytes else ""
    if code is None or code < 0:
        raise ConfigError(f"probing the job's plug-ins did not finish within {deadline_s:.0f} s (a module that "
                          f"blocks or loops at import?){output}")
    raise ConfigError(f"probing the job's plug-ins: the process exited with code {code} before the probe finished "
                      f"(sys.exit or os._exit at import?){output}")


def _child(answer_fd: int) -> None:
    """In the child: probe the job on stdin, write one JSON line to ``answer_fd``, then end."""
    from .config import spec_from_yaml_text
    from .plugin_probe import probe_plugins

    answer: dict[str, Any]
    try:
        spec = spec_from_yaml_text(sys.stdin.read(), "<the resolved job>")
        answer = {"lines": probe_plugins(spec.train)}
    except ConfigError as exc:
        answer = {"error": _one_line(str(exc))}
    except SystemExit as exc:
        answer = {"error": f"a plug-in called sys.exit({exc.code!r}) while it was imported or probed"}
    except BaseException as exc:  # noqa: BLE001 - the user's code: any failure is a one-line configuration error
        answer = {"error": f"a plug-in raised {type(exc).__name__}: {_one_line(str(exc))}"}
    alive = [t.name for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon
             and t.is_alive()]
    if alive and "error" not in answer:
        answer = {"threads": alive}
    with os.fdopen(answer_fd, "w", encoding="utf-8") as out:
        out.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
    os._exit(0)  # never wait for the plug-in's threads: what they are was said above


if __name__ == "__main__":
    _child(int(sys.argv[1]))
