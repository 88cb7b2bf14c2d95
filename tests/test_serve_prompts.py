"""`bertkit serve` on a sentence-transformers directory with a default prompt named "query" ("search: " before every text, left out
of the mean pooling) and a max_seq_length of 16: what TEI's and OpenAI's routes count and embed is the prompted
text, as ``encode`` embeds it. MiniLM cut to two layers (the property does not depend on depth)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("fastapi", reason='bertkit serve needs FastAPI: pip install "bertkit[serve]"')
pytest.importorskip("uvicorn", reason='bertkit serve needs uvicorn: pip install "bertkit[serve]"')
httpx = pytest.importorskip("httpx", reason="the HTTP client of these tests: pip install httpx")

from sentence_helpers import POOLING, st_directory  # noqa: E402
from serve_helpers import Server, refusal  # noqa: E402

TEXT = "A man is playing a guitar."
# 15 tokens alone, 17 after the prompt's two ("search", ":"): over max_seq_length 16 only once prompted
LONG = "one two three four five six seven eight nine ten eleven twelve thirteen"


@pytest.fixture(scope="module")
def prompted(minilm_2_layers, tmp_path_factory):
    """(server URL, the sentence-embedding pipeline, its directory) of a directory whose default prompt is "search: "."""
    from bertkit import pipeline
    from bertkit.inference.serve import create_app

    d = st_directory(minilm_2_layers, tmp_path_factory.mktemp("prompted") / "m", max_seq_length=16,
                     pooling={**POOLING, "include_prompt": False},
                     st_config={"prompts": {"query": "search: ", "document": ""}, "default_prompt_name": "query"})
    pipe = pipeline("sentence-embedding", d, batch_size=8, progress=False)
    assert (pipe.prompt, pipe.left_out({}, pipe.prompt)["prompt_length"], pipe.max_length) == ("search: ", 3, 16)
    server = Server(create_app(pipe, str(d), max_batch_size=8, max_wait_ms=2))
    yield server.url, pipe, d
    server.stop()


def test_a_texts_token_ids_embed_as_the_text_with_the_default_prompt(prompted):
    # The ids /tokenize gives for a text were embedded without the prompt, and the pooling still left out the
    # prompt's place: the text's first two words. TEI puts the default prompt before token ids' text too.
    url, pipe, _ = prompted
    ids = [t["id"] for t in httpx.post(f"{url}/tokenize", json={"inputs": TEXT}).json()[0]]
    assert ids == pipe.tokenizer(TEXT)["input_ids"] and len(ids) == 9
    r = httpx.post(f"{url}/v1/embeddings", json={"input": [ids, TEXT], "encoding_format": "float"})
    assert r.status_code == 200, r.text
    from_ids, from_text = (np.asarray(d["embedding"]) for d in r.json()["data"])
    np.testing.assert_allclose(from_ids, pipe(TEXT), atol=1e-6)
    np.testing.assert_allclose(from_ids, from_text, atol=1e-6)
    assert r.json()["usage"]["prompt_tokens"] == 2 * 11  # each the text's 9 and the prompt's 2
    long_ids = pipe.tokenizer(LONG)["input_ids"]
    r = httpx.post(f"{url}/v1/embeddings", json={"input": long_ids})
    assert r.status_code == 422, r.text
    assert "input 0 has 17 token ids with the prompt's 2, over max_length 16: send at most 14 ids" in refusal(r)


@pytest.mark.parametrize("path, inputs, instead", [
    ("/embed", [101, 1037, 102], "send the ids as the input of /v1/embeddings, the whole sequence as /tokenize"),
    ("/embed", [TEXT, [101, 1037, 102]], "send the ids as the input of /v1/embeddings"),
    ("/embed_all", [[101, 1037, 102]], "send the text they are the ids of (/decode gives it)"),
])
def test_token_ids_where_teis_routes_take_them_are_refused_naming_what_to_send(prompted, path, inputs, instead):
    # TEI's /embed and /embed_all take token ids, alone or among texts; /embed_all's ids and a list mixing texts and
    # ids were refused as "not a list of strings", as if the client had sent something no server reads
    url, _, _ = prompted
    r = httpx.post(f"{url}{path}", json={"inputs": inputs})
    assert r.status_code == 422, r.text
    assert refusal(r).startswith(f"{path} takes texts, not token ids (TEI's takes both): {instead}"), refusal(r)


@pytest.mark.parametrize("path, body", [
    ("/embed", {"inputs": [TEXT, LONG], "truncate": False}),
    ("/predict", {"inputs": [TEXT, LONG], "truncate": False}),
])
def test_truncate_false_counts_the_prompts_tokens(prompted, path, body):
    # The text alone fits (15 tokens); the row the model would read does not (17): it was cut without a word
    url, pipe, _ = prompted
    assert len(pipe.tokenizer(LONG)["input_ids"]) == 15
    r = httpx.post(f"{url}{path}", json=body)
    assert r.status_code == 422, r.text
    assert "input 1 has 17 tokens, over max_length 16" in refusal(r)
    cut = httpx.post(f"{url}{path}", json={**body, "truncate": True})
    assert cut.status_code == 200 and cut.headers["x-compute-tokens"] == str(11 + 16), cut.text
    np.testing.assert_allclose(np.asarray(cut.json()), np.asarray(pipe([TEXT, LONG])), atol=1e-6)


def test_prompt_name_embeds_as_sentence_transformers_with_that_prompt(prompted):
    """TEI's per-request ``prompt_name``: "document" (an empty prompt) and "query" (the default) requests sent at once
    share the server's batches, and each text's vector is sentence-transformers' ``encode(prompt_name=...)``, its
    prompt's tokens left out of the pooling. Before, any prompt_name was refused."""
    from concurrent.futures import ThreadPoolExecutor

    st = pytest.importorskip("sentence_transformers")
    url, pipe, directory = prompted
    reference = st.SentenceTransformer(str(directory), device="cpu")
    texts = [TEXT, LONG, "a woman slices an onion"]
    want = {name: reference.encode(texts, prompt_name=name, normalize_embeddings=True) for name in ("query", "document")}
    assert np.abs(want["query"] - want["document"]).max() > 0.05  # the prompt moves the vectors

    def embed(name):
        return httpx.post(f"{url}/embed", json={"inputs": texts, **({"prompt_name": name} if name else {})})

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(embed, ["document", "query", None] * 2))
    for name, r in zip(["document", "query", "query"] * 2, answers):
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(np.asarray(r.json()), want[name], atol=2e-6)
    np.testing.assert_allclose(np.asarray(pipe(texts, prompt_name="document")), want["document"], atol=2e-6)
    r = httpx.post(f"{url}/predict", json={"inputs": texts, "parameters": {"prompt_name": "document"}})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(np.asarray(r.json()), want["document"], atol=2e-6)

    tokens = httpx.post(f"{url}/tokenize", json={"inputs": TEXT, "prompt_name": "query"}).json()[0]
    assert [t["text"] for t in tokens[1:4]] == ["search", ":", "A"]
    r = httpx.post(f"{url}/embed", json={"inputs": texts, "prompt_name": "passage"})
    assert r.status_code == 422 and "prompt_name must be one of this model's prompts" in refusal(r), r.text
    with pytest.raises(Exception, match="prompt_name 'passage' is not one of this model's prompts: 'query', 'document'"):
        pipe(texts, prompt_name="passage")


def test_embed_all_answers_every_tokens_state_as_sentence_transformers(prompted):
    """TEI's /embed_all: per text, the last layer's state of every token ([CLS], the prompt's, [SEP]), unpooled and
    unnormalised: sentence-transformers' ``encode(output_value="token_embeddings")``. Requests of /embed_all and /embed
    sent at once share the server's batches, and each gets its own shape. Before, the route was a 404."""
    from concurrent.futures import ThreadPoolExecutor

    st = pytest.importorskip("sentence_transformers")
    url, pipe, directory = prompted
    reference = st.SentenceTransformer(str(directory), device="cpu")
    texts = [TEXT, LONG]
    want = {name: reference.encode(texts, prompt_name=name, output_value="token_embeddings")
            for name in ("query", "document")}
    assert [len(v) for v in want["query"]] == [11, 16] and [len(v) for v in want["document"]] == [9, 15]

    def post(body):
        return httpx.post(f"{url}{body.pop('path')}", json=body)

    bodies = [{"path": "/embed_all", "inputs": texts}, {"path": "/embed_all", "inputs": texts, "prompt_name": "document"},
              {"path": "/embed", "inputs": texts}]
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(post, [dict(b) for b in bodies * 2]))
    for name, r in zip(["query", "document"] * 2, answers[0:2] + answers[3:5]):
        assert r.status_code == 200, r.text
        assert [len(v) for v in r.json()] == [len(v) for v in want[name]]
        for got, expected in zip(r.json(), want[name]):
            np.testing.assert_allclose(np.asarray(got), expected.numpy(), atol=2e-5)
    for r in (answers[2], answers[5]):
        np.testing.assert_allclose(np.asarray(r.json()), reference.encode(texts, normalize_embeddings=True), atol=2e-6)
    r = httpx.post(f"{url}/embed_all", json={"inputs": LONG, "truncate": False})
    assert r.status_code == 422 and "input 0 has 17 tokens, over max_length 16" in refusal(r), r.text


def test_inference_clients_sentence_similarity_on_the_servers_root(prompted):
    """huggingface_hub's ``InferenceClient("http://HOST:PORT").sentence_similarity`` posts the Inference API's body
    (``{"inputs": {"source_sentence", "sentences"}, "parameters"}``) to ``POST /``, which is /embed on an embedding
    server: it was refused (422, "unknown field(s) parameters"). It answers the cosines of sentence-transformers'
    vectors, as /similarity and /predict do, and /embed's body on POST / still gives vectors."""
    st = pytest.importorskip("sentence_transformers")
    hub = pytest.importorskip("huggingface_hub")
    url, _, directory = prompted
    reference = st.SentenceTransformer(str(directory), device="cpu")
    others = [LONG, "a woman slices an onion"]
    want = reference.similarity(reference.encode([TEXT]), reference.encode(others))[0].numpy()
    got = hub.InferenceClient(model=url).sentence_similarity(TEXT, other_sentences=others)
    np.testing.assert_allclose(got, want, atol=1e-6)
    r = httpx.post(f"{url}/", json={"inputs": TEXT})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()[0], reference.encode(TEXT, normalize_embeddings=True), atol=2e-6)


def test_openais_client_without_v1_in_its_base_url_reaches_the_embeddings_route(prompted):
    """TEI serves OpenAI's route at /embeddings as well as /v1/embeddings, so ``OpenAI(base_url="http://HOST:PORT")``
    works against it; bertkit answered 404 there. The vectors are sentence-transformers' (default prompt, unit
    length), as on /v1/embeddings."""
    st = pytest.importorskip("sentence_transformers")
    openai = pytest.importorskip("openai")
    url, _, directory = prompted
    want = st.SentenceTransformer(str(directory), device="cpu").encode([TEXT, LONG], normalize_embeddings=True)
    for base in (url, f"{url}/v1"):
        answer = openai.OpenAI(base_url=base, api_key="none", max_retries=0).embeddings.create(model="m",
                                                                                               input=[TEXT, LONG])
        np.testing.assert_allclose(np.asarray([d.embedding for d in answer.data]), want, atol=2e-6)
        assert answer.usage.prompt_tokens == 11 + 16


def test_tokenize_gives_the_ids_a_lower_casing_directory_reads_with_offsets_into_the_text_as_sent(minilm_2_layers,
                                                                                                tmp_path):
    """A directory whose sentence_bert_config.json says do_lower_case over a cased tokenizer reads its texts
    lower-cased (sentence-transformers' Lowercase before the tokenizer). /tokenize gave the cased text's ids ("Man" an
    [UNK] of the uncased vocabulary), so those ids sent back to /v1/embeddings embedded another text than /embed did
    (0.24 apart on MiniLM); with prompt_name on a sparse server (test_sparse_serve.py) it answered 500. Its ids are
    now the ones the model reads, and each token's text and offsets are the input's as sent, past a character that
    lowers to two ("İ": "i" and a combining dot)."""
    import json

    from bertkit import pipeline
    from bertkit.inference.serve import create_app

    d = st_directory(minilm_2_layers, tmp_path / "m", st_config={"prompts": {"query": "Search: "}})
    for name, key, cased in (("tokenizer_config.json", None, {"do_lower_case": False}),
                             ("tokenizer.json", "normalizer", {"lowercase": False})):
        saved = json.loads((d / name).read_text())
        (d / name).unlink()  # a symlink to the checkpoint's file
        (saved[key] if key else saved).update(cased)
        (d / name).write_text(json.dumps(saved))
    (d / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64, "do_lower_case": True}))
    pipe = pipeline("sentence-embedding", d, batch_size=8, progress=False)
    assert pipe.lowercase and pipe.tokenizer("Man", add_special_tokens=False)["input_ids"] == [100]  # cased: [UNK]
    server = Server(create_app(pipe, str(d), max_batch_size=8, max_wait_ms=2))
    try:
        text = "İstanbul: A Man plays."
        for body, sent in (({"inputs": text}, text), ({"inputs": text, "prompt_name": "query"}, "Search: " + text)):
            tokens = httpx.post(f"{server.url}/tokenize", json=body).json()[0]
            assert [t["id"] for t in tokens] == pipe.encode((text, None), **body)[0]["input_ids"]
            words = [(t["id"], t["text"], t["start"], t["stop"]) for t in tokens if not t["special"]]
            at = len(sent) - len(text)  # the prompt's characters
            assert words[-6:] == [(100, "İstanbul", at, at + 8), (1024, ":", at + 8, at + 9), (1037, "A", at + 10, at + 11),
                                  (2158, "Man", at + 12, at + 15), (3248, "plays", at + 16, at + 21),
                                  (1012, ".", at + 21, at + 22)]
        ids = [t["id"] for t in httpx.post(f"{server.url}/tokenize", json={"inputs": text}).json()[0]]
        from_ids = httpx.post(f"{server.url}/v1/embeddings", json={"input": [ids]}).json()["data"][0]["embedding"]
        np.testing.assert_allclose(from_ids, httpx.post(f"{server.url}/embed", json={"inputs": text}).json()[0],
                                   atol=1e-6)
    finally:
        server.stop()


def _served(monkeypatch, **settings):
    """(server, settings) of ``bertkit serve`` run with ``settings`` (ServeSettings' fields) as the command runs it,
    uvicorn's loop left out: the app it builds is served by the test's own ``Server``."""
    import uvicorn

    import bertkit.inference.serve as serve_module
    from bertkit.settings import ServeSettings

    apps = []
    create_app = serve_module.create_app
    monkeypatch.setattr(serve_module, "create_app", lambda *a, **k: apps.append(create_app(*a, **k)) or apps[-1])
    monkeypatch.setattr(serve_module, "fix_mmap_threshold", lambda: False)  # the server process's, not pytest's
    monkeypatch.setattr(serve_module, "bound_onednn_caches", lambda: [])  # likewise: pytest's environment stays
    with monkeypatch.context() as m:  # not the test's own Server's
        m.setattr(uvicorn.Server, "run", lambda self: None)
        serve_module.serve(ServeSettings(port=0, max_batch_size=8, log_level="critical", **settings))
    apps[0].state.stopping.clear()  # set as serve() returned, which would stop every model call
    return Server(apps[0])


def test_serve_prompt_name_is_the_servers_default_and_a_requests_own_wins(prompted, monkeypatch):
    """``bertkit serve --prompt-name document`` (TEI's --default-prompt-name) embeds a text sent without a prompt_name
    as ``SentenceTransformer(default_prompt_name="document").encode`` does, and /info says so; a request's own
    prompt_name still wins, as TEI's. Before, serve had no --prompt-name: the directory's default ("query") was the
    only one a request without prompt_name could get."""
    st = pytest.importorskip("sentence_transformers")
    _, _, directory = prompted
    texts = [TEXT, "Someone is cooking."]
    server = _served(monkeypatch, model_name_or_path=directory, task="sentence-embedding", prompt_name="document")
    try:
        info = httpx.get(f"{server.url}/info").json()
        assert (info["default_prompt_name"], info["default_prompt"]) == ("document", None)
        served = np.asarray(httpx.post(f"{server.url}/embed", json={"inputs": texts}).json())
        asked = np.asarray(httpx.post(f"{server.url}/embed", json={"inputs": texts, "prompt_name": "query"}).json())
    finally:
        server.stop()
    reference = st.SentenceTransformer(str(directory), device="cpu", default_prompt_name="document")
    np.testing.assert_allclose(served, reference.encode(texts), atol=1e-5)
    np.testing.assert_allclose(asked, reference.encode(texts, prompt_name="query"), atol=1e-5)
    assert np.abs(served - asked).max() > 0.05  # the two prompts embed apart: the default was applied


def test_serve_pooling_cls_embeds_a_plain_checkpoint_as_sentence_transformers_cls_pooling(minilm_2_layers,
                                                                                           monkeypatch):
    """``bertkit serve --task feature-extraction --pooling cls`` on a plain BERT checkpoint: [CLS]'s state, as a
    sentence-transformers model of that Transformer and a CLS Pooling, and /info's pooling says "cls". Before, serve
    had no --pooling, and such a checkpoint was served mean-pooled."""
    st = pytest.importorskip("sentence_transformers")
    texts = [TEXT, "Someone is cooking."]
    server = _served(monkeypatch, model_name_or_path=minilm_2_layers, task="feature-extraction", pooling="cls")
    try:
        assert httpx.get(f"{server.url}/info").json()["model_type"] == {"embedding": {"pooling": "cls"}}
        served = np.asarray(httpx.post(f"{server.url}/embed", json={"inputs": texts, "normalize": False}).json())
    finally:
        server.stop()
    transformer = st.models.Transformer(str(minilm_2_layers))
    pool = st.models.Pooling(transformer.get_embedding_dimension(), pooling_mode="cls")
    reference = st.SentenceTransformer(modules=[transformer, pool], device="cpu")
    np.testing.assert_allclose(served, reference.encode(texts), atol=1e-5)


@pytest.mark.parametrize("task, setting, readers", [
    ("fill-mask", {"pooling": "cls"}, "feature-extraction, sentence-embedding"),
    ("text-classification", {"prompt_name": "query"}, "feature-extraction, sentence-embedding"),
    ("sparse-embedding", {"prompt_name": "query"}, "feature-extraction, sentence-embedding"),  # per request there
    # limits on what an answer holds, given to a task whose answers they never limited (they were taken silently)
    ("text-classification", {"max_candidates": 3}, "fill-mask, question-answering"),
    ("sentence-embedding", {"max_candidates": 3}, "fill-mask, question-answering"),
    ("token-classification", {"max_top_k": 3}, "fill-mask, text-classification, question-answering"),
    ("rerank", {"max_top_k": 3}, "fill-mask, text-classification, question-answering"),
])
def test_serve_refuses_a_setting_its_task_does_not_read(tmp_path, task, setting, readers):
    """Refused before anything is read or loaded (the directory does not exist), as predict refuses it. Was, for
    --max-candidates and --max-top-k: `serve --task text-classification --max-candidates 3` started and answered as
    with 1000 (only fill-mask's and question-answering's answers hold candidates), token-classification's
    --max-top-k 3 as with 100 (it takes no top_k)."""
    from bertkit.errors import BertkitError
    from bertkit.inference.serve import serve
    from bertkit.settings import ServeSettings

    name = next(iter(setting)).replace("_", "-")
    with pytest.raises(BertkitError, match=f"^bertkit serve {task} does not read --{name} \\(it is for {readers}\\); "
                                           "leave it out$"):
        serve(ServeSettings(model_name_or_path=tmp_path / "missing", task=task, **setting))


def test_serve_refuses_a_question_answering_length_no_default_request_fits(tmp_path, minilm_2_layers):
    """Was: `serve --task question-answering --max-length 48` loaded the model, started, then refused every request
    with 422 (the question's 64 tokens and 3 specials do not fit) unless it sent max_question_len. Now refused as
    predict refuses it: --max-length before anything is read or loaded (the directory does not exist), a checkpoint
    whose own length is that short once loaded, before the server starts."""
    import json
    import re
    import shutil

    from bertkit.errors import BertkitError
    from bertkit.heads import BertForQuestionAnswering
    from bertkit.inference.serve import serve
    from bertkit.settings import ServeSettings

    fix = re.escape("question-answering cuts each question to 64 tokens, and [CLS] and two [SEP] make 67; raise "
                    "--max-length above 67")
    for length in (48, 67):
        with pytest.raises(BertkitError, match=f"^--max-length {length} leaves no room for a context: {fix}"):
            serve(ServeSettings(model_name_or_path=tmp_path / "missing", task="question-answering", max_length=length))
    d = tmp_path / "qa"
    BertForQuestionAnswering.from_pretrained(minilm_2_layers).save_pretrained(d)
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy(minilm_2_layers / name, d / name)
    config = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 48}))
    with pytest.raises(BertkitError, match=r"^this checkpoint's max_length 48 \(--max-length unset\) leaves no room "
                                           f"for a context: {fix}"):
        serve(ServeSettings(model_name_or_path=d, task="question-answering", port=0))


def test_serve_reads_the_answer_limits_of_the_tasks_that_take_top_k():
    from bertkit.inference.serve import settings_served
    from bertkit.inference.tasks import TASK_LIST

    reads = {t.name: {n for n in settings_served(t) if n.startswith("max_")} for t in TASK_LIST}
    assert reads == {"fill-mask": {"max_top_k", "max_candidates"}, "question-answering": {"max_top_k", "max_candidates"},
                     "text-classification": {"max_top_k"}, **{t: set() for t in (
                         "rerank", "token-classification", "multiple-choice", "feature-extraction", "sentence-embedding",
                         "sparse-embedding")}}
