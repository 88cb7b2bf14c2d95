"""The sparse-embedding task: ``bertkit.pipeline("sparse-embedding", DIR)``, ``bertkit predict sparse-embedding`` and
``bertkit serve --task sparse-embedding`` (TEI's /embed_sparse) give ``SparseEncoder.encode``'s vectors
(``prompt_name`` "document": ``encode_document``'s, "query": ``encode_query``'s) in every layout
test_sparse_encoder.py's fixture writes: indices identical, values within 1e-5. The wire is TEI's documented shape;
bad input is refused by name before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bertkit.errors import BertkitError
from cases import slow_after

st = pytest.importorskip("sentence_transformers")
import test_sparse_encoder  # noqa: E402  (tests/ is on sys.path under pytest)

LAYOUTS = test_sparse_encoder.LAYOUTS
# its fixtures: the same directories and texts
layouts, texts, vocab_size = test_sparse_encoder.layouts, test_sparse_encoder.texts, test_sparse_encoder.vocab_size

SIDES = (("document", "encode_document"), ("query", "encode_query"))


def _expected(encoder, method: str, texts: list[str]) -> list[list[tuple[int, float]]]:
    """``method``'s vectors as (index, value) pairs per text, in index order."""
    coo = getattr(encoder, method)(texts).coalesce()
    rows, dims = coo.indices()
    return [list(zip(dims[rows == i].tolist(), coo.values()[rows == i].tolist())) for i in range(len(texts))]


def _assert_same(got: list[list[dict]], want: list[list[tuple[int, float]]], summed: bool = False) -> None:
    """Indices identical, values within 1e-5 (sum pooling adds a paragraph's ~150 token weights: 5e-5, as
    test_sparse_encoder.py's bound)."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert [d["index"] for d in g] == [i for i, _ in w]
        assert all(set(d) == {"index", "value"} and type(d["index"]) is int for d in g)
        torch.testing.assert_close(torch.tensor([d["value"] for d in g], dtype=torch.float64),
                                   torch.tensor([v for _, v in w], dtype=torch.float64),
                                   atol=5e-5 if summed else 1e-5, rtol=1e-5)


# sentence-transformers' SPLADE directory in make test; the other layouts in make test-slow (the inference-free one's
# query side is make test's in test_an_inference_free_model_embeds_queries_with_its_static_weights)
@pytest.mark.parametrize("layout", [pytest.param(layout, marks=pytest.mark.slow) if layout != "splade" else layout
                                    for layout in LAYOUTS])
def test_the_pipeline_gives_encode_document_and_encode_query_vectors(layout, layouts, texts):
    from bertkit import pipeline
    from bertkit.sentence import SparseEncoder

    encoder = SparseEncoder(layouts[layout])
    pipe = pipeline("sparse-embedding", layouts[layout], batch_size=8)
    want = {method: _expected(encoder, method, texts) for _, method in SIDES}
    for side, method in SIDES:
        assert sum(map(len, want[method])) > 4 * len(texts)  # the texts do activate word pieces
        _assert_same(pipe(texts, prompt_name=side), want[method], layout == "mlm_transformer")
    _assert_same(pipe(texts), want["encode_document"], layout == "mlm_transformer")
    with pytest.raises(BertkitError, match="return_tokens must be true or false, got 'no'"):
        pipe(texts[0], return_tokens="no")  # a truthy string would have been taken as true, unsaid
    one = pipe(texts[0], return_tokens=True)  # SparseEncoder.decode's pairs, largest first
    values = [d["value"] for d in one]
    assert values == sorted(values, reverse=True)
    decoded = dict(encoder.decode(encoder.encode_document(texts[0])))  # (values within 1e-5 may swap near-ties)
    assert sorted(d["token"] for d in one) == sorted(decoded)
    torch.testing.assert_close(torch.tensor(values), torch.tensor([decoded[d["token"]] for d in one]),
                               atol=5e-5, rtol=1e-5)


def test_an_inference_free_model_embeds_queries_with_its_static_weights(layouts, texts):
    """The query route of the inference-free layout runs no transformer: a query's vector holds exactly its word
    pieces (no special tokens), each at the static weight the table gives it."""
    from bertkit import pipeline
    from bertkit.sentence import SparseEncoder

    encoder = SparseEncoder(layouts["inference_free"])
    pipe = pipeline("sparse-embedding", layouts["inference_free"])
    query = texts[-1]
    got = pipe(query, prompt_name="query")
    ids = sorted(set(encoder.tokenizer(query, add_special_tokens=False)["input_ids"]))
    weight = encoder[0].sub_modules["query"][0].weight
    assert [d["index"] for d in got] == [i for i in ids if weight[i] != 0]
    assert [d["value"] for d in got] == [weight[d["index"]].item() for d in got]
    assert len(pipe(query)) > len(got)  # as a document, the transformer expands it


def test_each_side_is_cut_where_its_route_cuts(layouts, texts, tmp_path):
    """The document transformer cut at 16 tokens leaves the static query side as it is: encode_query cuts a query at
    its tokenizer's model_max_length (512), so the pipeline does; a max_length given cuts both sides."""
    from bertkit import pipeline
    from bertkit.sentence import SparseEncoder

    encoder = SparseEncoder(layouts["inference_free"])
    encoder[0].sub_modules["document"][0].max_seq_length = 16
    encoder.save(tmp_path / "short")
    encoder = SparseEncoder(tmp_path / "short")
    queries = [" ".join(texts[-3:]), texts[0]]  # 36 and 190 word pieces
    want = _expected(encoder, "encode_query", queries)
    pipe = pipeline("sparse-embedding", tmp_path / "short")
    assert [pipe.length(q, "query") for q in queries] == [(36, 512), (190, 512)]
    _assert_same(pipe(queries, prompt_name="query"), want)
    _assert_same(pipe(texts[:2]), _expected(encoder, "encode_document", texts[:2]))
    cut = pipeline("sparse-embedding", tmp_path / "short", max_length=8)(queries, prompt_name="query")
    pieces = [set(encoder.tokenizer(q, add_special_tokens=False)["input_ids"][:8]) for q in queries]
    assert [[d["index"] for d in g] for g in cut] == [[i for i, _ in w if i in p] for w, p in zip(want, pieces)]


def test_without_prompt_name_a_text_gets_the_default_prompt_as_tei_gives_it(layouts, texts, tmp_path):
    """TEI's /embed_sparse puts no prompt before a text unless the request names one (or the server has a default
    prompt), as sentence-transformers' ``encode`` does; the pipeline put the "document" prompt there
    (``encode_document``), so a directory whose document prompt is set gave other vectors than TEI's. Without
    prompt_name: ``encode``'s vectors (the default prompt, a Router's default route); "document" and "query" name
    ``encode_document``'s and ``encode_query``'s."""
    import sentence_transformers as st

    from bertkit import pipeline

    prompts = {"query": "query: ", "document": "passage: "}
    for default in (None, "query"):
        directory = tmp_path / f"prompted-{default}"
        st.SparseEncoder(str(layouts["splade"]), device="cpu", prompts=prompts, default_prompt_name=default).save(
            str(directory))
        theirs = st.SparseEncoder(str(directory), device="cpu")
        pipe = pipeline("sparse-embedding", directory, batch_size=8)
        _assert_same(pipe(texts[-4:]), _expected(theirs, "encode", texts[-4:]))
        for side, method in SIDES:
            _assert_same(pipe(texts[-4:], prompt_name=side), _expected(theirs, method, texts[-4:]))


def test_the_max_active_dims_of_the_model_and_of_the_pipeline(layouts, texts, tmp_path):
    from bertkit import pipeline
    from bertkit.sentence import SparseEncoder

    encoder = SparseEncoder(layouts["splade"], max_active_dims=12)
    encoder.save(tmp_path / "capped")
    want = _expected(SparseEncoder(tmp_path / "capped"), "encode_document", texts)
    assert all(len(w) == 12 for w in want)
    _assert_same(pipeline("sparse-embedding", tmp_path / "capped")(texts), want)
    assert [len(v) for v in pipeline("sparse-embedding", layouts["splade"], max_active_dims=5)(texts[:3])] == [5] * 3


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# inference_free: its query side differs from its document side, so a --prompt-name left unpassed would show
@pytest.mark.parametrize("layout", slow_after(["inference_free", "splade"]))
def test_predict_writes_the_pipelines_vectors(layout, layouts, texts, tmp_path):
    from bertkit import pipeline
    from bertkit.cli import main

    (tmp_path / "in.txt").write_text("\n".join(texts[:10]) + "\n", encoding="utf-8")
    base = ["predict", "sparse-embedding", "--model", str(layouts[layout]), "--input", str(tmp_path / "in.txt"),
            "--batch-size", "4", "--no-progress"]
    assert main([*base, "--output-file", str(tmp_path / "docs.jsonl")]) == 0
    assert main([*base, "--prompt-name", "query", "--output-file", str(tmp_path / "queries.jsonl")]) == 0
    assert main([*base, "--return-tokens", "--output-file", str(tmp_path / "tokens.jsonl")]) == 0
    pipe = pipeline("sparse-embedding", layouts[layout], batch_size=4)
    for name, options in (("docs", {}), ("queries", {"prompt_name": "query"}), ("tokens", {"return_tokens": True})):
        assert _read(tmp_path / f"{name}.jsonl") == [{"id": i, "sparse_embedding": v}
                                                     for i, v in enumerate(pipe(texts[:10], **options))]


# -- bertkit serve ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def served(layouts):
    """{layout: server}: a layout's directory behind bertkit serve, started when a test first asks for it (the
    mlm_transformer one only in `make test-slow`)."""
    pytest.importorskip("uvicorn", reason='bertkit serve needs uvicorn: pip install "bertkit[serve]"')
    from bertkit import pipeline
    from bertkit.inference.serve import create_app
    from bertkit.inference.serve_wire import Limits
    from serve_helpers import Server

    class Servers(dict):
        def __missing__(self, layout):
            pipe = pipeline("sparse-embedding", layouts[layout], batch_size=8, max_length=128)
            self[layout] = Server(create_app(pipe, str(layouts[layout]), max_batch_size=8, max_wait_ms=2,
                                             limits=Limits(max_items=64)))
            return self[layout]

    servers = Servers()
    yield servers
    for server in servers.values():
        server.stop()


# The server hands the texts to the pipeline, whose vectors test_the_pipeline_gives_... compares in every layout:
# inference_free (its query side is another route than its document side) checks that the server passes the side
# on; splade and mlm_transformer (sum pooling) add nothing the pipeline's cases do not check, so they run in
# `make test-slow`.
@pytest.mark.parametrize("layout", slow_after(["inference_free", "splade", "mlm_transformer"]))
def test_embed_sparse_answers_encode_document_and_encode_query(layout, layouts, served, texts):
    """TEI's answer: a list of [{"index", "value"}] per input, one text too; prompt_name "query" selects the query
    side. The server cuts at its max_length (128 here), as encode does at max_seq_length 128."""
    import httpx

    from bertkit.sentence import SparseEncoder

    encoder = SparseEncoder(layouts[layout])
    encoder.max_seq_length = 128
    if layout == "inference_free":  # its static query side cuts at its tokenizer's model_max_length (512), as in
        encoder[0].sub_modules["query"][0].tokenizer.model_max_length = 128  # sentence-transformers; the server at 128
    url = served[layout].url
    summed = layout == "mlm_transformer"
    for side, method in SIDES:
        body = {"inputs": texts[:12], **({"prompt_name": side} if side == "query" else {})}
        r = httpx.post(f"{url}/embed_sparse", json=body, timeout=120)
        assert r.status_code == 200, r.text
        _assert_same(r.json(), _expected(encoder, method, texts[:12]), summed)
    one = httpx.post(f"{url}/embed_sparse", json={"inputs": texts[0], "prompt_name": "document"}, timeout=60)
    assert one.status_code == 200 and len(one.json()) == 1
    _assert_same(one.json(), _expected(encoder, "encode_document", texts[:1]), summed)
    root = httpx.post(f"{url}/", json={"inputs": [texts[1]]}, timeout=60)  # TEI's POST / on this server
    assert root.json() == httpx.post(f"{url}/embed_sparse", json={"inputs": [texts[1]]}, timeout=60).json()


def test_the_wire_is_teis_documented_shape(served, texts, vocab_size):
    """TEI's README example body, and its answer: a JSON list per input of objects with exactly an int "index" and a
    float "value", indices ascending; /info says what TEI's does for a SPLADE model."""
    import httpx

    url = served["splade"].url
    r = httpx.post(f"{url}/embed_sparse", json={"inputs": "I like you.", "truncate": False,
                                                "truncation_direction": "right", "prompt_name": None}, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert isinstance(body, list) and len(body) == 1 and body[0]
    assert all(set(v) == {"index", "value"} and type(v["index"]) is int and type(v["value"]) is float and
               v["value"] > 0 for v in body[0])
    assert [v["index"] for v in body[0]] == sorted({v["index"] for v in body[0]})
    assert int(r.headers["x-compute-tokens"]) == 6  # [CLS] i like you . [SEP]
    info = httpx.get(f"{url}/info").json()
    assert info["model_type"] == {"embedding": {"pooling": "splade"}} and info["task"] == "sparse-embedding"
    assert info["embedding_dimension"] == vocab_size and info["max_input_length"] == 128 and info["auto_truncate"]
    # the Inference API's /predict runs the same pipeline
    p = httpx.post(f"{url}/predict", json={"inputs": "I like you.", "parameters": {"return_tokens": True}},
                   timeout=60).json()
    assert sorted(d["token"] for d in p) == sorted(served_tokens(body[0]))


@pytest.mark.parametrize("side", ["query", "document"])
def test_tokenize_takes_prompt_name_as_embed_sparse_does(served, side):
    """/tokenize with prompt_name on a sparse server answered 500, a plain-text "Internal Server Error" (the pipeline
    had no prompt of its own to give). It gives the tokens of the side's prompt and the text: these directories have
    no prompts, so the text's."""
    import httpx

    r = httpx.post(f"{served['splade'].url}/tokenize", json={"inputs": "I like you.", "prompt_name": side}, timeout=60)
    assert r.status_code == 200, r.text
    assert [(t["id"], t["start"]) for t in r.json()[0]] == [(101, None), (1045, 0), (2066, 2), (2017, 7), (1012, 10),
                                                             (102, None)]


def test_tokenize_gives_the_ids_an_inference_free_query_side_reads(served, layouts):
    """An inference-free model's query side (SparseStaticEmbedding) reads a text's word pieces alone, no [CLS] or
    [SEP], as sentence-transformers' ``preprocess(task="query")`` gives them; /tokenize with prompt_name "query" framed
    them in [CLS] ... [SEP], ids that side never reads. Its document side (a Transformer) keeps them."""
    import httpx

    url, text = served["inference_free"].url, "I like you."
    reference = st.SparseEncoder(str(layouts["inference_free"]), device="cpu")
    for side, want in (("query", [1045, 2066, 2017, 1012]), ("document", [101, 1045, 2066, 2017, 1012, 102])):
        r = httpx.post(f"{url}/tokenize", json={"inputs": text, "prompt_name": side}, timeout=60)
        assert r.status_code == 200, r.text
        assert [t["id"] for t in r.json()[0]] == want == reference.preprocess([text], task=side)["input_ids"][0].tolist()
    assert [(t["text"], t["start"], t["stop"]) for t in r.json()[0][1:-1]] == [("I", 0, 1), ("like", 2, 6),
                                                                              ("you", 7, 10), (".", 10, 11)]


def test_info_names_the_default_prompt_put_before_every_text(layouts, tmp_path):
    """A sparse directory whose default prompt is "query" ("query: "): /embed_sparse without prompt_name embeds
    "query: " + text, as ``encode`` does, yet /info said prompts, default_prompt_name and default_prompt null (an
    embedding server names them), so a client could not know what its texts were embedded as."""
    pytest.importorskip("uvicorn", reason='bertkit serve needs uvicorn: pip install "bertkit[serve]"')
    from fastapi.testclient import TestClient

    from bertkit import pipeline
    from bertkit.inference.serve import create_app

    prompts, directory = {"query": "query: ", "document": ""}, tmp_path / "prompted"
    st.SparseEncoder(str(layouts["splade"]), device="cpu", prompts=prompts, default_prompt_name="query").save(
        str(directory))
    reference = st.SparseEncoder(str(directory), device="cpu")
    with TestClient(create_app(pipeline("sparse-embedding", directory), str(directory))) as client:
        info = client.get("/info").json()
        r = client.post("/embed_sparse", json={"inputs": ["I like you."]})
    assert (info["prompts"], info["default_prompt_name"], info["default_prompt"]) == (prompts, "query", "query: ")
    assert r.status_code == 200, r.text
    _assert_same(r.json(), _expected(reference, "encode", ["I like you."]))
    with TestClient(create_app(pipeline("sparse-embedding", layouts["splade"]), str(layouts["splade"]))) as client:
        info = client.get("/info").json()
    assert (info["default_prompt_name"], info["default_prompt"]) == (None, None)


@pytest.mark.parametrize("kind", ["splade", "inference_free", "cross_encoder"])
def test_a_sparse_or_cross_encoder_directory_run_as_an_embedder_names_its_task(kind, layouts, minilm_2_layers,
                                                                              tmp_path):
    """`bertkit serve --task sentence-embedding` (or predict, a pipeline) on a reranker's or a SPLADE model's directory
    was refused as "lists the modules ['MLMTransformer', 'SpladePooling'] ...; use sentence-transformers for this
    model", though bertkit runs it under another task. It names the directory's model_type and that task."""
    from bertkit import pipeline
    from bertkit.sentence import SentenceTransformer

    directory, name, task = layouts.get(kind), "SparseEncoder", "sparse-embedding"
    if kind == "cross_encoder":
        directory, name, task = tmp_path / "reranker", "CrossEncoder", "rerank"
        st.CrossEncoder(str(minilm_2_layers), num_labels=1, device="cpu").save(str(directory))
    said = (f"{directory} is a {name} directory (config_sentence_transformers.json says model_type '{name}'), not a "
            f"SentenceTransformer's: load it with bertkit.sentence.{name}")
    for make, then in ((lambda: pipeline("sentence-embedding", directory), f", or run it as the {task} task"),
                       (lambda: pipeline("feature-extraction", directory), f", or run it as the {task} task"),
                       (lambda: SentenceTransformer(directory), "")):
        with pytest.raises(BertkitError) as refused:
            make()
        assert said + then in str(refused.value)
    assert pipeline(task, directory).task == task  # what the message names runs it


def served_tokens(pairs: list[dict]) -> list[str]:
    from bertkit.tokenization import BertTokenizer
    from serve_helpers import MODEL

    return BertTokenizer.from_pretrained(MODEL).convert_ids_to_tokens([p["index"] for p in pairs])


@pytest.mark.parametrize("body, status, message", [
    ({"inputs": []}, 422, "inputs must be a string or a non-empty list of strings"),
    ({"inputs": ["fine", "   "]}, 422, "sparse-embedding input 1 is empty"),
    ({"inputs": "x " * 200, "truncate": False}, 422, "input 0 has 202 tokens, over max_length 128; send truncate"),
    ({"inputs": "x", "prompt_name": "passage"}, 422, 'prompt_name must be "query" (encode_query\'s vectors) or'),
    ({"inputs": "x", "normalize": True}, 422, "unknown field(s) normalize; /embed_sparse takes inputs, prompt_name"),
    ({"inputs": "x", "pooling": "splade"}, 422, "unknown field(s) pooling"),
    ({"inputs": "x", "truncation_direction": "LEFT"}, 422, 'truncation_direction must be "right" (keep a text'),
    ({"inputs": [[101, 1037, 102]]}, 422, "/embed_sparse takes texts, not token ids (TEI's takes both): send the text"),
    ({"inputs": ["fine", [101, 102]]}, 422, "/embed_sparse takes texts, not token ids"),
])
def test_embed_sparse_refuses_bad_bodies_by_name(served, body, status, message):
    import httpx

    r = httpx.post(f"{served['splade'].url}/embed_sparse", json=body, timeout=60)
    assert r.status_code == status and message in r.json()["error"], r.text


def test_a_long_input_is_cut_when_truncate_is_unset(served, layouts):
    import httpx

    from bertkit.sentence import SparseEncoder

    encoder = SparseEncoder(layouts["splade"])
    encoder.max_seq_length = 128
    text = "the weather in paris is lovely " * 60
    r = httpx.post(f"{served['splade'].url}/embed_sparse", json={"inputs": text}, timeout=60)
    assert r.status_code == 200
    _assert_same(r.json(), _expected(encoder, "encode_document", [text]))


def test_other_servers_answer_424_on_embed_sparse(tmp_path, minilm_dir):
    pytest.importorskip("uvicorn", reason='bertkit serve needs uvicorn: pip install "bertkit[serve]"')
    from fastapi.testclient import TestClient

    from bertkit import pipeline
    from bertkit.inference.serve import create_app

    app = create_app(pipeline("sentence-embedding", minilm_dir), str(minilm_dir))
    with TestClient(app) as client:
        r = client.post("/embed_sparse", json={"inputs": "x"})
    assert r.status_code == 424 and r.json()["error"] == (
        "/embed_sparse needs a sparse encoder; this server runs sentence-embedding: start it with --task "
        "sparse-embedding")


def test_bad_models_and_inputs_are_refused_before_any_work(minilm_dir, layouts, tmp_path):
    from bertkit import pipeline
    from bertkit.cli import main

    with pytest.raises(BertkitError, match=r"has no masked-LM head \(no cls.predictions weights"):
        pipeline("sparse-embedding", minilm_dir)  # MiniLM as published: an encoder without its head
    with pytest.raises(FileNotFoundError, match="sparse encoder directory .* does not exist"):
        pipeline("sparse-embedding", tmp_path / "absent")
    pipe = pipeline("sparse-embedding", layouts["splade"])
    with pytest.raises(BertkitError, match="sparse-embedding input 1 is empty"):
        pipe(["a text", "\u200b "])
    with pytest.raises(BertkitError, match=r"prompt_name 'passage' is not one of \('document', 'query'\)"):
        pipe("a text", prompt_name="passage")
    with pytest.raises(BertkitError, match="quantize='int8' is not implemented for sparse-embedding"):
        pipeline("sparse-embedding", layouts["splade"], quantize="int8")
    # the int8 directory `bertkit quantize` writes of a masked-LM checkpoint: was refused with "no float weights ...
    # An int8 model ... runs with pipeline(task, directory)", the very call that refused it
    assert main(["quantize", "--model", str(layouts["checkpoint"]), "--output-dir", str(tmp_path / "int8")]) == 0
    with pytest.raises(BertkitError, match=r"int8 is not implemented for sparse-embedding .*: run the float checkpoint"):
        pipeline("sparse-embedding", tmp_path / "int8")
    (tmp_path / "in.txt").write_text("a text\n\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert main(["predict", "sparse-embedding", "--model", str(minilm_dir), "--input", str(tmp_path / "in.txt"),
                 "--output-file", str(out), "--no-progress"]) != 0
    assert not out.exists()


# -- the screened head's memory under the server's mmap threshold ---------------------------------------------------

SCREEN_FAULTS = r'''
import torch
from bertkit.inference.serve_batching import fix_mmap_threshold
from bertkit.sentence.sparse_encoder.screen import ScreenedMaxLogits
def minflt():
    return int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[7])
torch.set_num_threads(1)
assert fix_mmap_threshold()
g = torch.Generator().manual_seed(0)
lengths, H, V = [30, 7, 25, 40, 12, 30, 50, 9, 20, 33, 14, 30], 128, 8192
states, weight = torch.randn(sum(lengths), H, generator=g), torch.randn(V, H, generator=g) * 0.1
screened, faults, got = ScreenedMaxLogits(weight, torch.full((V,), -2.5)), [], []
with torch.inference_mode():
    for _ in range(3):
        before = minflt()
        got.append(screened(states, lengths, 256))
        faults.append(minflt() - before)
print(*faults, int((got[0] > 0).sum()), all(torch.equal(got[0], v) for v in got))
'''


# a child process counting page faults (about 4 s); the kept buffers' values are make test's in
# test_the_screened_head_called_from_threads_at_once_gives_each_its_own_maxima
@pytest.mark.slow
@pytest.mark.skipif(__import__("platform").libc_ver()[0] != "glibc", reason="mallopt's mmap threshold is glibc's")
def test_the_screened_head_reuses_its_buffers_where_the_server_holds_the_mmap_threshold():
    """The server holds glibc's mmap threshold at 128 KiB, so every block over it is a fresh mapping faulted in page
    by page: the screened head's logits, their halving maxima and the recomputed rows were made anew each call
    (6,549 minor faults a repeated call here; MiniLM's head 99 ms a served 16-text batch against 66). They are kept
    buffers now: a repeated call faults in only its (B, V) result, and gives the same vector each time."""
    import subprocess
    import sys

    from bertkit._hardware import int_mm_exact

    if not int_mm_exact():
        pytest.skip("torch._int_mm is not exact on this CPU")
    out = subprocess.run([sys.executable, "-c", SCREEN_FAULTS], capture_output=True, text=True, check=True)
    first, second, third, active, same = out.stdout.split()
    assert same == "True" and int(active) == 27391
    # the result's 12 x 8,192 floats: 96 pages of the 385 a call (6,400-7,300 the first)
    assert int(second) < 450 and int(third) < 450, out.stdout


def test_the_screened_head_called_from_threads_at_once_gives_each_its_own_maxima():
    """The kept buffers are taken by one call at a time: calls from 4 threads at once give what each gives alone."""
    from concurrent.futures import ThreadPoolExecutor

    from bertkit._hardware import int_mm_exact
    from bertkit.sentence.sparse_encoder.screen import ScreenedMaxLogits

    if not int_mm_exact():
        pytest.skip("torch._int_mm is not exact on this CPU")
    g = torch.Generator().manual_seed(0)
    H, V = 32, 2048
    screened = ScreenedMaxLogits(torch.randn(V, H, generator=g) * 0.2, torch.full((V,), -1.5))
    calls = [(torch.randn(n * 6, H, generator=g), [n] * 6) for n in range(1, 17)]
    with torch.inference_mode():
        alone = [screened(s, lengths, 8) for s, lengths in calls]
        with ThreadPoolExecutor(4) as pool:
            together = list(pool.map(lambda c: screened(c[0], c[1], 8), calls * 4))
    assert len(screened.spare) == 1
    for i, got in enumerate(together):
        assert torch.equal(got, alone[i % len(calls)]), i


def test_embed_sparse_truncation_direction_left_embeds_the_end_of_the_text(served):
    """TEI's "Left" on /embed_sparse: a text over max_length 128 is embedded as the tokens transformers' tokenizer keeps
    with truncation_side="left" ([CLS], the last 126, [SEP]); it was refused with a 422."""
    import httpx
    from transformers import BertTokenizerFast

    from serve_helpers import MODEL

    url, text = served["splade"].url, "alpha " * 150 + "the capital of france"
    kept = BertTokenizerFast.from_pretrained(MODEL, truncation_side="left")(text, truncation=True, max_length=128)
    assert len(kept["input_ids"]) == 128
    left, of_kept, right = (httpx.post(f"{url}/embed_sparse", json=body, timeout=60) for body in (
        {"inputs": text, "truncation_direction": "Left"},
        {"inputs": BertTokenizerFast.from_pretrained(MODEL).decode(kept["input_ids"][1:-1])}, {"inputs": text}))
    assert left.status_code == 200, left.text
    assert left.json() == of_kept.json() and left.json() != right.json()
