"""docs/configuration.md is generated from the keys' declarations and kept current."""

import pytest

from conftest import REPO
from fedgo_app.config import declared_keys
from fedgo_lab.configref import main, reference, toml_value

pytestmark = pytest.mark.unit


def test_the_configuration_reference_is_current():
    page = (REPO / "docs" / "configuration.md").read_text()
    assert page == reference(), ("docs/configuration.md is stale: "
                                 "python -m fedgo_lab.configref --write docs/configuration.md")


def test_every_key_is_there_with_its_default_allowed_values_and_a_meaning():
    text = reference()
    for name, d in declared_keys().items():
        assert d.meaning, f"{name} has no meaning"
        assert f"| `{name}` | `{toml_value(d.default)}` | {d.allowed_text} |" in text, name
    assert "| `alpha` | `0.1` | > 0 | every strategy |" in text
    assert "| `odds-beta` | `1.0` | > 0 | `fedgo` |" in text
    assert "| `latent-dim` | `128` | >= 1 | `fedgo`, `dafkd` |" in text
    assert "| `fedprox-mu` | `0.001` | > 0 | `fedprox` |" in text


def test_check_fails_on_a_stale_page(tmp_path, capsys):
    page = tmp_path / "configuration.md"
    assert main(["--write", str(page)]) == 0 and main(["--check", str(page)]) == 0
    page.write_text(page.read_text().replace("| `alpha` | `0.1`", "| `alpha` | `0.2`"))
    assert main(["--check", str(page)]) == 1
    assert "stale" in capsys.readouterr().err
