"""A small llama-architecture GGUF model, generated (no model can be downloaded here).

Random F16 weights from a seed, llama's SentencePiece vocabulary copied from the
``ggml-vocab-llama-spm.gguf`` that llama.cpp ships in ``models/``: llama-server loads and serves
it like any llama model (its answers are noise, which is all a memory test needs). The default
shape (1024 wide, 6 layers) is a 272 MiB file: larger than the limits the tests put on it, small
enough to write in seconds. The same parameters give the same bytes, so a file is cached by its
name (``model_path``).

    python -m llm.model OUT.gguf --vocab ggml-vocab-llama-spm.gguf [--layers 6] [--seed 1]
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np


@dataclass(frozen=True, slots=True)
class Shape:
    width: int = 1024
    layers: int = 6
    ffn: int = 2816  # llama's 8/3 x width, rounded to 256
    heads: int = 16
    context: int = 4096
    seed: int = 1

    def name(self) -> str:
        return f"llama-w{self.width}-l{self.layers}-f{self.ffn}-h{self.heads}-s{self.seed}.gguf"


def write_model(out: Path, vocab: Path, shape: Shape = Shape()) -> Path:
    """Write the model to ``out`` (atomically: a reader never sees half a file)."""
    reader = gguf.GGUFReader(str(vocab))
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    rng = np.random.default_rng(shape.seed)
    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name(f"whyrestart test model {shape.name()}")
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.width)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.heads)
    w.add_rope_dimension_count(shape.width // shape.heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value_type = field.types[0]
        sub_type = field.types[1] if value_type == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), value_type, sub_type)

    def weights(*dims: int) -> np.ndarray:
        # small, as trained weights are, so activations stay finite through the layers
        return (rng.standard_normal(dims, dtype=np.float32) * 0.02).astype(np.float16)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    # numpy shapes are ggml's dimensions reversed: token_embd is ne = {width, vocab}
    d, f, v = shape.width, shape.ffn, len(tokens)
    w.add_tensor("token_embd.weight", weights(v, d))
    for i in range(shape.layers):
        b = f"blk.{i}"
        w.add_tensor(f"{b}.attn_norm.weight", ones(d))
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(f"{b}.{part}.weight", weights(d, d))
        w.add_tensor(f"{b}.ffn_norm.weight", ones(d))
        w.add_tensor(f"{b}.ffn_gate.weight", weights(f, d))
        w.add_tensor(f"{b}.ffn_up.weight", weights(f, d))
        w.add_tensor(f"{b}.ffn_down.weight", weights(d, f))
    w.add_tensor("output_norm.weight", ones(d))
    w.add_tensor("output.weight", weights(v, d))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(out)
    return out


def model_path(cache: Path, vocab: Path, shape: Shape = Shape()) -> Path:
    """The model for ``shape`` in ``cache``, written once."""
    out = cache / shape.name()
    if not out.exists():
        cache.mkdir(parents=True, exist_ok=True)
        write_model(out, vocab, shape)
    return out


def main() -> None:
    default = Shape()
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--vocab", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=default.layers)
    ap.add_argument("--width", type=int, default=default.width)
    ap.add_argument("--seed", type=int, default=default.seed)
    a = ap.parse_args()
    write_model(a.out, a.vocab, Shape(width=a.width, layers=a.layers, seed=a.seed))
    print(a.out)


if __name__ == "__main__":
    main()
