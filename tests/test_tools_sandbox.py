"""The ``python`` tool's sandbox: limits hold and nothing outlives a call (docs/tools.md).

Every test runs real interpreters; each stays within a few seconds of wall time.
"""

from __future__ import annotations

import ast
import os
import re
import sys
import time

import pytest

from rlkit.tools import PythonSandbox, ToolCall, ToolError, ToolTimeout, run_tool_calls
from rlkit.tools.execution import SELF_LIMIT_GRACE_S
from rlkit.tools.python_sandbox import _reachable_by_others, is_alive, session_members

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the sandbox reads /proc and uses rlimits"
)


def my_children() -> set[int]:
    """Live (non-zombie) processes whose parent is this test process."""
    me, out = os.getpid(), set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] not in (b"Z", b"X"):
            out.add(int(name))
    return out


def marked_processes(marker: str) -> list[int]:
    """Live processes carrying a call's ``RLKIT_SANDBOX_ID`` marker (readable as root)."""
    needle = f"RLKIT_SANDBOX_ID={marker}".encode()
    out = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                found = needle in f.read().split(b"\0")
        except OSError:
            continue
        if found and is_alive(int(name)):
            out.append(int(name))
    return out


def run_python(code: str, timeout_s: float = 10.0, **tools_options):
    (result,) = run_tool_calls(
        [ToolCall("python", {"code": code})], timeout_s=timeout_s, **tools_options
    )
    return result


def test_prints_and_the_last_expression():
    result = run_python("x = 6 * 7\nprint('x is', x)\nx + 1")
    assert (result.status, result.text) == ("ok", "x is 42\n43")
    assert run_python("y = 1").text == "(no output)"


def test_an_exception_returns_its_traceback_as_an_error():
    result = run_python("def f():\n    return 1 / 0\nf()")
    assert result.status == "error"
    assert 'File "<code>", line 2, in f' in result.text
    assert "return 1 / 0" in result.text and result.text.endswith(
        "ZeroDivisionError: division by zero"
    )
    assert "rlkit" not in result.text  # the bootstrap's own frames are left out
    syntax = run_python("def (:")
    assert syntax.status == "error" and "SyntaxError" in syntax.text


def test_only_the_standard_library_imports():
    result = run_python("import json, math, fractions\nprint(json.dumps([math.comb(5, 2)]))")
    assert result.text == "[10]"
    missing = run_python("import numpy")
    assert missing.status == "error" and "ModuleNotFoundError" in missing.text


def test_an_infinite_loop_is_killed_and_reported_as_a_timeout():
    start = time.monotonic()
    result = run_python("while True:\n    pass", timeout_s=1.5)
    elapsed = time.monotonic() - start
    assert result.status == "timeout"
    assert "ran longer than 1.5 s" in result.text
    assert elapsed < 1.5 + SELF_LIMIT_GRACE_S


def test_a_fork_bomb_is_contained():
    baseline = my_children()
    code = """
import os, time
print("session", os.getsid(0), flush=True)
print("marker", os.environ["RLKIT_SANDBOX_ID"], flush=True)
forked = 0
for _ in range(1000):
    try:
        pid = os.fork()
    except OSError as exc:
        print("fork refused:", exc, flush=True)
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    forked += 1
print("forked", forked, flush=True)
time.sleep(60)
"""
    sandbox = PythonSandbox(max_processes=8)
    start = time.monotonic()
    result = sandbox.run(code, timeout_s=4)
    elapsed = time.monotonic() - start
    assert elapsed < 4 + 1.0
    assert result.status in ("error", "timeout")
    assert "fork refused" in result.output or result.reason == "processes"
    session = int(re.search(r"session (\d+)", result.output).group(1))
    if result.mode == "process":  # a host session id; in a PID namespace it is not
        assert [p for p in session_members(session) if is_alive(p)] == []
    assert marked_processes(re.search(r"marker (\w+)", result.output).group(1)) == []
    assert my_children() == baseline


def test_allocating_10_gb_fails_inside_the_sandbox():
    result = run_python("data = bytearray(10 * 1024 ** 3)\nprint(len(data))")
    assert result.status == "error" and "MemoryError" in result.text
    assert run_python("print(len(bytearray(50 * 1024 ** 2)))").text == str(50 * 1024**2)


def test_the_callers_environment_does_not_reach_the_code(monkeypatch):
    monkeypatch.setenv("RLKIT_SECRET", "1")
    result = run_python(
        "import os\nprint(sorted(os.environ))\nprint(os.environ.get('RLKIT_SECRET'))"
    )
    assert result.status == "ok"
    names, secret = result.text.splitlines()
    assert "RLKIT_SECRET" not in names and secret == "None"
    assert set(ast.literal_eval(names)) <= {
        "PATH",
        "LANG",
        "HOME",
        "TMPDIR",
        "PWD",  # bubblewrap sets it to the scratch directory
        "RLKIT_SANDBOX_ID",
    }


def test_files_land_in_a_scratch_directory_that_is_removed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = (
        "import os, tempfile\n"
        "open('notes.txt', 'w').write('hello')\n"
        "t = tempfile.NamedTemporaryFile(delete=False); t.write(b'x'); t.close()\n"
        "print(os.path.abspath('notes.txt'))\n"
        "print(t.name)\n"
        "print(sorted(os.listdir('.')) == sorted(['notes.txt', os.path.basename(t.name)]))"
    )
    result = run_python(code)
    assert result.status == "ok", result.text
    notes, temp, listing = result.text.splitlines()
    scratch = os.path.dirname(notes)
    assert os.path.dirname(temp) == scratch and listing == "True"
    assert not os.path.exists(scratch) and not os.path.exists(notes)
    assert list(tmp_path.iterdir()) == []  # nothing in the caller's working directory


@pytest.mark.parametrize("new_session", [False, True])
def test_a_background_child_is_killed_with_the_call(new_session):
    baseline = my_children()
    code = (
        "import subprocess, sys\n"
        "p = subprocess.Popen([sys.executable, '-S', '-c', 'import time; time.sleep(60)'],"
        f" start_new_session={new_session})\n"
        "print(p.pid, __import__('os').environ['RLKIT_SANDBOX_ID'])"
    )
    result = run_python(code)
    assert result.status == "ok", result.text
    marker = result.text.split()[1]
    deadline = time.monotonic() + 2
    while marked_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert marked_processes(marker) == []
    assert my_children() == baseline


def test_output_is_captured_truncated_and_file_size_limited():
    result = run_python(
        "import sys\nprint('a' * 10000)\nprint('oops', file=sys.stderr)", max_output_chars=100
    )
    assert result.truncated and result.text.startswith("a" * 100 + "\n...[truncated")
    both = run_python("import sys\nprint('out')\nprint('err', file=sys.stderr)")
    assert both.text == "out\nerr"
    small = PythonSandbox(max_file_bytes=1 << 16)
    big = small.run("open('big', 'wb').write(b'x' * (1 << 20))")
    assert big.status == "error" and "File too large" in big.output


def test_direct_use_raises_tool_errors():
    from rlkit.tools.python_sandbox import make_python_tool

    tool = make_python_tool(PythonSandbox(timeout_s=1.0), name="py")
    assert tool.name == "py" and tool(code="print(2 ** 10)") == "1024"
    with pytest.raises(ToolTimeout):
        tool(code="import time\ntime.sleep(5)")
    with pytest.raises(ToolError):
        tool(code="raise SystemExit(3)")


def test_calls_run_concurrently():
    # Each call notes when it starts, waits, then notes when it ends: run at the same
    # time, every call starts before any ends (the sandboxes share only the clock).
    code = "import time\nstart = time.time()\ntime.sleep(1.0)\nprint(start, time.time())"
    calls = [ToolCall("python", {"code": code}) for _ in range(4)]
    results = run_tool_calls(calls, timeout_s=10, max_concurrency=4)
    assert [r.status for r in results] == ["ok"] * 4, [r.text for r in results]
    spans = [tuple(map(float, r.text.split())) for r in results]
    assert max(start for start, _ in spans) < min(end for _, end in spans)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_as_root_the_code_runs_as_nobody_with_a_process_limit():
    exe = next(
        (p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.path.exists(p)), None
    )
    if exe is None or not _reachable_by_others(exe):
        pytest.skip("no interpreter reachable by other users")
    sandbox = PythonSandbox(executable=exe, max_processes=4)
    result = sandbox.run(
        "import os\nprint(os.getuid())\n"
        "try:\n    open('/etc/shadow').read()\nexcept PermissionError:\n    print('denied')\n"
        "pids = []\n"
        "try:\n"
        "    for _ in range(50):\n"
        "        pid = os.fork()\n"
        "        if pid == 0:\n"
        "            import time; time.sleep(30); os._exit(0)\n"
        "        pids.append(pid)\n"
        "except OSError:\n    pass\n"
        "print(len(pids))",
        timeout_s=5,
    )
    assert result.status == "ok" and result.uid == 65534
    uid, denied, forked = result.output.split()
    assert (uid, denied) == ("65534", "denied") and int(forked) <= 4
