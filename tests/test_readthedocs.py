"""The Read the Docs configuration is valid and builds the book the way ``make docs`` does."""

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import require

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / ".readthedocs.yaml"


def _check_jsonschema(path):
    require("check_jsonschema")
    exe = shutil.which("check-jsonschema", path=str(Path(sys.executable).parent)) or shutil.which("check-jsonschema")
    assert exe, "check-jsonschema is installed but its script is not on PATH"
    return subprocess.run(
        [exe, "--builtin-schema", "vendor.readthedocs", str(path)], capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def config():
    yaml = require("yaml")
    return yaml.safe_load(CONFIG.read_text())


def test_config_matches_the_vendored_schema():
    result = _check_jsonschema(CONFIG)
    assert result.returncode == 0, result.stdout + result.stderr


def test_schema_check_rejects_a_broken_config(tmp_path):
    bad = tmp_path / ".readthedocs.yaml"
    bad.write_text(CONFIG.read_text().replace("fail_on_warning: true", "fail_on_warning: sometimes"))
    assert bad.read_text() != CONFIG.read_text()
    result = _check_jsonschema(bad)
    assert result.returncode != 0
    assert "fail_on_warning" in result.stdout + result.stderr


def test_config_builds_like_make_docs(config):
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert config["version"] == 2
    assert config["sphinx"]["fail_on_warning"] is True
    assert (ROOT / config["sphinx"]["configuration"]).is_file()
    (install,) = config["python"]["install"]
    assert install["method"] == "pip" and install["path"] == "."
    extras = pyproject["project"]["optional-dependencies"]
    assert set(install["extra_requirements"]) <= set(extras)
    # Read the Docs' Python satisfies requires-python.
    minimum = pyproject["project"]["requires-python"].removeprefix(">=")
    assert tuple(map(int, config["build"]["tools"]["python"].split("."))) >= tuple(map(int, minimum.split(".")))
