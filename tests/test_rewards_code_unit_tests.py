"""``code_unit_tests``: Python solutions run against test cases in the sandbox (docs/rewards.md).

Every test runs real interpreters, no mocks; the hostile ones use limits of 1-2 s and
check that the test process itself is untouched afterwards (its children, its memory,
its files). Expectations are counted by hand from the cases.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import tempfile
import time

import pytest

import rewards
from rewards.code_unit_tests import (
    KINDS,
    check_options,
    code_unit_tests,
    extract_code,
    load_test_cases,
)
from rewards.context import RewardContext
from rlkit.registry import REWARDS
from rlkit.tools.python_sandbox import (
    PythonSandbox,
    _reachable_by_others,
    is_alive,
    session_members,
)

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the sandbox reads /proc and uses rlimits"
)

ADD = json.dumps({"inputs": ["1 2\n", "5 7\n", "10 -3\n"], "outputs": ["3\n", "12\n", "7\n"]})
ADD_SOLUTION = "a, b = map(int, input().split())\nprint(a + b)\n"
ONE_CASE = json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]})
FAST = {"case_timeout_s": 1.5, "total_timeout_s": 4.0}


def fenced(code: str, language: str = "python") -> str:
    return f"Here is my solution.\n\n```{language}\n{code}```\n\nIt reads the input."


def failures(result: dict) -> dict[str, float]:
    """The non-zero ``code/<kind>`` counts."""
    return {k: v for k, v in result.items() if k.startswith("code/") and v}


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


@pytest.fixture
def host_unchanged(tmp_path, monkeypatch):
    """Runs the test in ``tmp_path`` and checks that nothing of this process changed."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "secret.txt").write_text("hunter2\n")
    os.chmod(tmp_path / "secret.txt", 0o600)
    monkeypatch.setenv("RLKIT_TEST_SECRET", "hunter2")
    children = my_children()
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    yield tmp_path
    assert my_children() == children
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_kib < 100 * 1024
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret.txt"]
    assert (tmp_path / "secret.txt").read_text() == "hunter2\n"
    assert os.environ["RLKIT_TEST_SECRET"] == "hunter2"


@pytest.fixture
def other_user_python():
    """An interpreter the sandbox can run as ``nobody`` (the caller must be root)."""
    if os.geteuid() != 0:
        pytest.skip("as a non-root user the code runs as that user and may read its files")
    for exe in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(exe) and _reachable_by_others(exe):
            return exe
    pytest.skip("no interpreter other users can run, so the code would run as root")


@pytest.fixture
def report_dir(monkeypatch):
    """A folder any user may write, where hostile code leaves its session id.

    Only the process mode lets the code write outside its scratch directory and shows
    host session ids, so the tests using this folder run in that mode (the boundary
    suite, tests/test_sandbox_boundary.py, covers bubblewrap).
    """
    monkeypatch.setenv("RLKIT_SANDBOX_ISOLATION", "process")
    path = tempfile.mkdtemp(prefix="rlkit-code-reward-test-")
    os.chmod(path, 0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def assert_session_gone(report_dir: str) -> None:
    with open(os.path.join(report_dir, "sid")) as f:
        sid = int(f.read())
    assert [p for p in session_members(sid) if is_alive(p)] == []


# -- scoring ------------------------------------------------------------------------
def test_a_correct_stdin_solution_scores_one():
    result = code_unit_tests(fenced(ADD_SOLUTION), ADD)
    assert result["score"] == 1.0 and result["acc"] == 1.0
    assert (result["tests_passed"], result["tests_total"]) == (3, 3)
    assert failures(result) == {} and result["failure"] == ""
    assert set(result) == {"score", "acc", "tests_passed", "tests_total", "failure"} | {
        f"code/{kind}" for kind in KINDS
    }


def test_a_partly_correct_solution_scores_the_fraction_passed():
    # Right on 1+2 and 5+7; 10 + -3 prints 0 instead of 7: 2 of 3.
    code = "a, b = map(int, input().split())\nprint(a + b if a < 10 else 0)\n"
    result = code_unit_tests(fenced(code), ADD)
    assert result["score"] == pytest.approx(2 / 3) and result["acc"] == 0.0
    assert result["tests_passed"] == 2 and failures(result) == {"code/wrong_answer": 1.0}
    assert result["failure"] == "case 3: wrong_answer: expected '7\\n', got '0\\n'"
    strict = code_unit_tests(fenced(code), ADD, all_or_nothing=True)
    assert (strict["score"], strict["acc"], strict["tests_passed"]) == (0.0, 0.0, 2)


def test_all_or_nothing_stops_at_the_first_failure():
    # Wrong on the first case already: the other two are not run.
    result = code_unit_tests(fenced("print(0)\n"), ADD, all_or_nothing=True)
    assert result["score"] == 0.0
    assert failures(result) == {"code/wrong_answer": 1.0, "code/not_run": 2.0}
    assert result["tests_passed"] + sum(failures(result).values()) == result["tests_total"]


def test_assert_style_cases_from_extra_info():
    tests = {
        "test_cases": {
            "asserts": [
                "assert square(3) == 9",
                "assert square(-2) == 4",
                "def check(f):\n    assert f(0) == 0\n    assert f(10) == 100\ncheck(square)",
            ]
        }
    }
    good = "def square(x):\n    return x * x\n"
    result = code_unit_tests(fenced(good), "", extra_info=tests)
    assert (result["score"], result["tests_passed"]) == (1.0, 3)
    # abs(x) * 2 is right for -2 (4) and 0 (0) only: the first and third cases fail.
    wrong = "def square(x):\n    return abs(x) * 2\n"
    result = code_unit_tests(fenced(wrong), "", extra_info=tests)
    assert result["score"] == pytest.approx(1 / 3)
    assert failures(result) == {"code/wrong_answer": 2.0}
    assert result["failure"] == "case 1: wrong_answer: AssertionError"
    # extra_info wins over the ground truth; a JSON string works there too.
    as_text = {"test_cases": json.dumps(tests["test_cases"])}
    assert code_unit_tests(good, ADD, extra_info=as_text)["tests_total"] == 3


def test_both_styles_in_one_object_and_a_runtime_error():
    spec = json.dumps({"inputs": ["4\n"], "outputs": ["16\n"], "asserts": ["assert f(5) == 25"]})
    code = "def f(x):\n    return x * x\nif __name__ == '__main__':\n    print(f(int(input())))\n"
    # The assert case has no stdin: input() raises EOFError there.
    result = code_unit_tests(code, spec)
    assert (result["tests_passed"], result["tests_total"]) == (1, 2)
    assert failures(result) == {"code/runtime_error": 1.0}
    assert result["failure"].startswith("case 2: runtime_error: EOFError")


def test_no_code_scores_zero_with_its_reason():
    for response in ("```cpp\nint main() { return 0; }\n```", "", "   \n"):
        result = code_unit_tests(response, ADD)
        assert (result["score"], result["acc"], result["tests_passed"]) == (0.0, 0.0, 0)
        assert failures(result) == {"code/no_code": 3.0}


def test_a_syntax_error_is_counted_once_per_case_and_run_once():
    start = time.monotonic()
    result = code_unit_tests(fenced("def solve(:\n    pass\n"), ADD)
    assert failures(result) == {"code/syntax_error": 3.0}
    assert result["failure"] == "case 1: syntax_error: SyntaxError: invalid syntax"
    assert time.monotonic() - start < 2.0


def test_output_comparison_modes_and_exit():
    spec = json.dumps({"inputs": [""], "outputs": ["1 2\n3\n"]})
    spaced = "print('1  2   ')\nprint()\nprint(3)\n"  # other spacing, a blank line between
    trailing = "import sys\nsys.stdout.write('1 2   \\n3\\n\\n')\n"  # trailing spaces, blank end
    assert code_unit_tests(trailing, spec)["score"] == 1.0  # "lines", the default
    assert code_unit_tests(spaced, spec)["score"] == 0.0
    assert code_unit_tests(spaced, spec, compare="tokens")["score"] == 1.0
    assert code_unit_tests(trailing, spec, compare="exact")["score"] == 0.0
    # exit() works without site, and stderr is not part of the output.
    code = "import sys\nprint('1 2')\nprint(3)\nprint('debug', file=sys.stderr)\nexit()\nprint(4)"
    assert code_unit_tests(code, spec)["score"] == 1.0
    assert code_unit_tests("print('1 2')\nprint(3)\nexit(2)\n", spec)["score"] == 0.0


def test_the_code_is_the_last_python_block():
    text = "```python\nprint(1)\n```\nor better:\n```py\nprint(2)\n```\n```text\nout\n```"
    assert extract_code(text) == "print(2)"
    assert extract_code("```\nprint(3)\n```\n```bash\nls\n```") == "print(3)"
    assert extract_code("print(4)\n") == "print(4)"  # no fence: the whole response
    assert extract_code("```js\nf()\n```") == ""
    assert extract_code("Sure.\n```python\nx = '```'\nprint(5)") == "x = '```'\nprint(5)"  # cut off


def test_the_budget_bounds_a_response_with_many_slow_cases():
    spec = json.dumps({"inputs": ["", "", ""], "outputs": ["1", "1", "1"]})
    start = time.monotonic()
    result = code_unit_tests(
        "while True:\n    pass\n", spec, case_timeout_s=1.0, total_timeout_s=1.5
    )
    elapsed = time.monotonic() - start
    # Case 1 runs 1 s, case 2 the 0.5 s left, case 3 never starts.
    assert failures(result) == {"code/timeout": 2.0, "code/not_run": 1.0}
    assert elapsed < 1.5 + 1.0


def test_cases_of_one_response_can_run_in_parallel():
    # Each case sleeps 1 s: three at a time finish well before 3 x 1 s one after another.
    spec = json.dumps({"inputs": ["1", "2", "3"], "outputs": ["1", "2", "3"]})
    code = "import time\ntime.sleep(1.0)\nprint(input())\n"
    start = time.monotonic()
    result = code_unit_tests(code, spec, parallel_cases=3, case_timeout_s=2.0)
    assert result["score"] == 1.0 and time.monotonic() - start < 2.5


# -- test-case format and options -----------------------------------------------------
@pytest.mark.parametrize(
    ("ground_truth", "message"),
    [
        ("not json", "is not JSON"),
        ("[1, 2]", "must be an object"),
        ('{"inputs": ["1"], "outputs": []}', "1 inputs but 0 outputs"),
        ('{"inputs": ["1"]}', "needs both 'inputs' and 'outputs'"),
        ('{"inputs": [[1]], "outputs": ["1"]}', "must be a string"),
        ('{"fn_name": "f", "inputs": [[1]], "outputs": [1]}', "call-based"),
        ('{"asserts": []}', "no test cases"),
    ],
)
def test_malformed_test_cases_raise_a_clear_error(ground_truth, message):
    with pytest.raises(ValueError, match=message):
        load_test_cases(ground_truth)


def test_bad_options_raise_value_errors():
    for options in (
        {"case_timeout_s": 0},
        {"case_timeout_s": "2"},
        {"memory_mb": 8},
        {"max_processes": -1},
        {"all_or_nothing": "yes"},
        {"compare": "fuzzy"},
        {"parallel_cases": 0},
        {"max_cases": 1.5},
        {"python": "/no/such/python"},
    ):
        with pytest.raises(ValueError, match="code_unit_tests: "):
            code_unit_tests("print(3)", ONE_CASE, **options)
        with pytest.raises(ValueError):
            check_options(options)
    with pytest.raises(ValueError, match="unknown options \\['timeout'\\]"):
        check_options({"timeout": 2})
    check_options({"case_timeout_s": 2, "memory_mb": 256, "all_or_nothing": True, "max_cases": 5})


def test_options_are_checked_before_training():
    # check_registered_names (rlkit/trainer/config/names.py) calls the entry's check_options
    # with DataConfig.reward_options before the model loads.
    check = REWARDS.entry("code_unit_tests").extra["check_options"]
    assert check is check_options
    check({"case_timeout_s": 2.0})
    with pytest.raises(ValueError, match="unknown options"):
        check({"time_limit": 2.0})


def test_max_cases_runs_the_first_cases_only():
    result = code_unit_tests(ADD_SOLUTION, ADD, max_cases=2)
    assert (result["tests_passed"], result["tests_total"]) == (2, 2)


# -- hostile solutions --------------------------------------------------------------
def test_an_infinite_loop_times_out(host_unchanged):
    start = time.monotonic()
    result = code_unit_tests("while True:\n    pass\n", ONE_CASE, case_timeout_s=1.0)
    assert result["score"] == 0.0 and failures(result) == {"code/timeout": 1.0}
    assert time.monotonic() - start < 1.0 + 3.0  # unstopped, the loop would run forever


def test_a_fork_bomb_is_stopped_and_leaves_nothing(host_unchanged, report_dir):
    code = f"""
import os, time
open({os.path.join(report_dir, "sid")!r}, "w").write(str(os.getsid(0)))
for _ in range(1000):
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
print(3)
"""
    start = time.monotonic()
    result = code_unit_tests(code, ONE_CASE, max_processes=4, **FAST)
    assert result["score"] == 0.0 and failures(result) == {"code/processes": 1.0}
    assert time.monotonic() - start < 1.5  # stopped by the process limit, before the case's 1.5 s
    assert_session_gone(report_dir)


def test_a_classic_fork_bomb_as_nobody(host_unchanged, other_user_python, report_dir):
    code = f"""
import os
open({os.path.join(report_dir, "sid")!r}, "w").write(str(os.getsid(0)))
while True:
    os.fork()
"""
    result = code_unit_tests(code, ONE_CASE, python=other_user_python, max_processes=4, **FAST)
    # RLIMIT_NPROC refuses forks; the run ends when the first process's fork fails, or at
    # the time limit should that process keep winning the race for the free slots.
    assert result["score"] == 0.0
    assert failures(result) in ({"code/processes": 1.0}, {"code/timeout": 1.0})
    assert_session_gone(report_dir)


def test_allocating_10_gb_fails_with_a_memory_error(host_unchanged):
    code = "data = bytearray(10 * 1024 ** 3)\nprint(3)\n"
    result = code_unit_tests(code, ONE_CASE, memory_mb=512, **FAST)
    assert result["score"] == 0.0 and failures(result) == {"code/memory": 1.0}
    assert result["failure"] == "case 1: memory: MemoryError"


def test_the_callers_environment_and_working_directory_are_not_visible(host_unchanged):
    # If the code could see them it would print the expected secret and pass.
    secret = json.dumps({"inputs": [""], "outputs": ["hunter2"]})
    env = "import os\nprint(os.environ['RLKIT_TEST_SECRET'])\n"
    result = code_unit_tests(env, secret, **FAST)
    assert result["score"] == 0.0 and failures(result) == {"code/runtime_error": 1.0}
    assert result["failure"] == "case 1: runtime_error: KeyError: 'RLKIT_TEST_SECRET'"
    relative = "print(open('secret.txt').read())\n"
    result = code_unit_tests(relative, secret, **FAST)
    assert result["score"] == 0.0 and failures(result) == {"code/runtime_error": 1.0}
    assert "FileNotFoundError" in result["failure"]
    # Files it writes land in its scratch directory, which is removed.
    scratch = "open('secret.txt', 'w').write('overwritten')\nprint(open('secret.txt').read())\n"
    assert code_unit_tests(scratch, secret, **FAST)["score"] == 0.0


def test_the_callers_files_are_out_of_reach_as_nobody(host_unchanged, other_user_python):
    folder = host_unchanged
    secret = json.dumps({"inputs": [""], "outputs": ["hunter2"]})
    read = f"print(open({str(folder / 'secret.txt')!r}).read())\n"
    # Refused as nobody; under bubblewrap the caller's /tmp is not even there.
    refused = ("PermissionError", "FileNotFoundError", "Read-only file system")
    result = code_unit_tests(read, secret, python=other_user_python, **FAST)
    assert result["score"] == 0.0 and failures(result) == {"code/runtime_error": 1.0}
    assert any(word in result["failure"] for word in refused), result["failure"]
    write = f"open({str(folder / 'planted.txt')!r}, 'w').write('x')\nprint('hunter2')\n"
    result = code_unit_tests(write, secret, python=other_user_python, **FAST)
    assert result["score"] == 0.0
    assert any(word in result["failure"] for word in refused), result["failure"]


def test_closing_stdout_fails_the_case(host_unchanged):
    for code in (
        "import sys\nsys.stdout.close()\nprint(3)\n",
        "import os\nos.close(1)\nos.close(2)\nprint(3)\n",
    ):
        result = code_unit_tests(code, ONE_CASE, **FAST)
        assert result["score"] == 0.0 and failures(result) == {"code/runtime_error": 1.0}


def test_a_background_child_that_leaves_the_session_is_killed(host_unchanged, report_dir):
    pid_file = os.path.join(report_dir, "pid")
    code = (
        "import subprocess, sys\n"
        "p = subprocess.Popen([sys.executable, '-S', '-c', 'import time; time.sleep(60)'],"
        " start_new_session=True)\n"
        f"open({pid_file!r}, 'w').write(str(p.pid))\n"
        "print(3)\n"
    )
    assert code_unit_tests(code, ONE_CASE, **FAST)["score"] == 1.0
    with open(pid_file) as f:
        pid = int(f.read())
    deadline = time.monotonic() + 2
    while is_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not is_alive(pid)


# -- batch scoring ----------------------------------------------------------------------
MIX = [
    fenced(ADD_SOLUTION),
    "a, b = map(int, input().split())\nprint(a - b)\n",  # right on none
    "print(1 / 0)\n",
    "no code here, just words",
    fenced("import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)\n"),
]
MIX_SCORES = [1.0, 0.0, 0.0, 0.0, 1.0]  # "just words" is run as code: a syntax error


def test_score_batch_with_two_worker_processes_matches_in_process_scoring():
    contexts = [RewardContext(response=r, ground_truth=ADD) for r in MIX]
    options = {"case_timeout_s": 2.0, "total_timeout_s": 5.0}
    inline = rewards.score_batch(
        "code_unit_tests", MIX, [ADD] * len(MIX), [options] * len(MIX), contexts=contexts
    )
    pooled = rewards.score_batch(
        "code_unit_tests",
        MIX,
        [ADD] * len(MIX),
        [options] * len(MIX),
        contexts=contexts,
        num_workers=2,
        timeout_s=10.0,
    )
    assert inline.scores == pooled.scores == MIX_SCORES
    assert inline.infos == pooled.infos and inline.num_errors == pooled.num_errors == 0
    metrics = pooled.metrics()
    assert metrics["reward/code/syntax_error"] == pytest.approx(3 / 5)  # 3 cases, 5 rows
    assert metrics["reward/tests_passed"] == pytest.approx(6 / 5)


def test_score_batch_time_limit_interrupts_a_case_and_cleans_up(host_unchanged):
    # The scorer's SIGALRM limit (0.5 s) ends the reward inside a 5 s case.
    start = time.monotonic()
    out = rewards.score_batch(
        "code_unit_tests",
        ["import time\ntime.sleep(30)\n"],
        [ONE_CASE],
        [{"case_timeout_s": 5.0}],
        timeout_s=0.5,
    )
    assert out.scores == [0.0] and out.num_timeouts == 1
    assert time.monotonic() - start < 4.0  # inside the case's own 5 s


def test_a_data_bug_is_counted_as_a_reward_error():
    out = rewards.score_batch("code_unit_tests", ["print(1)"], ["{not json"])
    assert out.scores == [0.0] and out.num_errors == 1 and "not JSON" in out.infos[0]["error"]


# -- what the sandbox gained for this reward ---------------------------------------------
def test_the_sandbox_passes_stdin_and_keeps_stderr_apart():
    box = PythonSandbox(separate_stderr=True, echo_last_expression=False, timeout_s=5.0)
    code = "import sys\nn = int(input())\nprint(n + sum(map(int, sys.stdin.read().split())))\n"
    code += "print('to stderr', file=sys.stderr)\nsys.stdout.write('end\\n')"
    result = box.run(code, stdin="5\n1 2 3\n")
    assert (result.status, result.output, result.stderr) == ("ok", "11\nend\n", "to stderr\n")
    whole = box.run("print(sorted(open(0).read().split()))", stdin=b"b a\nc")
    assert whole.output == "['a', 'b', 'c']\n"
    assert (
        box.run("print(repr(input()))")
        .stderr.rstrip()
        .endswith("EOFError: EOF when reading a line")
    )
    # The notebook echo is still the default, and stderr is interleaved there.
    echo = PythonSandbox(timeout_s=5.0).run("import sys\nprint('a', file=sys.stderr)\n6 * 7")
    assert (echo.output, echo.stderr) == ("a\n42\n", "")


def test_the_sandbox_reports_a_memory_error_as_its_own_reason():
    result = PythonSandbox(memory_bytes=256 << 20, timeout_s=5.0).run("x = bytearray(1 << 30)")
    assert (result.status, result.reason) == ("error", "memory")
    assert result.output.rstrip().endswith("MemoryError")
