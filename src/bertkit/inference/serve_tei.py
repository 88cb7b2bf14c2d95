"""The routes that OpenAI's and text-embeddings-inference's (TEI) clients call on ``bertkit serve``:
``/v1/embeddings`` (OpenAI's body and answer), ``/rerank``, ``/tokenize``, ``/embed``, ``/embed_all``, ``/info`` and
TEI's ``POST /``, each one ``Route``, parsed as strictly as ``serve_wire``'s. The routes of one kind of model (/embed,
/rerank, ...) are declared by the tasks that answer them (``tasks.Task.routes``). Their inputs are encoded on the
parser thread, so that each request's tokens are known before it is admitted.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any

from bertkit.errors import BertkitError
from bertkit.inference.serve_wire import (
    NEEDS_EMBEDDING,
    SIMILARITY,
    Call,
    Limits,
    RequestError,
    Route,
    embedding,
    encode,
    fields,
    fitted,
    one_vector,
    read_input,
)


def _is_ids(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)


def embedded_texts(raw: Any, path: str, limits: Limits, instead: str) -> list[str]:
    """The texts of /embed's, /embed_all's or /embed_sparse's ``inputs``. TEI's take token ids there too (decoded to
    their text, which is embedded): ids, alone or among texts, are refused naming what to send ``instead``, where they
    would otherwise be called "not a list of strings"."""
    if _is_ids(raw) or isinstance(raw, list) and any(map(_is_ids, raw)):
        raise RequestError(422, f"{path} takes texts, not token ids (TEI's takes both): {instead}")
    return texts_of(raw, "inputs", limits)


SEND_THE_TEXT = "send the text they are the ids of (/decode gives it), which TEI's embeds in their place"


def texts_of(raw: Any, name: str, limits: Limits) -> list[str]:
    """A str or a non-empty list of str, within max_items and max_text_chars."""
    texts = [raw] if isinstance(raw, str) else raw
    if not (isinstance(texts, list) and texts and all(isinstance(t, str) for t in texts)):
        raise RequestError(422, f"{name} must be a string or a non-empty list of strings, got {str(raw)[:80]!r}")
    limits.check_items(len(texts), name)
    for i, t in enumerate(texts):
        limits.check_chars(len(t), f"{name} {i}")
    return texts


FOREIGN_IDS = ("token ids are this model's, the whole sequence as /tokenize gives it; a client that tokenizes with "
               "another tokenizer must send text (LangChain's OpenAIEmbeddings sends tiktoken's ids unless "
               "check_embedding_ctx_length=False)")


def _encode_ids(pipe: Any, ids: list[int], index: int) -> dict[str, Any]:
    """Token ids as sent, the whole sequence as TEI reads them: [CLS] and [SEP] are the client's to include. Ids of
    another tokenizer (tiktoken's, from OpenAI clients) would embed as a wrong text without an error, so a sequence
    that is not framed by [CLS] ... [SEP] is refused: no id sequence of this model's lacks them. The model's default
    prompt goes after [CLS], as before a text (TEI puts it before the ids' text too), so a text's ids embed as the
    text does."""
    vocab, tok = len(pipe.tokenizer), pipe.tokenizer
    bad = next((x for x in ids if not 0 <= x < vocab), None)
    if bad is not None:
        raise RequestError(422, f"input {index} holds token id {bad}, outside this model's vocabulary [0, {vocab}): "
                                f"{FOREIGN_IDS}")
    if ids[0] != tok.cls_token_id or ids[-1] != tok.sep_token_id:
        raise RequestError(422, f"input {index} does not start with {tok.cls_token} ({tok.cls_token_id}) and end "
                                f"with {tok.sep_token} ({tok.sep_token_id}): {FOREIGN_IDS}")
    if len(ids) == 2:  # [CLS] [SEP]: the ids of an empty text, refused as the text is
        raise RequestError(422, f"input {index} is empty: its token ids are [CLS] and [SEP] alone, the same for every "
                                "empty text; send the ids of a text, or leave it out")
    ids = [ids[0], *pipe.prompt_ids, *ids[1:]]
    if len(ids) > pipe.max_length:
        prompt = f" with the prompt's {len(pipe.prompt_ids)}" if pipe.prompt_ids else ""
        raise RequestError(422, f"input {index} has {len(ids)} token ids{prompt}, over max_length {pipe.max_length}: "
                                f"send at most {pipe.max_length - len(pipe.prompt_ids)} ids, or the text, which is cut "
                                "at max_length")
    return pipe.left_out({"input_ids": ids, "token_type_ids": [0] * len(ids)}, pipe.prompt)


def _openai(data: Any, server: Any) -> Call:
    pipe, limits = server.pipe, server.limits
    one_vector(pipe, "/v1/embeddings")
    encoding = data.pop("encoding_format", None) if isinstance(data, dict) else None  # base64 too, unlike /predict
    if encoding not in (None, "float", "base64"):
        raise RequestError(422, f'encoding_format must be "float" or "base64", got {repr(encoding)[:80]}')
    f = fields(data, "/v1/embeddings", ("input",), ("model", "encoding_format", "dimensions", "user"), server)
    raw = f["input"]
    if isinstance(raw, list) and raw and not any(isinstance(x, (str, list)) for x in raw):
        # neither texts nor lists in it: one text's token ids, where the loop below would blame its first id
        bad = [x for x in raw if not _is_ids([x])]
        if bad:
            raise RequestError(422, f"input is one sequence of token ids, and {json.dumps(bad[0])[:40]} in it is not a "
                                    "token id (an int)")
    if isinstance(raw, str) or _is_ids(raw):
        raw = [raw]  # one text, or one text's token ids
    if not (isinstance(raw, list) and raw):
        raise RequestError(422, "input must be a string, a non-empty list of strings, a list of token ids or a "
                                f"list of lists of token ids, got {str(f['input'])[:80]!r}")
    limits.check_items(len(raw))
    items, chars = [], 0
    for i, x in enumerate(raw):
        if isinstance(x, str):
            limits.check_chars(len(x), f"input {i}")
            items.append(encode(pipe, read_input(pipe, x, i), i, truncate=True))  # cut at max_length, as bertkit does
            chars += len(x)
        elif _is_ids(x):
            items.append(_encode_ids(pipe, x, i))
        else:
            raise RequestError(422, f"input {i} is {type(x).__name__} {str(x)[:60]!r}; input holds strings or "
                                    "non-empty lists of token ids (ints)")
    answer = {"normalize": True, "dimensions": f.get("dimensions"), "encoding_format": encoding or "float"}
    return Call(items, {"rows": True}, answer, cost=len(items), tokens=[len(e["input_ids"]) for e in items],
                chars=chars)


def _rerank(data: Any, server: Any) -> Call:
    from bertkit.inference.base import refuse_empty_text

    pipe, limits = server.pipe, server.limits
    f = fields(data, "/rerank", ("query", "texts"),
               ("raw_scores", "return_text", "truncate", "truncation_direction", "top_n"), server)
    if not isinstance(f["query"], str):
        raise RequestError(422, f"query must be a string, got {str(f['query'])[:80]!r}")
    texts = texts_of(f["texts"], "texts", limits)
    try:  # an empty query: every text would be scored against nothing, and the order would mean nothing
        for where, text in (("query", f["query"]), *((f"text {i}", t) for i, t in enumerate(texts))):
            refuse_empty_text(pipe.tokenizer, text, where)
    except BertkitError as e:
        raise RequestError(422, str(e)) from None
    for i, text in enumerate(texts):
        limits.check_chars(len(f["query"]) + len(text), f"the query with text {i}")
        if not f.get("truncate", True):
            fitted(len(pipe.tokenizer(f["query"], text)["input_ids"]), f"the query with text {i}", pipe, False)
    rows = pipe.encode({"query": f["query"], "texts": texts}, truncation_direction=f.get("truncation_direction", "right"))
    answer = {"texts": texts, "raw_scores": f.get("raw_scores", False), "return_text": f.get("return_text", False),
              "top_n": f.get("top_n")}
    # One model sequence per (query, text) pair: admission, max_items and the model call's bounds count pairs.
    return Call(rows, {"rows": True}, answer, cost=len(texts), tokens=[len(r["input_ids"]) for r in rows],
                chars=sum(len(f["query"]) + len(t) for t in texts))


def _lowered_starts(text: str) -> list[int]:
    """For each character of ``text`` lower-cased a character at a time (as ``BertTokenizer.lowercase``), and for its
    end, where it comes from in ``text``: a character may lower to two ("İ" to "i" and a combining dot)."""
    from bertkit.tokenization.basic import lowercase

    return [*(i for i, c in enumerate(text) for _ in lowercase(c)), len(text)]


def _tokenize(data: Any, server: Any) -> Call:
    """TEI's /tokenize: the tokens of each text as the model reads it (the prompt ``prompt_name`` names first,
    lower-cased where the directory's do_lower_case says, without [CLS] and [SEP] where the route reads none, as an
    inference-free model's static query weights, so that the ids are those ``/v1/embeddings`` embeds as the text), each with its text and offsets in the input as sent (the prompt before it)."""
    pipe, limits = server.pipe, server.limits
    f = fields(data, "/tokenize", ("inputs",), ("add_special_tokens", "prompt_name"), server)
    texts = texts_of(f["inputs"], "inputs", limits)
    try:
        prompt, lowercase, framed = pipe.text_form(f.get("prompt_name"))
    except BertkitError as e:  # a side of a sparse encoder that cannot embed
        raise RequestError(422, str(e)) from None
    if f.get("prompt_name") is not None:  # the prompt's tokens first; start and stop count in the prompted text
        texts = [prompt + t for t in texts]
    out = []
    for text in texts:
        read = pipe.tokenizer.lowercase(text) if lowercase else text
        enc = pipe.tokenizer(read, add_special_tokens=framed and f.get("add_special_tokens", True),
                             return_offsets_mapping=True, return_special_tokens_mask=True)
        at = _lowered_starts(text) if len(read) != len(text) else range(len(text) + 1)
        pieces = pipe.tokenizer.convert_ids_to_tokens(enc["input_ids"])
        out.append([{"id": i, "text": piece, "special": True, "start": None, "stop": None} if special else
                    {"id": i, "text": text[at[a]:at[b]], "special": False, "start": at[a], "stop": at[b]}
                    for i, piece, special, (a, b) in zip(enc["input_ids"], pieces, enc["special_tokens_mask"],
                                                         enc["offset_mapping"])])
    return Call([], {}, {"result": out}, chars=sum(map(len, texts)))


def _decode(data: Any, server: Any) -> Call:
    """TEI's /decode: one text per sequence of token ids, special tokens left out unless ``skip_special_tokens`` is
    false; an id outside the vocabulary is refused (the tokenizer would have no token to write)."""
    pipe, limits = server.pipe, server.limits
    f = fields(data, "/decode", ("ids",), ("skip_special_tokens",), server)
    sequences = [f["ids"]] if _is_ids(f["ids"]) else f["ids"]
    if not (isinstance(sequences, list) and sequences and all(_is_ids(x) for x in sequences)):
        raise RequestError(422, "ids must be a non-empty list of token ids (ints) or a non-empty list of them, got "
                                f"{str(f['ids'])[:80]!r}")
    limits.check_items(len(sequences), "sequences of ids")
    vocab = len(pipe.tokenizer.ids_to_tokens)  # its ids (a token a vocab.txt lists twice counts once in its len)
    for i, ids in enumerate(sequences):
        bad = next((x for x in ids if not 0 <= x < vocab), None)
        if bad is not None:
            raise RequestError(422, f"sequence {i} holds token id {bad}, outside this model's vocabulary [0, {vocab})")
    skip = f.get("skip_special_tokens", True)
    return Call([], {}, {"result": [pipe.tokenizer.decode(ids, skip_special_tokens=skip) for ids in sequences]})


def _embed(data: Any, server: Any, all_tokens: bool = False) -> Call:
    """TEI's /embed: a vector per text, normalised unless ``normalize: false``; ``prompt_name`` puts that prompt of
    the model's before each text, instead of the default prompt. ``all_tokens``, TEI's /embed_all: per text, the last
    layer's state of every token ([CLS], the prompt's, the text's, [SEP]), neither pooled nor normalised
    (sentence-transformers' ``encode(output_value="token_embeddings")``); its rows say so, so the pipeline runs them
    apart from pooled rows of other requests."""
    pipe, limits = server.pipe, server.limits
    path, vector = ("/embed_all", ()) if all_tokens else ("/embed", ("normalize", "dimensions"))
    if not all_tokens:
        one_vector(pipe, path)
    f = fields(data, path, ("inputs",), ("truncate", "truncation_direction", "prompt_name", *vector), server)
    texts = embedded_texts(f["inputs"], path, limits, SEND_THE_TEXT if all_tokens else (
        "send the ids as the input of /v1/embeddings, the whole sequence as /tokenize gives it ([CLS] ... [SEP])"))
    items = [encode(pipe, read_input(pipe, t, i), i, f.get("truncate", True), prompt_name=f.get("prompt_name"),
                    truncation_direction=f.get("truncation_direction", "right"))
             | ({"all_tokens": True} if all_tokens else {}) for i, t in enumerate(texts)]
    answer = {} if all_tokens else {"normalize": f.get("normalize", True), "dimensions": f.get("dimensions")}
    return Call(items, {"rows": True}, answer, cost=len(items), tokens=[len(e["input_ids"]) for e in items],
                chars=sum(map(len, texts)))


def _openai_answer(server: Any, call: Call, results: list[Any]) -> dict[str, Any]:
    import numpy as np

    a, data = call.answer, []
    for i, r in enumerate(results):
        v = embedding(r, a, True)  # dimensions kept, then normalised (OpenAI's and TEI's order)
        # little-endian float32, as OpenAI's base64 answers; a vector holding a NaN or an infinity stays floats, which
        # the answer's JSON encoding refuses (naming where), as it could not once they were base64
        if a["encoding_format"] == "base64" and np.isfinite(packed := np.asarray(v, dtype="<f4")).all():
            v = base64.b64encode(packed.tobytes()).decode("ascii")
        data.append({"object": "embedding", "embedding": v, "index": i})
    tokens = sum(call.tokens)
    return {"object": "list", "data": data, "model": server.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def _info(server: Any) -> dict[str, Any]:
    """TEI's ``GET /info``: the model and this server's limits, under TEI's names; what the model is (``model_type``),
    and for an embedding server the prompt put before every text and the width of its vectors, are its task's
    (``Task.info``)."""
    from bertkit import __version__

    pipe, limits = server.pipe, server.limits
    model_type, described = server.task.info(pipe)
    dtype = "int8" if pipe.quantize == "int8" else "bfloat16" if pipe.bf16 else "float32"
    return {"model_id": server.model_name, "model_sha": None, "model_dtype": dtype,
            "served_model_name": server.model_name, "model_type": model_type,
            "task": pipe.task, "prompts": None, "default_prompt_name": None, "default_prompt": None, **described,
            "max_concurrent_requests": limits.max_concurrent_requests, "max_input_length": pipe.max_length,
            "max_batch_tokens": server.batcher.max_tokens, "max_batch_requests": server.batcher.max_batch_size,
            "max_client_batch_size": limits.max_items, "auto_truncate": True, "tokenization_workers": 1,
            "version": __version__, "sha": None, "docker_label": None}


def _ranked(server: Any, call: Call, results: list[Any]) -> list[dict[str, Any]]:
    """The texts best first, TEI's answer; ``top_n`` (Cohere's and Jina's, which Elasticsearch's hugging_face rerank
    service and LiteLLM's Hugging Face reranker send to TEI's route) keeps the best ``top_n`` of them, in that order. TEI ignores the field and answers every
    text: a client that asked for the best 3 of 100 got 100."""
    a = call.answer  # the reranker's own decoding of its (query, text) logits
    ranks = server.pipe.decode({"texts": a["texts"]}, [], results, raw_scores=a["raw_scores"],
                               return_text=a["return_text"])
    return ranks[:a["top_n"]] if a.get("top_n") else ranks


def _root(server: Any, data: Any) -> Route:
    """The route TEI's ``POST /`` answers as: the server's task's (``Task.root``), or /similarity for the Inference
    API's sentence-similarity body (``inputs`` an object with ``source_sentence``) on a server that has /similarity,
    which ``InferenceClient("http://HOST:PORT").sentence_similarity`` posts there (TEI answers it there when started
    for sentence-similarity)."""
    raw = data.get("inputs") if isinstance(data, dict) else None
    if SIMILARITY in server.task.routes and isinstance(raw, dict) and "source_sentence" in raw:
        return SIMILARITY
    return server.task.root


ROOT = Route("/", "TEI's: /embed on an embedding server (/similarity for a sentence-similarity body), /rerank on a "
             "reranker, /predict otherwise", lambda data, server: _root(server, data).parse(data, server),
             lambda server, call, results: (SIMILARITY if call.answer.get("similarity") else server.task.root).render(
                 server, call, results))
EMBED = Route("/embed", "TEI's: texts -> vectors, normalised unless normalize: false", _embed,
              lambda server, call, results: [embedding(r, call.answer, True) for r in results], needs=NEEDS_EMBEDDING)
EMBED_ALL = Route("/embed_all", "TEI's: texts -> every token's vector, unpooled",
                  lambda data, server: _embed(data, server, all_tokens=True),
                  lambda server, call, results: [r.tolist() for r in results], needs=NEEDS_EMBEDDING)


def _openai_error(message: str, kind: str) -> dict[str, Any]:
    """OpenAI's error body: its clients show ``error.message`` (TEI's ``{"error": str}`` left them "Error code:
    422" and no reason)."""
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


OPENAI = Route("/v1/embeddings", "OpenAI's: {input, model, dimensions, encoding_format} -> unit vectors", _openai,
               _openai_answer, needs=NEEDS_EMBEDDING, error=_openai_error)
# TEI serves OpenAI's route at /embeddings too: the path of a client whose base_url has no /v1
OPENAI_UNVERSIONED = dataclasses.replace(OPENAI, path="/embeddings", help="OpenAI's /v1/embeddings, for a base_url "
                                         "without /v1 (as TEI)")
RERANK = Route("/rerank", "TEI's: {query, texts, top_n} -> the texts by relevance, best first (a cross-encoder)", _rerank,
               _ranked, needs="needs a cross-encoder; this server runs {task}: start it with --task {tasks}")
TOKENIZE = Route("/tokenize", "TEI's: texts -> their tokens", _tokenize,
                 lambda server, call, results: call.answer["result"], model=False)
DECODE = Route("/decode", "TEI's: token ids -> their text", _decode,
               lambda server, call, results: call.answer["result"], model=False)
INFO = Route("/info", "TEI's: the model and this server's limits", get=_info)
