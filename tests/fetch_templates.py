"""Fetch model chat templates the shared tokenizers do not carry, for the template-oracle tests.

DeepSeek V3.1's template is on PyPI only inside the source archive of ``llama-cpp-python``
(llama.cpp keeps copies of model templates under ``vendor/llama.cpp/models/templates/``). The
archive is downloaded (nothing is built: it is read as a tar file), checked against its pinned
sha256, and only the templates listed below are written to ``DEST``. ``make install`` runs this
once; the tests read ``.venv/templates/``. Usage: ``python tests/fetch_templates.py DEST``.
"""

from __future__ import annotations

import hashlib
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

SDIST = (
    "https://files.pythonhosted.org/packages/ec/e9/"
    "e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/"
    "llama_cpp_python-0.3.36.tar.gz"
)
SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
PREFIX = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/"
#: the file in the archive -> the name written under DEST
WANTED = {"deepseek-ai-DeepSeek-V3.1.jinja": "deepseek-v3.1.jinja"}


def main(dest: Path) -> int:
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "sdist.tar.gz"
        h = hashlib.sha256()
        try:
            with urllib.request.urlopen(SDIST, timeout=300) as r, archive.open("wb") as f:
                while chunk := r.read(1 << 20):  # hashed as it is written: read once
                    h.update(chunk)
                    f.write(chunk)
        except OSError as e:
            print(
                f"fetch_templates: could not download {SDIST} ({e}); the DeepSeek V3.1 "
                "template oracle needs PyPI's file host",
                file=sys.stderr,
            )
            return 1
        digest = h.hexdigest()
        if digest != SHA256:
            print(
                f"fetch_templates: {SDIST} has sha256 {digest}, expected {SHA256}; not used",
                file=sys.stderr,
            )
            return 1
        found = 0
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                name = member.name.removeprefix(PREFIX)
                if member.isfile() and member.name.startswith(PREFIX) and name in WANTED:
                    data = tar.extractfile(member).read()  # type: ignore[union-attr]
                    (dest / WANTED[name]).write_bytes(data)
                    found += 1
        if found != len(WANTED):
            print(f"fetch_templates: {SDIST} lacks {sorted(WANTED)}", file=sys.stderr)
            return 1
    print(f"fetch_templates: wrote {', '.join(WANTED.values())} to {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
