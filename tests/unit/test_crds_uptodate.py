"""The CRD files in deploy/crds are the ones the models generate, and `nicop crds generate
--check` says when they are not."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from nicop.api.crdgen import stale
from nicop.cli import app

ROOT = Path(__file__).resolve().parents[2]


def test_checked_in_crds_match_the_models() -> None:
    problems = stale(ROOT / "deploy" / "crds")
    assert problems == [], "run `nicop crds generate`:\n" + "\n".join(problems)


def test_check_lists_stale_files_and_fails(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "crds"
    assert runner.invoke(app, ["crds", "generate", "--out-dir", str(out)]).exit_code == 0
    assert runner.invoke(app, ["crds", "generate", "--check", "--out-dir", str(out)]).exit_code == 0

    edited = out / "mellanox.com_nicclusterpolicies.yaml"
    edited.write_text(edited.read_text().replace("ncp", "xyz"))
    (out / "mellanox.com_ipoibnetworks.yaml").unlink()
    (out / "old_kind.yaml").write_text("{}\n")

    result = runner.invoke(app, ["crds", "generate", "--check", "--out-dir", str(out)])
    assert result.exit_code == 1
    assert f"{edited}: differs from the models" in result.output
    assert "mellanox.com_ipoibnetworks.yaml: missing" in result.output
    assert "old_kind.yaml: no model generates it" in result.output

    assert runner.invoke(app, ["crds", "generate", "--out-dir", str(out)]).exit_code == 0
    assert stale(out) == [str(out / "old_kind.yaml") + ": no model generates it"]
