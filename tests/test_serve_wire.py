"""`bertkit serve` speaks the wire formats real clients parse: huggingface_hub's InferenceClient over loopback
for every task, with answers equal to transformers' pipelines on the same weights, and the routes of Hugging
Face's text-embeddings-inference (TEI): /embed, /similarity and /predict with TEI's fields.

Each task runs on a tiny random model built with transformers and saved with MiniLM's vocabulary, so both
libraries load the same weights (as tests/test_pipelines.py and tests/test_tagging.py do)."""

from __future__ import annotations

import contextlib
import csv
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi", reason='bertkit serve needs FastAPI: pip install "bertkit[serve]"')
pytest.importorskip("uvicorn", reason='bertkit serve needs uvicorn: pip install "bertkit[serve]"')
httpx = pytest.importorskip("httpx", reason="the HTTP client of these tests: pip install httpx")
hub = pytest.importorskip("huggingface_hub", reason="the Inference API's client: pip install huggingface_hub")
transformers = pytest.importorskip("transformers")

from serve_helpers import Server, refusal  # noqa: E402 (after the skips: Server runs uvicorn)

TOKENIZER_FILES = ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.json")
TINY = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=512, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
TAGS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}


def _tiny(tmp_path_factory, minilm_dir: Path, hf_class: str, **config) -> Path:
    torch.manual_seed(0)
    model = getattr(transformers, hf_class)(transformers.BertConfig(**TINY, **config)).eval()
    d = tmp_path_factory.mktemp(hf_class)
    model.save_pretrained(d)
    for name in TOKENIZER_FILES:
        if (minilm_dir / name).is_file():
            shutil.copy(minilm_dir / name, d / name)
    return d


@contextlib.contextmanager
def serving(task: str, model_dir: Path, **pipeline_options):
    """(url, bertkit's pipeline, InferenceClient) for a server running ``task`` on ``model_dir``."""
    from bertkit import pipeline
    from bertkit.inference.serve import create_app

    pipe = pipeline(task, model_dir, progress=False, **pipeline_options)
    server = Server(create_app(pipe, str(model_dir), max_wait_ms=1))
    try:
        yield server.url, pipe, hub.InferenceClient(model=f"{server.url}/predict")
    finally:
        server.stop()


@pytest.fixture(scope="module")
def sentences(data_dir) -> list[str]:
    with open(data_dir / "glue/SST-2/dev.tsv", encoding="utf-8") as f:
        return [r["sentence"] for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)][:4]


def _same(got: list, expected: list[dict], keys=("label",)) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        g = g if isinstance(g, dict) else {k: getattr(g, k) for k in (*keys, "score")}
        assert all(g[k] == e[k] for k in keys), (g, e)
        assert abs(g["score"] - e["score"]) < 1e-5, (g, e)


def test_text_classification_answers_as_the_inference_api_and_tei(tmp_path_factory, minilm_dir, sentences):
    d = _tiny(tmp_path_factory, minilm_dir, "BertForSequenceClassification",
              id2label={0: "negative", 1: "neutral", 2: "positive"})
    ref = transformers.pipeline("text-classification", model=str(d), tokenizer=str(d), device="cpu")
    model = transformers.BertForSequenceClassification.from_pretrained(d).eval()
    tok = transformers.BertTokenizerFast.from_pretrained(d)
    with serving("text-classification", d) as (url, _, client):
        for text in sentences:  # every label, best first, softmax: what InferenceClient returns
            _same(client.text_classification(text), ref(text, top_k=None))
        _same(client.text_classification(sentences[0], top_k=2), ref(sentences[0], top_k=2))
        _same(client.text_classification(sentences[0], function_to_apply="sigmoid"),
              ref(sentences[0], top_k=None, function_to_apply="sigmoid"))
        batch = httpx.post(f"{url}/predict", json={"inputs": sentences[:3]}).json()  # one list per input
        assert len(batch) == 3 and all(len(b) == 3 for b in batch)
        _same(batch[2], ref(sentences[2], top_k=None))
        pair = {"text": sentences[0], "text_pair": sentences[1]}
        _same(httpx.post(f"{url}/predict", json={"inputs": pair}).json()[0], ref(pair, top_k=None))

        # TEI: one text gives the flat list {score, label}; raw_scores gives the logits
        with torch.no_grad():
            logits = model(**tok(sentences[0], return_tensors="pt")).logits[0].tolist()
        raw = httpx.post(f"{url}/predict", json={"inputs": sentences[0], "raw_scores": True}).json()
        assert list(raw[0]) == ["score", "label"]
        _same(raw, sorted(({"label": model.config.id2label[i], "score": s} for i, s in enumerate(logits)),
                          key=lambda x: -x["score"]))
        tei = httpx.post(f"{url}/predict", json={"inputs": [[sentences[0]], sentences[:2]], "truncate": True}).json()
        assert len(tei) == 2
        _same(tei[0], ref(sentences[0], top_k=None))
        _same(tei[1], ref({"text": sentences[0], "text_pair": sentences[1]}, top_k=None))
        r = httpx.post(f"{url}/predict", json={"inputs": "long " * 600, "truncate": False})
        assert r.status_code == 422 and "602 tokens, over max_length 512" in r.json()["error"]
        r = httpx.post(f"{url}/embed", json={"inputs": "x"})
        assert r.status_code == 424 and "--task feature-extraction" in r.json()["error"]


def test_predict_reads_a_list_of_one_or_two_strings_as_tei_does(tmp_path_factory, minilm_dir):
    """TEI's /predict reads ["a", "b"] as ONE pair (its PredictInput tries a Sequence before a batch) and ["a"] as one
    text. bertkit read both as batches: a TEI client's pair came back as two single texts' scores ([[...], [...]])."""
    from fastapi.testclient import TestClient

    from bertkit import pipeline
    from bertkit.inference.serve import create_app

    d = _tiny(tmp_path_factory, minilm_dir, "BertForSequenceClassification",
              id2label={0: "negative", 1: "neutral", 2: "positive"})
    ref = transformers.pipeline("text-classification", model=str(d), tokenizer=str(d), device="cpu")
    a, b, c = "a man plays a guitar", "someone makes music", "the cat sleeps"
    pair = ref({"text": a, "text_pair": b}, top_k=None)
    with TestClient(create_app(pipeline("text-classification", d, progress=False), str(d), max_wait_ms=1)) as client:
        def post(inputs, **fields):
            r = client.post("/predict", json={"inputs": inputs, **fields})
            assert r.status_code == 200, r.text
            return r.json()

        tei = post([a, b], truncate=True)  # TEI's answer to one input: the flat list, as for a string
        assert list(tei[0]) == ["score", "label"]
        _same(tei, pair)
        _same(post([a, b])[0], pair)  # the Inference API's answer to one input: [[...]], as for a string
        assert post([a, b]) == post({"text": a, "text_pair": b})
        _same(post([a], raw_scores=False), ref(a, top_k=None))
        assert post([a]) == post(a)
        batch = post([[a, b]], truncate=True)  # a batch of one pair
        assert len(batch) == 1
        _same(batch[0], pair)
        r = client.post("/predict", json={"inputs": [[a, b, c]]})  # TEI's error too; it was called "a tuple"
        assert r.status_code == 422 and refusal(r).startswith("input 0 is a list of 3 values; a list in inputs is "
                                                              "one input, [text] or [text, text_pair]"), r.text
        three = post([a, b, c])  # three strings: three texts (TEI refuses them)
        assert len(three) == 3
        for got, text in zip(three, (a, b, c)):
            _same(got, ref(text, top_k=None))


def test_text_classification_function_to_apply_in_any_case_and_never_beside_raw_scores(tmp_path_factory,
                                                                                         minilm_dir):
    # transformers reads function_to_apply in any case (ClassificationFunction["SIGMOID"]); the server refused
    # "SIGMOID". Sent with TEI's raw_scores true, function_to_apply "softmax" was dropped without a word: the answer
    # was the logits (0.1364 for "c", where softmax gives 0.3489)
    from fastapi.testclient import TestClient

    from bertkit import pipeline
    from bertkit.inference.serve import create_app

    d = _tiny(tmp_path_factory, minilm_dir, "BertForSequenceClassification",
              id2label={0: "negative", 1: "neutral", 2: "positive"})
    ref = transformers.pipeline("text-classification", model=str(d), tokenizer=str(d), device="cpu")
    text = "a gripping film"
    with TestClient(create_app(pipeline("text-classification", d, progress=False), str(d), max_wait_ms=1)) as client:
        for fn in ("SIGMOID", "Softmax", "NONE"):
            r = client.post("/predict", json={"inputs": text, "parameters": {"function_to_apply": fn}})
            assert r.status_code == 200, r.text
            _same(r.json()[0], ref(text, top_k=None, function_to_apply=fn))
        logits = ref(text, top_k=None, function_to_apply="none")
        r = client.post("/predict", json={"inputs": text, "raw_scores": True, "parameters": {"function_to_apply": "none"}})
        _same(r.json(), logits)  # they agree: the logits
        for fn in ("softmax", "Sigmoid"):
            r = client.post("/predict", json={"inputs": text, "raw_scores": True, "parameters": {"function_to_apply": fn}})
            assert r.status_code == 422 and r.json()["error"] == (
                f"raw_scores true answers the logits, and function_to_apply {fn!r} asks for their {fn.lower()} "
                "instead: send one of them (function_to_apply \"none\" is the logits)"), r.text
        r = client.post("/predict", json={"inputs": text, "parameters": {"function_to_apply": "relu"}})
        assert r.status_code == 422 and r.json()["error"] == ('function_to_apply must be "softmax", "sigmoid" or '
                                                              "\"none\" (in any case), got 'relu'")


def test_token_classification_answers_entity_groups(tmp_path_factory, minilm_dir, data_dir):
    from bertkit.tasks.ner import read_conll

    d = _tiny(tmp_path_factory, minilm_dir, "BertForTokenClassification", id2label=TAGS)
    ref = transformers.pipeline("token-classification", model=str(d), tokenizer=str(d), device="cpu",
                                aggregation_strategy="first")
    texts = [" ".join(s.words) for s in read_conll(data_dir / "conll2003" / "valid.txt")[:5]]
    with serving("token-classification", d) as (url, _, client):
        total = 0
        for text in texts:
            got = client.token_classification(text)
            expected = ref(text)
            _same(got, expected, keys=("entity_group", "start", "end"))
            # the word as written (transformers gives the tokenizer's decoding, lowercased by this vocabulary)
            assert all(g.word == text[g.start:g.end] for g in got)
            total += len(got)
        assert total > 5  # a random head tags plenty
        # ignore_labels replaces transformers' default ["O"]: a list without "O" answers the runs of words tagged O
        # as entity groups too (bertkit answered none: 6 groups where transformers answers 7 on this sentence with ["PER"])
        for ignore in (["PER"], [], ["O", "PER"]):
            got = client.token_classification(texts[0], ignore_labels=ignore)
            expected = ref(texts[0], ignore_labels=ignore)
            _same(got, expected, keys=("entity_group", "start", "end"))
            assert all(g.word == texts[0][g.start:g.end] for g in got)
        assert any(e["entity_group"] == "O" for e in ref(texts[0], ignore_labels=[]))
        for strategy in ("average", "max"):  # how a word of several pieces is tagged, as transformers'
            for text in texts:
                _same(client.token_classification(text, aggregation_strategy=strategy),
                      ref(text, aggregation_strategy=strategy), keys=("entity_group", "start", "end"))
        r = httpx.post(f"{url}/predict", json={"inputs": texts[0], "parameters": {"aggregation_strategy": "simple"}})
        assert r.status_code == 422 and r.json()["error"] == (
            'aggregation_strategy must be "first" or "average" or "max" (how a word of several pieces is tagged; bertkit '
            'tags words: "first", the default, as NER models are trained; "none" and "simple" tag each piece on its '
            "own), got 'simple'")
        r = httpx.post(f"{url}/predict", json={"inputs": texts[0], "parameters": {"stride": 16}})
        assert r.status_code == 422 and r.json()["error"].startswith("stride must be left out: bertkit serve tags a ")


def test_token_classification_serves_tags_written_with_an_underscore(tmp_path_factory, minilm_dir):
    # B_PER / I_PER, which the pipeline groups as PER: every request was a 500 (IndexError in ignore_labels' check)
    from fastapi.testclient import TestClient

    from bertkit import pipeline
    from bertkit.inference.serve import create_app

    d = _tiny(tmp_path_factory, minilm_dir, "BertForTokenClassification",
              id2label={0: "O", 1: "B_PER", 2: "I_PER", 3: "B_LOC", 4: "I_LOC"})
    text = "George Washington went to Washington D.C. with John Smith of New York City in 1789."
    pipe = pipeline("token-classification", d)
    entities = pipe(text)["entities"]
    assert {e["entity_group"] for e in entities} == {"PER", "LOC"}
    with TestClient(create_app(pipe, str(d), max_wait_ms=1)) as client:
        r = client.post("/predict", json={"inputs": text})
        assert r.status_code == 200 and r.json() == entities
        r = client.post("/predict", json={"inputs": text, "parameters": {"ignore_labels": ["O", "PER"]}})
        assert r.status_code == 200 and r.json() == [e for e in entities if e["entity_group"] == "LOC"]
        r = client.post("/predict", json={"inputs": text, "parameters": {"ignore_labels": ["PERSON"]}})
        assert r.status_code == 422 and r.json()["error"] == (
            "ignore_labels must be a list of this model's label names (B_LOC, B_PER, I_LOC, I_PER, LOC, O, PER), got "
            "['PERSON']")


def test_fill_mask_answers_the_candidates(tmp_path_factory, minilm_dir, sentences):
    d = _tiny(tmp_path_factory, minilm_dir, "BertForMaskedLM")
    ref = transformers.pipeline("fill-mask", model=str(d), tokenizer=str(d), device="cpu")
    text = sentences[0].replace(sentences[0].split()[1], "[MASK]", 1)
    with serving("fill-mask", d) as (url, _, client):
        for top_k in (None, 3):
            got = client.fill_mask(text, top_k=top_k)
            _same(got, ref(text, top_k=top_k or 5), keys=("token", "token_str", "sequence"))
        targets = ["the", "film", "Movie", "##s"]  # "Movie" is no token of the uncased vocabulary: "movie" instead
        _same(client.fill_mask(text, targets=targets, top_k=3), ref(text, targets=targets, top_k=3),
              keys=("token", "token_str", "sequence"))
        r = httpx.post(f"{url}/predict", json={"inputs": text, "parameters": {"targets": []}})
        assert r.status_code == 422 and r.json()["error"] == (
            "targets must be a string or a non-empty list of strings (the tokens to rank), got []")
        two = httpx.post(f"{url}/predict", json={"inputs": [text, text + " [MASK] ."]}).json()
        assert len(two) == 2 and len(two[0]) == 5 and len(two[1]) == 2 and len(two[1][0]) == 5  # per mask


def test_question_answering_answers_one_span_or_top_k(tmp_path_factory, minilm_dir):
    d = _tiny(tmp_path_factory, minilm_dir, "BertForQuestionAnswering")
    context = ("The Norman dynasty had a major political, cultural and military impact on medieval Europe. "
               "Normandy was settled in the 10th century by Vikings led by Rollo.")
    question = "Who led the Vikings?"
    with serving("question-answering", d) as (url, pipe, client):
        expected = pipe({"question": question, "context": context})
        got = client.question_answering(question=question, context=context)
        assert (got.answer, got.start, got.end) == (expected["answer"], expected["start"], expected["end"])
        assert got.answer == context[got.start:got.end] and abs(got.score - expected["score"]) < 1e-6
        three = client.question_answering(question=question, context=context, top_k=3, max_answer_len=10)
        assert len(three) == 3 and all(a.answer == context[a.start:a.end] for a in three)
        assert three[0].answer == pipe({"question": question, "context": context}, max_answer_length=10)["answer"]


def test_question_answering_align_to_words_widens_answers_to_whole_words(tmp_path_factory, minilm_dir):
    # The Inference API's align_to_words (default true) widens an answer to the words its first and last tokens lie
    # in (transformers' token_to_word and word_to_chars); the server accepted true and answered token spans, half
    # words among them: "ff and Shostakovich wrote symphonies; Prokofiev" (characters 23-70) where the API answers
    # "Rachmaninoff and Shostakovich wrote symphonies; Prokofiev" (13-70)
    d = _tiny(tmp_path_factory, minilm_dir, "BertForQuestionAnswering")
    tok = transformers.BertTokenizerFast.from_pretrained(d)
    context = ("Tchaikovsky, Rachmaninoff and Shostakovich wrote symphonies; Prokofiev, Stravinsky and Mussorgsky "
               "wrote ballets and operas, while Kuechly and Borodin studied chemistry in Petersburg.")
    item = {"question": "Who wrote symphonies?", "context": context}
    enc = tok(context, add_special_tokens=False)

    def widened(a: dict) -> tuple:
        first, last = enc.char_to_token(a["start"]), enc.char_to_token(a["end"] - 1)
        start, end = enc.word_to_chars(enc.token_to_word(first))[0], enc.word_to_chars(enc.token_to_word(last))[1]
        return context[start:end], start, end, a["score"]

    with serving("question-answering", d) as (url, pipe, client):
        spans = pipe(item, top_k=20)["nbest"]
        expected = [widened(a) for a in spans]
        assert sum(e[:3] != (a["answer"], a["start"], a["end"]) for e, a in zip(expected, spans)) >= 3
        for align in (None, True):
            got = client.question_answering(question=item["question"], context=context, top_k=20,
                                            align_to_words=align)
            assert [(g.answer, g.start, g.end) for g in got] == [e[:3] for e in expected]
            assert [g.score for g in got] == pytest.approx([e[3] for e in expected], abs=1e-6)
        tokens = client.question_answering(question=item["question"], context=context, top_k=20, align_to_words=False)
        assert [(g.answer, g.start, g.end) for g in tokens] == [(a["answer"], a["start"], a["end"]) for a in spans]


def test_question_answering_doc_stride_is_the_overlap_between_windows(tmp_path_factory, minilm_dir):
    # The Inference API's doc_stride (and transformers 4's pipeline's) is the overlap of consecutive windows (the
    # tokenizer's stride); the server took it as run_squad.py's step between window starts, so windows other than
    # the API's were read: at doc_stride 16 the answer's score was 0.05529 where the API's windows give 0.05511.
    # bertkit's pipeline takes doc_stride in the same meaning (the windows below are the tokenizer's stride=16 ones)
    d = _tiny(tmp_path_factory, minilm_dir, "BertForQuestionAnswering")
    tok = transformers.BertTokenizerFast.from_pretrained(d)
    context = ("The Norman dynasty had a major political, cultural and military impact on medieval Europe and the "
               "Near East. The Normans were famed for their martial spirit and eventually for their Catholic piety, "
               "becoming exponents of the Catholic orthodoxy into which they assimilated. Normandy was settled in "
               "the 10th century by Vikings led by Rollo, who swore fealty to King Charles III of West Francia.")
    question = "Who led the Vikings?"
    item = {"question": question, "context": context}
    windows = tok(question, context, truncation="only_second", max_length=80, stride=16,
                  return_overflowing_tokens=True)["input_ids"]
    with serving("question-answering", d, max_length=80) as (url, pipe, client):
        rows = pipe.encode(pipe.check_input(item, 0), max_question_length=16, doc_stride=16)
        assert [r["input_ids"] for r in rows] == windows and len(windows) == 2
        expected = pipe(item, max_question_length=16, doc_stride=16)
        got = client.question_answering(question=question, context=context, doc_stride=16, max_question_len=16)
        assert (got.answer, got.start, got.end) == (expected["answer"], expected["start"], expected["end"])
        assert abs(got.score - expected["score"]) < 1e-6
        context_tokens = 80 - len(tok(question, add_special_tokens=False)["input_ids"]) - 3  # a window's
        r = httpx.post(f"{url}/predict", json={"inputs": item, "parameters": {"doc_stride": context_tokens}})
        assert r.status_code == 422 and f"overlap of {context_tokens} tokens" in r.json()["error"], r.text


def test_embeddings_on_predict_and_tei_embed(tmp_path_factory, minilm_dir, sentences):
    d = _tiny(tmp_path_factory, minilm_dir, "BertModel")
    with serving("feature-extraction", d) as (url, pipe, client):
        expected = np.array(pipe(sentences[:2]))  # mean-pooled, not normalised: feature-extraction's default
        got = client.feature_extraction(sentences[0])
        assert got.shape == (1, 32) and np.allclose(got[0], expected[0], atol=1e-5)
        unit = client.feature_extraction(sentences[0], normalize=True)
        assert np.allclose(unit[0], expected[0] / np.linalg.norm(expected[0]), atol=1e-5)

        embed = httpx.post(f"{url}/embed", json={"inputs": sentences[:2]}).json()  # TEI: normalised by default
        assert np.allclose(embed, expected / np.linalg.norm(expected, axis=1, keepdims=True), atol=1e-5)
        one = httpx.post(f"{url}/embed", json={"inputs": sentences[0], "normalize": False}).json()
        assert len(one) == 1 and np.allclose(one[0], expected[0], atol=1e-5)
        short = np.array(httpx.post(f"{url}/embed", json={"inputs": sentences[0], "dimensions": 8}).json())
        assert short.shape == (1, 8) and np.allclose(short[0], expected[0, :8] / np.linalg.norm(expected[0, :8]),
                                                     atol=1e-5)
        r = httpx.post(f"{url}/embed", json={"inputs": "long " * 600, "truncate": False})
        assert r.status_code == 422 and "over max_length 512" in r.json()["error"]
        r = httpx.post(f"{url}/embed", json={"inputs": sentences[0], "dimensions": 33})
        assert r.status_code == 422 and "dimensions must be an int in [1, 32]" in r.json()["error"]
        for ids in ([101, 7592, 102], [[101, 7592, 102]]):  # TEI's /embed takes ids; here they go to /v1/embeddings
            r = httpx.post(f"{url}/embed", json={"inputs": ids})
            assert r.status_code == 422 and "send the ids as the input of /v1/embeddings" in r.json()["error"], r.text

        # sentence similarity: InferenceClient's (on /predict) and TEI's /similarity, cosines of the embeddings
        unit = expected / np.linalg.norm(expected, axis=1, keepdims=True)
        other = np.array(pipe(sentences[2:4]))
        cosines = (other / np.linalg.norm(other, axis=1, keepdims=True)) @ unit[0]
        assert np.allclose(client.sentence_similarity(sentences[0], other_sentences=sentences[2:4]), cosines, atol=1e-5)
        tei = httpx.post(f"{url}/similarity", json={"inputs": {"source_sentence": sentences[0],
                                                               "sentences": sentences[2:4]}}).json()
        assert np.allclose(tei, cosines, atol=1e-5)
        r = httpx.post(f"{url}/similarity", json={"inputs": {"source_sentence": sentences[0], "sentences": []}})
        assert r.status_code == 422 and "source_sentence" in r.json()["error"]


def test_embed_on_a_server_of_token_states_is_refused_and_embed_all_gives_them(tmp_path_factory, minilm_dir, sentences):
    """pooling="none" gives every token's state: /embed, one vector per text, refuses it as /v1/embeddings does (it
    answered each token's vector, each normalised), naming /embed_all, which gives the pipeline's states."""
    d = _tiny(tmp_path_factory, minilm_dir, "BertModel")
    with serving("feature-extraction", d, pooling="none") as (url, pipe, _):
        for path, body in (("/embed", {"inputs": sentences[:2]}), ("/v1/embeddings", {"input": sentences[:2]})):
            r = httpx.post(f"{url}{path}", json=body)
            assert r.status_code == 422 and 'pooling="none"; /embed_all gives every token' in refusal(r), r.text[:200]
        states = httpx.post(f"{url}/embed_all", json={"inputs": sentences[:2]}).json()
        for got, expected in zip(states, pipe(sentences[:2]), strict=True):
            np.testing.assert_allclose(got, expected, atol=1e-5)
