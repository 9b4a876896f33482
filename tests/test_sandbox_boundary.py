"""Hostile code against the sandbox: the boundary holds, and the host is left as it was.

Each case runs real code in every isolation mode this machine offers (``process``
always; ``bubblewrap`` where it works) and checks what that mode guarantees
(docs/tools.md, "What the sandbox blocks"). The code reward runs the same sandbox and
is checked for the escapes too. Every run is bounded by a few seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import tempfile
import time

import pytest

from rewards.code_unit_tests import code_unit_tests
from rlkit.tools.isolation import isolation_mode
from rlkit.tools.python_sandbox import CALL_UIDS, PythonSandbox, SandboxResult, is_alive

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the sandbox reads /proc and uses rlimits"
)

ROOT = os.geteuid() == 0
MODES = ["process"] + (["bubblewrap"] if isolation_mode() == "bubblewrap" else [])


@pytest.fixture(params=MODES)
def box(request) -> PythonSandbox:
    return PythonSandbox(isolation=request.param, timeout_s=5, max_processes=8)


def run(box: PythonSandbox, code: str, timeout_s: float = 5) -> SandboxResult:
    start = time.monotonic()
    result = box.run(code, timeout_s=timeout_s)
    assert time.monotonic() - start < timeout_s + 3
    assert result.mode == box.mode()
    return result


def marked_processes(marker: str) -> list[int]:
    """Live processes carrying a call's ``RLKIT_SANDBOX_ID`` marker."""
    needle = f"RLKIT_SANDBOX_ID={marker}".encode()
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read().split(b"\0") and is_alive(int(name)):
                    found.append(int(name))
        except OSError:
            continue
    return found


def test_the_mode_line_names_the_mode_and_its_guarantees():
    from rlkit.tools.isolation import GUARANTEES, describe_isolation

    line = describe_isolation()
    assert line.startswith(isolation_mode()) and line.endswith(GUARANTEES[isolation_mode()])


def test_the_mode_in_use_is_reported(box):
    result = run(box, "print('hi')")
    assert result.status == "ok" and result.mode in ("process", "bubblewrap")
    if ROOT and result.mode == "bubblewrap":
        assert result.uid == 65534  # root's code runs as nobody inside the namespaces
    elif ROOT:  # without them, as a user of its own per call, not nobody
        first, count = CALL_UIDS
        assert first <= result.uid < first + count


@pytest.mark.skipif(not ROOT, reason="only root can read /etc/shadow to begin with")
def test_etc_shadow_is_refused_or_empty(box):
    code = "try:\n    print(repr(open('/etc/shadow').read()))\nexcept OSError as e:\n    print('refused')"
    assert run(box, code).output.strip() in ("refused", "''")


def test_the_callers_environment_cannot_be_read_through_proc(box, monkeypatch):
    monkeypatch.setenv("RLKIT_BOUNDARY_SECRET", "hunter2")
    code = (
        "import os\n"
        "try:\n    print(open(f'/proc/{os.getppid()}/environ', 'rb').read())\n"
        "except OSError as e:\n    print('refused', type(e).__name__)"
    )
    result = run(box, code)
    assert "hunter2" not in result.output
    if ROOT or box.mode() == "bubblewrap":
        assert result.output.startswith("refused")


def test_writes_outside_the_scratch_directory_fail(box, tmp_path):
    target = tmp_path / "escaped"  # a root-owned directory of the host (0700)
    name = f"rlkit-escaped-{os.getpid()}"
    up = os.path.join(tempfile.gettempdir(), name)  # where ../.. of the scratch dir is
    code = (
        "import os\n"
        f"for path in ({str(target)!r}, '../../{name}', '/{name}'):\n"
        "    try:\n        open(path, 'w').write('x'); print('wrote', path)\n"
        "    except OSError:\n        print('refused', path)"
    )
    try:
        result = run(box, code)
        assert f"refused {target}" in result.output or not ROOT
        assert not target.exists() or not ROOT
        assert not os.path.exists(f"/{name}")
        if box.mode() == "bubblewrap":  # ../.. is the host's world-writable /tmp without it
            assert f"refused ../../{name}" in result.output
            assert not os.path.exists(up)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(up)


def test_a_listener_on_localhost_cannot_be_reached(box):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.5)
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')\n"
            "except OSError as e:\n    print('refused', type(e).__name__)"
        )
        result = run(box, code)
    # The process mode does not isolate the network (documented): nothing to assert.
    if box.mode() == "bubblewrap":
        assert result.output.startswith("refused"), result.output


def test_a_setsid_child_is_gone_after_the_call(box):
    code = (
        "import os, sys, subprocess\n"
        "subprocess.Popen([sys.executable, '-S', '-c', 'import time; time.sleep(60)'],"
        " start_new_session=True)\n"
        "print(os.environ['RLKIT_SANDBOX_ID'])"
    )
    result = run(box, code)
    assert result.status == "ok", result.output
    deadline = time.monotonic() + 2
    while marked_processes(result.output.strip()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert marked_processes(result.output.strip()) == []


@pytest.mark.skipif(not ROOT, reason="without root the fallback runs as the caller's user")
def test_killing_the_parent_does_not_kill_the_caller(box):
    result = run(box, "import os\nos.kill(os.getppid(), 9)\nprint('sent')")
    assert os.getpid() > 0 and result.status in ("ok", "error")  # we are still here
    assert run(box, "print('still works')").output.strip() == "still works"


@pytest.mark.skipif(not ROOT, reason="RLIMIT_NPROC needs a user of its own (root)")
def test_a_fork_bomb_with_setsid_children_is_bounded_and_cleaned_up(box):
    code = (
        "import os, time\n"
        "print(os.environ['RLKIT_SANDBOX_ID'], flush=True)\n"
        "forked = 0\n"
        "for _ in range(100):\n"
        "    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n"
        "    if pid == 0:\n        os.setsid(); time.sleep(60); os._exit(0)\n"
        "    forked += 1\n"
        "print('forked', forked, flush=True)"
    )
    result = run(box, code)
    marker, _, forked = result.output.split()
    assert int(forked) <= 8
    assert marked_processes(marker) == []


def test_a_memory_hog_is_limited(box):
    result = run(box, "data = bytearray(4 << 30)\nprint(len(data))")
    assert result.status == "error" and result.reason == "memory"


def test_the_code_reward_holds_the_same_boundary(tmp_path):
    # The reward's solution tries the escapes and prints what happened; the expected
    # output is what a held boundary prints.
    target = tmp_path / "escaped"
    solution = (
        "```python\n"
        "import os\n"
        "try:\n    os.kill(os.getppid(), 9)\nexcept OSError:\n    pass\n"
        "try:\n    open('/etc/shadow').read() and print('shadow')\nexcept OSError:\n    pass\n"
        f"try:\n    open({str(target)!r}, 'w').write('x')\nexcept OSError:\n    pass\n"
        "print('done')\n"
        "```"
    )
    cases = json.dumps({"inputs": [""], "outputs": ["done\n"]})
    result = code_unit_tests(solution, cases, case_timeout_s=5)
    assert result["score"] == 1.0, result["failure"]
    assert not target.exists() or not ROOT


@pytest.mark.skipif(not ROOT, reason="without root every call runs as the caller's user")
def test_kill_minus_one_in_one_call_spares_a_call_running_beside_it(box):
    import threading

    survivor: list[SandboxResult] = []
    waiting = threading.Thread(
        target=lambda: survivor.append(
            run(box, "import time\ntime.sleep(2.5)\nprint('alive')", timeout_s=10)
        )
    )
    waiting.start()
    time.sleep(1.0)  # the first call is running
    killer = run(box, "import os, signal\nos.kill(-1, signal.SIGKILL)\nprint('sent')")
    waiting.join()
    assert killer.status in ("ok", "error")
    assert survivor[0].status == "ok" and survivor[0].output.strip() == "alive", survivor[0]
