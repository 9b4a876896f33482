"""``rlkit doctor`` prints the platform, versions and the kernel per op with its reason."""

import pytest

import rlkit.device
from rlkit.cli import main as cli_main
from rlkit.device import CPUPlatform
from rlkit.doctor import main


@pytest.fixture(autouse=True)
def _fresh_platform():
    rlkit.device.reset()
    yield
    rlkit.device.reset()


def test_doctor_reports_platform_versions_and_kernel_per_op(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "platform        cpu (detected)" in out
    assert "dist backend    gloo" in out
    assert "torch=" in out and "transformers=" in out and "torch_npu=not installed" in out
    # One row per op with the kernel CPU gets and why.
    for op, kernel in [
        ("rms_norm", "hf"),
        ("rotary", "hf"),
        ("swiglu", "hf"),
        ("attention", "grouped_sdpa"),
        ("logprobs", "chunked"),
    ]:
        row = next(line for line in out.splitlines() if line.startswith(op + " "))
        assert row.split()[1] == kernel
        assert "highest-priority available on cpu" in row


def test_doctor_all_lists_every_candidate_with_its_status(capsys):
    assert main(["--all"]) == 0
    out = capsys.readouterr().out
    assert "npu_rms_norm" in out and "runs only on npu, not cpu" in out
    assert "*chunked" in out  # the chosen one is marked


def test_doctor_for_an_absent_platform_says_it_is_not_available(capsys):
    assert main(["--platform", "npu"]) == 0
    out = capsys.readouterr().out
    assert "not available here: package 'torch_npu' is not installed" in out
    assert "no rms_norm kernel can run on platform 'npu'" in out


def test_doctor_for_a_simulated_platform_shows_its_choice(capsys, monkeypatch):
    class FakeNPU(CPUPlatform):
        name = "npu"

    import rlkit.kernels.availability as availability

    monkeypatch.setattr(availability, "package_available", lambda name: True)
    monkeypatch.setitem(rlkit.device.selection._INSTANCES, "npu", FakeNPU())
    assert main(["--platform", "npu"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("rms_norm "))
    assert row.split()[1] == "npu_rms_norm"


def test_doctor_unknown_platform_exits_2(capsys):
    assert main(["--platform", "tpu"]) == 2
    assert "known platforms" in capsys.readouterr().out


def test_cli_dispatches_doctor(capsys):
    assert cli_main(["doctor"]) == 0
    assert "kernels on cpu:" in capsys.readouterr().out
