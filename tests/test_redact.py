"""The user and password of a URL are masked in every form a path rewrite leaves of it:
a URL given where a path belongs comes back from pathlib or os.path with one slash."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kubetune.redact import MASK, redact, url_credentials

URL = "http://canaryUser7:canaryPass8@host.example/logs"


@pytest.mark.parametrize("rewrite", [str, lambda u: str(Path(u)), os.path.normpath,
                                     os.path.abspath, lambda u: f"Writing logs to {Path(u)}/log_1.txt"],
                         ids=["as-given", "pathlib", "normpath", "abspath", "in-a-sentence"])
def test_userinfo_is_masked_after_a_path_rewrite(rewrite):
    text = rewrite(URL)
    masked = redact(text)
    assert "canaryUser7" not in masked and "canaryPass8" not in masked
    assert f"{MASK}@host.example" in masked


def test_the_credentials_of_a_rewritten_url_are_found():
    assert url_credentials(str(Path(URL))) == {"canaryUser7", "canaryPass8"}


@pytest.mark.parametrize("text", ["file:/tmp/run@2", "note: a:/b/c@d", "/data/x@y.parquet",
                                  "user@example.com"])
def test_paths_and_addresses_without_userinfo_are_left_alone(text):
    assert redact(text) == text
