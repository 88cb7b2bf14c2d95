"""sentence-transformers' legacy ``model.fit`` in bertkit.sentence, against sentence-transformers: the same script
(only the import differs) with one objective (MultipleNegativesRankingLoss on InputExample pairs) and with two
(and CoSENTLoss on scored pairs) trains to the same loss at every step and saves the same model at output_path;
what bertkit cannot do is refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertkit.errors import BertkitError, NotImplementedInBertkit
from sentence_helpers import st_directory

pytest.importorskip("sentence_transformers")
pytest.importorskip("datasets")

PAIRS = [(f"question {i}", f"paragraph {i // 2}") for i in range(11)]
SCORED = [(f"sentence {i}", f"another {i % 3}", (i % 5) / 4) for i in range(9)]
PROBE = ["question 3", "a paragraph", "another sentence"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, minilm_2_layers):
    return st_directory(minilm_2_layers, tmp_path_factory.mktemp("st") / "m", dropout=0.0, max_seq_length=16)


def _fit(lib: str, model_dir, out, two: bool, **kwargs):
    """The fit script; ``lib`` picks the import, nothing else differs. Returns each step's (rows, loss) and the
    model saved at output_path's embeddings of PROBE."""
    if lib == "sentence_transformers":
        import sentence_transformers as S
        from sentence_transformers import losses as L
    else:
        import bertkit.sentence as S
        from bertkit.sentence import losses as L
    model = S.SentenceTransformer(str(model_dir), device="cpu")
    seen = []

    def recorded(cls):
        class Recorded(cls):  # each batch's rows and loss, unrounded
            def forward(self, features, labels):
                value = super().forward(features, labels)
                seen.append((len(features[0]["input_ids"]), value.item()))
                return value
        return Recorded(model)

    pairs = [S.InputExample(texts=[a, b]) for a, b in PAIRS]
    objectives = [(torch.utils.data.DataLoader(pairs, shuffle=True, batch_size=3),
                   recorded(L.MultipleNegativesRankingLoss))]
    if two:
        scored = [S.InputExample(texts=[a, b], label=s) for a, b, s in SCORED]
        objectives.append((torch.utils.data.DataLoader(scored, shuffle=True, batch_size=3), recorded(L.CoSENTLoss)))
    torch.manual_seed(7)  # the DataLoaders' shuffle, drawn from torch's global generator
    model.fit(train_objectives=objectives, epochs=2, warmup_steps=2, optimizer_params={"lr": 1e-4},
              output_path=str(out / "model"), checkpoint_path=str(out / "ckpt"), checkpoint_save_steps=1000,
              show_progress_bar=False, **kwargs)
    saved = S.SentenceTransformer(str(out / "model"), device="cpu")
    return seen, saved.encode(PROBE, convert_to_numpy=True)


@pytest.mark.parametrize("two", [False, True], ids=["mnrl", "mnrl+cosent"])
def test_fit_gives_sentence_transformers_numbers(two, model_dir, tmp_path):
    """Same rows per step, same loss at every step (relative 1e-5), same saved model (encode within 1e-5)."""
    want_steps, want_emb = _fit("sentence_transformers", model_dir, tmp_path / "st", two)
    got_steps, got_emb = _fit("bertkit", model_dir, tmp_path / "bk", two)
    assert [n for n, _ in got_steps] == [n for n, _ in want_steps]
    assert len(got_steps) == (2 * 6 if two else 2 * 4)  # ROUND_ROBIN: the fewest batches (3 of 9 rows) each
    np.testing.assert_allclose([v for _, v in got_steps], [v for _, v in want_steps], rtol=1e-5)
    np.testing.assert_allclose(got_emb, want_emb, atol=1e-5)
