"""What a release carries beside the code: the license, the changelog, the citation file, the typing
marker, and one version that the build and ``xtransformer.__version__`` both read.

That the wheel and the sdist ship them is checked where they are built (test_packaging.py)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import yaml
from setuptools.config.pyprojecttoml import read_configuration

import xtransformer

ROOT = Path(__file__).resolve().parents[2]
# sha256 of the Apache License 2.0 as apache.org publishes it (LICENSE-2.0.txt, 11,358 bytes)
APACHE_2_0_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
SEED_PAPERS = {
    "Taming Pretrained Transformers for Extreme Multi-label Text Classification": ("Chang", 2020),
    "Fast Multi-Resolution Transformer Fine-tuning for Extreme Multi-label Text Classification": ("Zhang", 2021),
    "Label Disentanglement in Partition-based Extreme Multilabel Classification": ("Liu", 2021),
}


def test_the_version_is_the_one_the_build_reads():
    project = read_configuration(ROOT / "pyproject.toml")["project"]
    assert project["version"] == xtransformer.__version__ == "0.2.0"
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]


def test_license_is_the_unmodified_apache_2_0_text():
    assert hashlib.sha256((ROOT / "LICENSE").read_bytes()).hexdigest() == APACHE_2_0_SHA256


def test_changelog_starts_with_this_version():
    versions = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert versions[0] == xtransformer.__version__ and "0.1.0" in versions


def test_citation_file_has_cff_1_2_0_keys_and_the_three_papers():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software"
    assert cff["message"].strip() and cff["title"].strip()
    assert cff["version"] == xtransformer.__version__ and cff["license"] == "Apache-2.0"
    assert cff["authors"] and all("name" in a or "family-names" in a for a in cff["authors"])
    papers = {ref["title"]: ref for ref in cff["references"]}
    assert set(papers) == set(SEED_PAPERS)
    for title, (first_author, year) in SEED_PAPERS.items():
        ref = papers[title]
        assert ref["type"] == "conference-paper" and ref["year"] == year  # type, title, authors: required
        assert ref["authors"][0]["family-names"] == first_author
        assert all(a["given-names"] and a["family-names"] for a in ref["authors"])


def test_the_package_is_marked_typed():
    assert (ROOT / "src" / "xtransformer" / "py.typed").is_file()
