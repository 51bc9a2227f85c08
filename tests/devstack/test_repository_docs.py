"""The repository documents its own protocol: nothing in it points outside the checkout."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = "../" + "shared"  # spelled in two parts so that this file does not name it


def tracked_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_no_file_names_the_shared_folder_outside_the_repository() -> None:
    files = tracked_files()
    assert len(files) > 50  # the listing worked: we are scanning the repository, not nothing
    naming = []
    for path in files:
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if OUTSIDE in text:
            naming.append(str(path.relative_to(ROOT)))
    assert naming == []


def test_readme_design_and_service_readmes_link_the_protocol() -> None:
    assert (ROOT / "docs" / "protocol.md").is_file()
    for doc in [
        "README.md",
        "docs/design.md",
        *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("services/*/README.md")),
    ]:
        assert "protocol.md" in (ROOT / doc).read_text(encoding="utf-8"), doc


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
DOCS = ["README.md", "docs/**/*.md", "libs/*/README.md", "services/*/README.md", "deploy/**/*.md"]


def markdown_files() -> list[Path]:
    return sorted({p for pattern in DOCS for p in ROOT.glob(pattern) if p.is_file()})


def prose(text: str) -> str:
    """The text without code blocks and code spans, whose brackets are no links."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {
        slug(line.lstrip("#"))
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.startswith("#")
    }


def test_every_relative_link_in_the_docs_resolves() -> None:
    files = markdown_files()
    assert ROOT / "README.md" in files and ROOT / "docs" / "settings.md" in files
    broken = []
    for path in files:
        for target in LINK.findall(prose(path.read_text(encoding="utf-8"))):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            name, _, anchor = target.partition("#")
            resolved = (path.parent / name).resolve() if name else path
            where = f"{path.relative_to(ROOT)} -> {target}"
            if not resolved.exists():
                broken.append(where)
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{where} (no such heading)")
    assert broken == []


def test_the_readme_links_a_page_for_each_topic() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for page in [
        "docs/protocol.md",
        "docs/sdk.md",
        "deploy/README.md",
        "docs/settings.md",
        "docs/benchmarks.md",
    ]:
        assert f"]({page})" in readme, page
    assert "make up" in readme and "make test" in readme


def test_the_design_doc_stays_a_list_of_decisions() -> None:
    lines = (ROOT / "docs" / "design.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 400
    measurements = sorted((ROOT / "docs" / "measurements").glob("*.md"))
    assert measurements, "the measurements the decisions link to"
    assert all(re.match(r"\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.md$", p.name) for p in measurements)


def documented_settings() -> set[str]:
    return set(
        re.findall(r"`(TOOLBUS_[A-Z0-9_]+)`", (ROOT / "docs" / "settings.md").read_text(encoding="utf-8"))
    )


def test_the_settings_page_names_every_variable_the_services_read() -> None:
    from tests.deploy.settings_catalogue import all_settings

    read = set(all_settings()) | {"TOOLBUS_PORT_BASE", "TOOLBUS_STACK_DIR", "TOOLBUS_SECURE"}
    assert "TOOLBUS_NATS_URL" in read and "TOOLBUS_PARK_TIMEOUT" in read
    assert sorted(read - documented_settings()) == []


def test_the_settings_page_names_no_variable_the_code_does_not_read() -> None:
    code = "\n".join(
        p.read_text(encoding="utf-8")
        for pattern in ["libs/**/*.py", "services/**/*.py", "tests/**/*.py"]
        for p in ROOT.glob(pattern)
    )
    from tests.deploy.settings_catalogue import all_settings

    unknown = [
        name
        for name in sorted(documented_settings())
        if name not in all_settings() and f'"{name}"' not in code
    ]
    assert unknown == []
