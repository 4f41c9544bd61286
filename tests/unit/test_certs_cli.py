"""``powertrip certs`` refuses what it cannot do well in one line (exit 2), never a traceback and
never a useless result (``--days 0`` used to write certificates that were already expired)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from powertrip.services.cli.main import main as powertrip


def certs(*args: str):
    return CliRunner().invoke(powertrip, ["certs", *args])


def refused(result, *words: str) -> None:
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)  # a click error, not a traceback
    assert "Traceback" not in result.output
    for w in words:
        assert w in result.output


@pytest.mark.parametrize("days", ["0", "-5"])
def test_a_lifetime_under_one_day_is_refused(tmp_path, days):
    refused(certs("--out", str(tmp_path), "--workers", "w0", "--days", days), "--days", ">=1")
    refused(certs("--out", str(tmp_path), "--workers", "w0", "--ca-days", days), "--ca-days")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("workers", "words"),
    [
        ("", ("at least one worker",)),
        (" , ,", ("at least one worker",)),
        ("w0,bad id", ("bad worker id", "'bad id'")),
        ("w0,x/../y", ("bad worker id",)),
        ("aggregator", ("collide",)),
    ],
)
def test_bad_worker_lists_are_refused_before_anything_is_written(tmp_path, workers, words):
    refused(certs("--out", str(tmp_path / "out"), "--workers", workers), "--workers", *words)
    assert not (tmp_path / "out" / "ca.pem").exists()


def test_workers_are_required_unless_renewing(tmp_path):
    refused(certs("--out", str(tmp_path)), "at least one worker")


def test_an_out_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "certs"
    f.write_text("not a folder")
    refused(certs("--out", str(f), "--workers", "w0"), "--out", "is a file")
    refused(certs("--out", str(f / "sub"), "--workers", "w0"), "--out", "cannot write")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_out_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    refused(certs("--out", str(locked / "certs"), "--workers", "w0"), "cannot write")


def test_an_unwritable_out_is_refused_even_for_root(tmp_path):
    refused(certs("--out", "/proc/powertrip-certs", "--workers", "w0"), "--out", "cannot write")


def test_host_is_gone_with_a_reason(tmp_path):
    r = certs("--out", str(tmp_path), "--workers", "w0", "--host", "powertrip-aggregator")
    refused(r, "--host is gone", "identity name")
    assert not (tmp_path / "ca.pem").exists()


def test_renewal_needs_a_kept_ca(tmp_path: Path):
    refused(certs("--out", str(tmp_path), "--renew"), "no ca.pem")
    (tmp_path / "ca.pem").write_text("an old folder minted before the CA key was kept")
    refused(certs("--out", str(tmp_path), "--renew"), "no ca.key")
    refused(certs("--out", str(tmp_path), "--workers", "w1"), "no ca.key")


def test_renewal_takes_no_worker_list(tmp_path):
    assert certs("--out", str(tmp_path), "--workers", "w0").exit_code == 0
    refused(certs("--out", str(tmp_path), "--renew", "--workers", "w1"), "--renew")


def test_renewal_refuses_a_certificate_whose_name_is_not_an_id(tmp_path):
    """--renew writes NAME.pem for each certificate's CN: a stray one named '../x' must not
    make it write outside OUT."""
    from powertrip.services.cli.certs import issue, load_authority

    assert certs("--out", str(tmp_path / "out"), "--workers", "w0").exit_code == 0
    cert, _ = issue(load_authority(tmp_path / "out"), "../escaped")
    (tmp_path / "out" / "stray.pem").write_bytes(cert)
    refused(certs("--out", str(tmp_path / "out"), "--renew"), "bad identity in stray.pem")
    assert not (tmp_path / "escaped.pem").exists()
