"""`vramlab.doctor(...).to_json()` is `vramlab doctor … --json` for the OOM messages and
snapshots of tests/data/doctor, and an exception is read as its message."""

import subprocess

import pytest

import vramlab

CASES = ["capacity", "fragmentation", "other_process", "outside", "process_cap", "no_grad_eval"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("with_snapshot", [False, True], ids=["message", "message+snapshot"])
def test_doctor_json_equals_the_cli(cli, root, case, with_snapshot):
    msg = root / "tests" / "data" / "doctor" / f"{case}.message.txt"
    snap = root / "tests" / "data" / "doctor" / f"{case}.snapshot.pickle"
    args = [cli, "doctor", "--message-file", str(msg), "--json"]
    if with_snapshot:
        args += ["--snapshot", str(snap)]
    out = subprocess.run(args, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    d = vramlab.doctor(msg.read_text(), snap if with_snapshot else None)
    assert d.to_json() + "\n" == out.stdout
    assert d.diagnosis is not None


def test_an_exception_is_read_as_its_message(root):
    text = (root / "tests" / "data" / "doctor" / "capacity.message.txt").read_text()
    line = next(l for l in text.splitlines() if "out of memory" in l)
    body = line.split("OutOfMemoryError: ", 1)[-1]

    class OutOfMemoryError(RuntimeError):
        pass

    from_exception = vramlab.doctor(OutOfMemoryError(body))
    assert from_exception.diagnosis == vramlab.doctor(text).diagnosis
    assert from_exception.remedies


def test_no_message_is_refused_with_what_to_give():
    with pytest.raises(ValueError, match="out of memory"):
        vramlab.doctor("RuntimeError: something else")
    with pytest.raises(ValueError, match="give the OOM message"):
        vramlab.doctor()
    with pytest.raises(OSError):
        vramlab.doctor(snapshot="/nonexistent.pickle")
