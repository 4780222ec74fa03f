"""docs/api.md is generated from the library's docstrings and kept current."""

import pytest

from conftest import REPO
from fedgo_lab.apiref import main, reference

pytestmark = pytest.mark.unit


def test_the_api_reference_is_current():
    page = (REPO / "docs" / "api.md").read_text()
    assert page == reference(), "docs/api.md is stale: python -m fedgo_lab.apiref --write docs/api.md"


def test_every_exported_strategy_is_documented_with_its_parameters():
    import fedgo_flwr
    text = reference()
    for name in fedgo_flwr.__all__:
        if name.startswith("_"):
            continue
        assert f"### `{name}`" in text, name
        doc = getattr(fedgo_flwr, name).__doc__
        assert "Parameters\n" in doc and "----------" in doc, name
    assert "### `fedgo_flwr.client.register`" in text


def test_check_fails_on_a_stale_page(tmp_path, capsys):
    page = tmp_path / "api.md"
    assert main(["--write", str(page)]) == 0 and main(["--check", str(page)]) == 0
    page.write_text(page.read_text().replace("distill_epochs: int = 10", "distill_epochs: int = 3"))
    assert main(["--check", str(page)]) == 1
    assert "stale" in capsys.readouterr().err
