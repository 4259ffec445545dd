"""The examples of docs/python.md run, and print what the page shows (doctest, run from the
repository root so the page's relative paths resolve)."""

import doctest

import pytest


def test_the_python_page_runs_as_shown(root, monkeypatch):
    monkeypatch.chdir(root)
    failed, attempted = doctest.testfile(
        str(root / "docs" / "python.md"),
        module_relative=False,
        optionflags=doctest.ELLIPSIS,
        verbose=False,
    )
    assert attempted >= 20, f"only {attempted} examples found"
    assert failed == 0, f"{failed} of {attempted} examples of docs/python.md differ (above)"


def test_python_m_vramlab_runs_the_binary_or_says_how(cli, monkeypatch, capsys):
    from vramlab import __main__ as main

    monkeypatch.setenv("VRAMLAB_BIN", "/nonexistent/vramlab")
    assert main.main(["--version"]) == 127
    assert "cargo install --locked --path ." in capsys.readouterr().err
    monkeypatch.setenv("VRAMLAB_BIN", cli)
    assert main.main(["presets", "--json"]) == 0


def test_bad_types_and_batches_name_the_setting():
    import vramlab

    with pytest.raises(TypeError, match="seq: expected a whole number"):
        vramlab.plan(model="gpt2", batch=2, seq="1024")
    with pytest.raises(ValueError, match="batch: must be at least 1, got 0"):
        vramlab.plan(model="gpt2", batch=0)
    with pytest.raises(ValueError, match="batch: must be at least 1, got -3"):
        vramlab.plan(model="gpt2", batch=-3)
    with pytest.raises(ValueError, match="--batch is required"):
        vramlab.plan(model="gpt2")
    with pytest.raises(ValueError, match="--model or --config is required"):
        vramlab.plan(batch=2)
