"""The SPLADE head alone, one process, one thread: the masked-LM head's vocabulary maxima for a batch of ``--texts``
SST-2 dev sentences on bench_sparse.py's MiniLM SPLADE model (its drawn masked-LM head, bias -3.5), through each
head this CPU can run: the plain fp32 product (``_MaxLogits`` on oneDNN's reordered weight) and, where the CPU
has an exact int8 product, the int8 screen (``sparse_encoder.screen``), its result checked against the fp32 one
(indices identical, values within 1e-5). Prints one JSON line: each head's milliseconds a call and the encoder's for
the same batch (the median of ``--calls``, called in turn), and the (text, piece) pairs the screen recomputed in
fp32 beside the active ones.

    .venv/bin/python bench/bench_sparse_head.py --texts 16 --calls 9
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench_serve_routes import sentences
from bench_sparse import splade_directory

ROOT = Path(__file__).resolve().parents[1]


def interleaved_ms(heads: dict[str, Callable[[], object]], calls: int) -> dict[str, float]:
    """Each head's median milliseconds a call, the heads called in turn (a machine shared with other jobs slows
    them alike)."""
    times: dict[str, list[float]] = {name: [] for name in heads}
    for i in range(calls + 1):
        for name, fn in heads.items():
            start = time.perf_counter()
            fn()
            if i:  # the first call of each makes its buffers
                times[name].append(time.perf_counter() - start)
    return {f"{name}_ms": round(statistics.median(t) * 1e3, 1) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "minilm")
    parser.add_argument("--texts", type=int, default=16)
    parser.add_argument("--calls", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from bertkit.inference.prepare import PreparedLinear, encoder_for_encode
    from bertkit.sentence import SparseEncoder
    from bertkit.sentence.sparse_encoder.modules import _MaxLogits
    from bertkit.sentence.sparse_encoder.screen import screened_max_logits

    with tempfile.TemporaryDirectory() as tmp:
        model = SparseEncoder(str(splade_directory(args.model, Path(tmp))), device="cpu")
    transformer = model[0]
    head = transformer.head
    batch = transformer.tokenize(sentences(args.texts))
    mask = batch["attention_mask"]
    lengths = mask.sum(1).tolist()
    bert = encoder_for_encode(transformer.model.bert)
    result: dict = {"texts": args.texts, "tokens": sum(lengths)}
    with torch.inference_mode():
        out = bert(batch["input_ids"], mask, batch.get("token_type_ids"))
        states = head.transform(out.token_layout.select(out.tokens, mask.bool()))  # (N, H)
        weight, bias = head.decoder.weight, head.bias
        plain = PreparedLinear(weight, bias, torch.float32)
        want = _MaxLogits.apply(states, weight, bias, plain, lengths, 64, False).relu()
        result["active"] = int((want > 0).sum())
        heads = {"encoder": lambda: bert(batch["input_ids"], mask, batch.get("token_type_ids")),
                 "fp32": lambda: _MaxLogits.apply(states, weight, bias, plain, lengths, 64, False)}
        screen = screened_max_logits(weight, bias)  # None where this CPU has no exact int8 product (AVX2)
        if screen is not None:
            got = screen(states, lengths, screen.ROWS)
            assert torch.equal(got > 0, want > 0)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            heads["int8"] = functools.partial(screen, states, lengths, screen.ROWS)
            bound = screen._bound(states.float(), lengths, torch.tensor(lengths).cumsum(0).tolist(), screen.ROWS, {})
            result["int8_recomputed"] = int((~(bound <= 0)).sum())
        result.update(interleaved_ms(heads, args.calls))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
