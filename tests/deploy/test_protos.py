"""The checked-in stubs are exactly what the pinned grpcio-tools generates (no drift)."""

from __future__ import annotations

import filecmp
from pathlib import Path

import grpc_tools
from grpc_tools import protoc

REPO = Path(__file__).resolve().parents[2]
PROTOS = REPO / "protos"
WKT = Path(grpc_tools.__file__).parent / "_proto"


def test_generated_stubs_match_the_proto_sources(tmp_path):
    sources = sorted(str(p.relative_to(PROTOS)) for p in (PROTOS / "powertrip/v1").glob("*.proto"))
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{PROTOS}",
            f"-I{WKT}",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            *sources,
        ]
    )
    assert rc == 0
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.py*"))
    assert generated, "protoc produced nothing"
    stale = [str(p) for p in generated if not filecmp.cmp(tmp_path / p, REPO / p, shallow=False)]
    regen = (
        "cd protos && python -m grpc_tools.protoc -I. --python_out=.. --pyi_out=.. "
        "--grpc_python_out=.. powertrip/v1/*.proto"
    )
    assert not stale, f"regenerate the stubs ({regen}): {stale}"
    checked_in = sorted(p.relative_to(REPO) for p in (REPO / "powertrip/v1").glob("*_pb2*"))
    assert checked_in == generated
