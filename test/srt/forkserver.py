"""A fork server for the tests that need a fresh plugin load.

Started once per test session as its own interpreter
(``python forkserver.py``): it imports the SGLang modules those tests touch
(importing SGLang is what makes a fresh interpreter cost 20-60 s on these
machines) and nothing of the plugin, then serves requests on stdin, one JSON
line each: ``{"code": ..., "env": {...}, "timeout": s}``. For each it forks
a child that runs ``code`` as ``python -c`` would (``__name__`` is
``"__main__"``, ``SystemExit`` sets the exit status, an uncaught exception
prints its traceback and exits 1) with its stdout and stderr in files, and
answers one JSON line ``{"returncode", "stdout", "stderr"}``. A child past
its timeout is killed (returncode -9).

So every run starts where ``sglang serve`` starts: SGLang imported, no
plugin loaded, nothing hooked; and no run sees another's state.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
import traceback

#: What the fresh-load tests import; whatever a release lacks is skipped.
PRELOAD = (
    "torch",
    "torch.distributed",
    "sglang.srt.plugins",
    "sglang.srt.plugins.hook_registry",
    "sglang.srt.speculative.dspark_components.dspark_draft",
    "sglang.srt.speculative.dspark_components.dspark_worker_v2",
    "sglang.srt.managers.scheduler_components.dp_attn",
    "sglang.srt.managers.scheduler",
)


def _preload() -> None:
    import importlib
    import warnings

    warnings.filterwarnings("ignore")
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # a release without it: the child imports it (or not)
            pass
    loaded = sorted(m for m in sys.modules if m.startswith("sglang_dspark_dp"))
    if loaded:
        raise SystemExit(
            f"forkserver: importing SGLang loaded the plugin already ({loaded}); "
            "its children would not start without it"
        )
    warnings.resetwarnings()


def _child(code: str, env: dict[str, str], out: str, err: str) -> None:
    fd_out = os.open(out, os.O_WRONLY | os.O_TRUNC)
    fd_err = os.open(err, os.O_WRONLY | os.O_TRUNC)
    os.dup2(fd_out, 1)
    os.dup2(fd_err, 2)
    os.environ.pop("SGLANG_PLUGINS", None)
    os.environ.update(env)
    status = 0
    try:
        exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
    except SystemExit as exc:
        if exc.code is None:
            status = 0
        elif isinstance(exc.code, int):
            status = exc.code
        else:
            print(exc.code, file=sys.stderr)
            status = 1
    except BaseException:
        traceback.print_exc()
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(status)


def _wait(pid: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -9
        time.sleep(0.02)


def serve() -> None:
    _preload()
    reply = os.fdopen(os.dup(1), "w")
    print(json.dumps({"ready": os.getpid()}), file=reply, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        with tempfile.TemporaryDirectory() as tmp:
            out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
            for path in (out, err):
                open(path, "w").close()
            pid = os.fork()
            if pid == 0:
                os.setpgid(0, 0)  # its own group: a timeout kills its ranks too
                _child(request["code"], request.get("env") or {}, out, err)
            returncode = _wait(pid, float(request.get("timeout", 240)))
            with (
                open(out, errors="replace") as f_out,
                open(err, errors="replace") as f_err,
            ):
                answer = {
                    "returncode": returncode,
                    "stdout": f_out.read(),
                    "stderr": f_err.read(),
                }
        print(json.dumps(answer), file=reply, flush=True)


if __name__ == "__main__":
    serve()
