"""A training loop of one's own around a ``SentenceTransformer`` or ``CrossEncoder``, beside sentence-transformers 6.3
on MiniLM's first 2 layers: the model's parameter and state-dict names are sentence-transformers' (``0.model.…``, a
Dense layer's ``2.linear.…``), so a script that freezes or groups parameters by those names selects the same
tensors, and state dicts load strictly from one library into the other (sentence-transformers 5's ``0.auto_model.…``
too). The same loop then gives the same losses, weights and saved directory."""

from __future__ import annotations

import importlib

import pytest
import torch

from bertkit.errors import BertkitError

st = pytest.importorskip("sentence_transformers")

QUERIES = ["Which NFL team represented the AFC at Super Bowl 50?", "Where did Super Bowl 50 take place?",
           "Who was the Super Bowl 50 MVP?", "What color was used to emphasize the 50th anniversary?"]
DOCUMENTS = ["The American Football Conference champion Denver Broncos defeated the Carolina Panthers 24-10.",
             "The game was played on February 7, 2016, at Levi's Stadium in Santa Clara, California.",
             "Von Miller was named the game's most valuable player after two strip sacks.",
             "The league emphasized the golden anniversary with various gold-themed initiatives."]


def _embedder(lib, path):
    """Transformer, mean Pooling, a Dense 384->64 (tanh, fixed weights) and Normalize, in ``lib``'s modules."""
    g = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(64, 384, generator=g) * 0.05, torch.randn(64, generator=g) * 0.05
    models = importlib.import_module(f"{lib.__name__}.models")
    return lib.SentenceTransformer(modules=[models.Transformer(str(path), max_seq_length=64), models.Pooling(384),
                                            models.Dense(384, 64, init_weight=weight, init_bias=bias),
                                            models.Normalize()], device="cpu")


@pytest.fixture(scope="module")
def cross_encoder_dir(minilm_2_layers, tmp_path_factory):
    """A one-label cross-encoder saved by sentence-transformers (its classifier drawn once, read by both)."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("cross-encoder")
    st.CrossEncoder(str(minilm_2_layers), num_labels=1, device="cpu").save(str(path))
    return path


def test_parameter_and_state_dict_names_are_sentence_transformers(minilm_2_layers, cross_encoder_dir):
    """The names a script freezes, groups and maps by: bertkit gave ``bert.…`` / ``dense.0.…`` (a CrossEncoder
    ``model.bert.…``), so ``n.startswith("0.model.embeddings")`` froze nothing and a state dict of one library loaded
    into the other failed (strict) or loaded nothing (strict=False)."""
    import bertkit.sentence

    pairs = [(_embedder(bertkit.sentence, minilm_2_layers), _embedder(st, minilm_2_layers)),
             (bertkit.sentence.CrossEncoder(cross_encoder_dir), st.CrossEncoder(str(cross_encoder_dir), device="cpu"))]
    for ours, theirs in pairs:
        want = dict(theirs.named_parameters())
        assert list(dict(ours.named_parameters())) == list(want)
        assert list(ours.state_dict()) == list(theirs.state_dict())
        for name, value in ours.named_parameters():
            torch.testing.assert_close(value, want[name], atol=0, rtol=0)
        assert [id(p) for p in ours.parameters()][:len(list(ours[0].auto_model.parameters()))] == \
            [id(p) for p in ours[0].auto_model.parameters()]
    embedder = pairs[0][0]
    assert [n for n, _ in embedder.named_parameters() if not n.startswith("0.model.")] == ["2.linear.weight",
                                                                                         "2.linear.bias"]
    assert list(pairs[1][0].state_dict())[0] == "0.model.bert.embeddings.word_embeddings.weight"


def test_state_dicts_load_strictly_across_the_libraries(minilm_2_layers, tmp_path):
    """A state dict saved with torch.save by either library loads strictly into the other and embeds to the same
    vectors; sentence-transformers 5's names (``0.auto_model.…``, which 6 no longer reads) load too."""
    import bertkit.sentence

    theirs = _embedder(st, minilm_2_layers)
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.01)
    torch.save(theirs.state_dict(), tmp_path / "theirs.pt")
    ours = _embedder(bertkit.sentence, minilm_2_layers)
    ours.load_state_dict(torch.load(tmp_path / "theirs.pt"), strict=True)
    want = theirs.encode(QUERIES, convert_to_tensor=True)
    torch.testing.assert_close(ours.encode(QUERIES, convert_to_tensor=True), want, atol=2e-6, rtol=0)

    back = _embedder(st, minilm_2_layers)
    back.load_state_dict(ours.state_dict(), strict=True)
    torch.testing.assert_close(back.encode(QUERIES, convert_to_tensor=True), want, atol=0, rtol=0)

    older = {k.replace("0.model.", "0.auto_model."): v for k, v in theirs.state_dict().items()}
    again = _embedder(bertkit.sentence, minilm_2_layers)
    assert again.load_state_dict(older, strict=True)  # all keys matched
    torch.testing.assert_close(again.encode(QUERIES, convert_to_tensor=True), want, atol=2e-6, rtol=0)


def _embedder_loop(lib, path, out):
    """A script of one's own: embeddings frozen by name, AdamW over no_decay groups built from names, 3 steps of
    MultipleNegativesRankingLoss in eval mode (no dropout), clip_grad_norm_, then save."""
    torch.manual_seed(0)
    model = _embedder(lib, path)
    for name, p in model.named_parameters():
        if name.startswith("0.model.embeddings"):
            p.requires_grad = False
    no_decay = ["bias", "LayerNorm.weight"]
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW([
        {"params": [p for n, p in named if not any(nd in n for nd in no_decay)], "weight_decay": 0.01},
        {"params": [p for n, p in named if any(nd in n for nd in no_decay)], "weight_decay": 0.0}], lr=2e-5)
    loss_fn = importlib.import_module(f"{lib.__name__}.losses").MultipleNegativesRankingLoss(model)
    model.eval()
    seen = []
    for step in range(3):
        rows = [(step + i) % len(QUERIES) for i in range(3)]
        loss = loss_fn([model.tokenize([QUERIES[i] for i in rows]), model.tokenize([DOCUMENTS[i] for i in rows])],
                       None)
        model.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        seen.append((loss.item(), norm.item()))
    model.save(str(out))
    return model, seen, [len(g["params"]) for g in optimizer.param_groups]


def test_a_hand_written_loop_trains_and_saves_as_sentence_transformers(minilm_2_layers, tmp_path):
    """The same script with only the import changed: the same groups (the embeddings frozen by their
    sentence-transformers names), losses and gradient norms at every step, the same weights, and a saved directory
    each library opens to the trained model's vectors."""
    import bertkit.sentence

    ours, got, got_groups = _embedder_loop(bertkit.sentence, minilm_2_layers, tmp_path / "ours")
    theirs, want, want_groups = _embedder_loop(st, minilm_2_layers, tmp_path / "theirs")
    assert got_groups == want_groups == [14, 22]  # 2 layers x 6 matrices, the pooler's and the Dense's weight
    for (loss, norm), (want_loss, want_norm) in zip(got, want, strict=True):
        assert loss == pytest.approx(want_loss, rel=1e-5) and norm == pytest.approx(want_norm, rel=1e-5)
    initial = _embedder(bertkit.sentence, minilm_2_layers).state_dict()
    theirs_now = theirs.state_dict()
    for name, value in ours.state_dict().items():
        if name.startswith("0.model.embeddings"):
            assert torch.equal(value, initial[name]), name  # frozen by name
        torch.testing.assert_close(value, theirs_now[name], atol=1e-5, rtol=0)
    want_vectors = ours.encode(QUERIES, convert_to_tensor=True)
    assert (want_vectors - _embedder(bertkit.sentence, minilm_2_layers).encode(QUERIES, convert_to_tensor=True)
            ).abs().max() > 1e-3  # the loop trained
    reread = st.SentenceTransformer(str(tmp_path / "ours"), device="cpu").encode(QUERIES, convert_to_tensor=True)
    torch.testing.assert_close(reread, want_vectors, atol=2e-6, rtol=0)
    mine = bertkit.sentence.SentenceTransformer(tmp_path / "theirs").encode(QUERIES, convert_to_tensor=True)
    torch.testing.assert_close(mine, theirs.encode(QUERIES, convert_to_tensor=True), atol=2e-6, rtol=0)


def test_a_cross_encoder_frozen_by_name_trains_as_sentence_transformers(cross_encoder_dir):
    """A CrossEncoder's encoder frozen by sentence-transformers' names (``0.model.bert.…``) but its classifier: the
    same losses as there, and the frozen tensors unchanged."""
    import bertkit.sentence
    from bertkit.sentence.cross_encoder import losses

    results = []
    for model, loss_class in ((bertkit.sentence.CrossEncoder(cross_encoder_dir), losses.BinaryCrossEntropyLoss),
                              (st.CrossEncoder(str(cross_encoder_dir), device="cpu"),
                               st.cross_encoder.losses.BinaryCrossEntropyLoss)):
        model.requires_grad_(False)
        for name, p in model.named_parameters():
            if name.startswith("0.model.classifier") or name.startswith("0.model.bert.encoder.layer.1."):
                p.requires_grad = True
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        loss_fn, seen = loss_class(model), []
        model.eval()
        for step in range(3):
            loss = loss_fn([QUERIES, DOCUMENTS[step:] + DOCUMENTS[:step]], torch.tensor([float(step == 0)] * 4))
            model.zero_grad()
            loss.backward()
            optimizer.step()
            seen.append(loss.item())
        results.append((seen, sum(p.numel() for p in model.parameters() if p.requires_grad), model.state_dict()))
    (got, got_trained, ours), (want, want_trained, theirs) = results
    assert got_trained == want_trained == 1_774_464 + 385  # layer 1 and the classifier
    assert got == pytest.approx(want, rel=1e-5)
    initial = bertkit.sentence.CrossEncoder(cross_encoder_dir).state_dict()
    assert torch.equal(ours["0.model.bert.encoder.layer.0.output.dense.weight"],
                       initial["0.model.bert.encoder.layer.0.output.dense.weight"])
    for name, value in ours.items():
        torch.testing.assert_close(value, theirs[name], atol=1e-5, rtol=0)


def test_model_0_takes_an_encoder_only(minilm_2_layers):
    """``model[0].auto_model = ...`` replaces the encoder (module "0"'s model, its parameters under ``0.model.``);
    anything but a module is refused naming it, and ``model[0]`` is the module the model holds as "0"."""
    import bertkit.sentence

    model = _embedder(bertkit.sentence, minilm_2_layers)
    assert model[0] is model.get_submodule("0") and model[0].auto_model is model.bert is model.get_submodule("0.model")
    with pytest.raises(BertkitError, match=r"model\[0\]\.auto_model takes the encoder, an nn.Module, got NoneType"):
        model[0].auto_model = None
    other = bertkit.sentence.SentenceTransformer(minilm_2_layers).bert
    model[0].auto_model = other
    assert model.bert is other and model.get_parameter("0.model.embeddings.word_embeddings.weight") is \
        other.embeddings.word_embeddings.weight
    assert "auto_model" not in dict(model[0].named_children())


def test_features_built_by_hand_without_a_mask_are_refused(minilm_2_layers, cross_encoder_dir):
    """``model({"input_ids": ids})``: sentence-transformers pools the padding as text (a coordinate of the shorter
    text's vector moved by 0.13 on MiniLM); bertkit raised a bare KeyError. Refused naming the missing tensor and the call that makes it."""
    import bertkit.sentence

    model = _embedder(bertkit.sentence, minilm_2_layers)
    features = model.tokenize(QUERIES[:2])
    with pytest.raises(BertkitError, match=r"model\(features\) needs \['attention_mask'\] \(the features hold "
                                           r"\['input_ids'\]\): build them with model.tokenize\(texts\)"):
        model({"input_ids": features["input_ids"]})
    whole = model(features)["sentence_embedding"]
    torch.testing.assert_close(whole, model.encode(QUERIES[:2], convert_to_tensor=True), atol=2e-6, rtol=0)
    cross = bertkit.sentence.CrossEncoder(cross_encoder_dir)
    pairs = list(zip(QUERIES[:2], DOCUMENTS[:2]))
    features = cross.tokenize(pairs)  # sentence-transformers' name before 6 (bertkit had preprocess alone)
    with pytest.raises(BertkitError, match=r"needs \['token_type_ids'\] .*build them with model.preprocess\(pairs\)"):
        cross({"input_ids": features["input_ids"], "attention_mask": features["attention_mask"]})
    scores = cross.predict(pairs, convert_to_tensor=True)  # the sigmoid of the logits
    torch.testing.assert_close(torch.sigmoid(cross(features)["scores"].squeeze(-1)), scores, atol=1e-6, rtol=0)
    want = st.CrossEncoder(str(cross_encoder_dir), device="cpu")
    torch.testing.assert_close(cross(features)["scores"], want(want.tokenize(pairs))["scores"], atol=1e-6, rtol=0)
