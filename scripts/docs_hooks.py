"""MkDocs hook (mkdocs.yml `hooks:`): BENCHMARKS.md, kept at the repository's top, is the site's
`benchmarks.md`, with the repository files it links to (its figures); nothing is copied into docs/."""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)#\s]+)")


def on_files(files: Files, config) -> Files:
    text = (ROOT / "BENCHMARKS.md").read_text()
    files.append(File.generated(config, "benchmarks.md", content=text))
    for target in sorted(set(LINK.findall(text))):
        if "://" in target or target.endswith(".md") or files.get_file_from_path(target):
            continue
        if (ROOT / target).is_file():
            files.append(
                File(
                    target,
                    src_dir=str(ROOT),
                    dest_dir=config["site_dir"],
                    use_directory_urls=config["use_directory_urls"],
                )
            )
    return files
