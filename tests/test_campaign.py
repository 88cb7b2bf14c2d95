"""The reliability campaign beyond the cases the other reliability tests name: bertkit probed as a careless user
and as an attacker would, one probe a line where a table fits, grouped by surface (the tokenizer's __call__, the
collators, checkpoints on disk, the Trainer from a notebook, `bertkit serve`, settings files and flags, the
commands on odd files). Each probe asserts the right behaviour: a result equal to the one it must be, or one
clear error naming the value and the fix (a ``BertkitError``, exit 2 with one line, HTTP 4xx), never a raw error
from deep inside (traceback), a quietly wrong result (silent-wrong), a user's file lost (data-loss), an open
route (open-door) or a wait without end (hang).

Probes of code that is being changed elsewhere are ``xfail(strict=True)``: each names the class of its failure
and the file to fix, and turns into a failure (XPASS) once that file is fixed, when the mark is removed.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

import bertkit
from bertkit.cli import main
from bertkit.errors import BertkitError, MissingFileError
from serve_helpers import refusal  # tests/ is on sys.path under pytest

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "good", "bad", "film", "dull", "fine", "##s", "the", "is",
         "."]


def _ids(table: list) -> list[str]:
    """The first field of each row of a probe table, the probe's name (a pytest.param's too)."""
    return [p.values[0] if hasattr(p, "marks") else p[0] for p in table]


def _owed(cls: str, where: str, what: str):
    """A probe that fails today in code another change owns: ``cls`` of failure, the file to fix, what happens."""
    return pytest.mark.xfail(strict=True, reason=f"{cls} in {where}: {what}")


@pytest.fixture(scope="module")
def tok():
    return bertkit.BertTokenizer({t: i for i, t in enumerate(WORDS)})


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory, tiny_checkpoint) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("campaign")
    return {"enc": tiny_checkpoint(root / "enc", "BertModel", tokenizer=WORDS, max_position_embeddings=16),
            "clf": tiny_checkpoint(root / "clf", "BertForSequenceClassification", tokenizer=WORDS,
                                   labels=["neg", "pos"]),
            "rr": tiny_checkpoint(root / "rr", "BertForSequenceClassification", tokenizer=WORDS, labels=1)}


def _cli(argv: list[object], capsys) -> tuple[int, str]:
    """(exit status, stderr) of ``bertkit argv``; argparse's own refusals (SystemExit) count as their status."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def _one_line_error(code: int, err: str, *said: str) -> None:
    assert code == 2, err
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and all(s in last for s in said), err


# ---------------------------------------------------------------------------------------------------
# the tokenizer's __call__, as a transformers user calls it
# ---------------------------------------------------------------------------------------------------

TEN = "a good film is a fine film . the film is dull"
TOKENIZER_REFUSALS = [
    ("return_tensors tf", ("a",), dict(return_tensors="tf"), "return_tensors='tf' is not supported"),
    ("ragged tensors", (["a", "a good film"],), dict(return_tensors="pt"), "pass padding=True"),
    ("max_length 0", (TEN,), dict(max_length=0, truncation=True), "max_length 0 is smaller than the 2 special"),
    ("max_length -1", (TEN,), dict(max_length=-1, truncation=True), "max_length must be >= 0, got -1"),
    ("only_second on a single", (TEN,), dict(max_length=4, truncation="only_second"), "needs a text_pair"),
    ("truncation 'yes'", (TEN,), dict(truncation="yes", max_length=4), "truncation='yes' is not one of"),
    ("padding 'maybe'", ("a",), dict(padding="maybe"), "padding='maybe' is not one of"),
    ("pad_to_multiple_of 0", (["a", "a good"],), dict(padding=True, pad_to_multiple_of=0),
     "pad_to_multiple_of must be a positive int, got 0"),
    ("pairs of other lengths", (["a", "good"], ["film"]), {}, "text has 2 entries but text_pair has 1"),
    ("an int in the texts", (["a", 3],), {}, "got a list holding int 3"),
    ("None", (None,), {}, "got NoneType None"),
    ("bytes", (b"a good",), {}, "got bytes"),
    ("stride over the window", (TEN,), dict(max_length=6, truncation=True, stride=10, return_overflowing_tokens=True),
     "stride 10 is more than the 4 tokens a window"),
    ("negative stride", (TEN,), dict(max_length=6, truncation=True, stride=-1, return_overflowing_tokens=True),
     "stride=-1 must be >= 0 (the number of tokens consecutive windows share); use 0"),
    ("stride without windows", (TEN,), dict(max_length=6, truncation=True, stride=2),
     "stride=2 needs return_overflowing_tokens=True (the windows it spaces); pass it, or leave stride out"),
    # a pair's windows hold 3 special tokens: told "use max_length > 2", max_length 3 was refused again
    ("max_length 1 pair windows", (TEN, TEN), dict(max_length=1, truncation="only_first", return_overflowing_tokens=True),
     "max_length 1 is smaller than the 3 special tokens each window gets; use max_length > 3"),
    ("overflow longest_first pair", (TEN, TEN), dict(max_length=9, truncation=True, stride=1,
                                                    return_overflowing_tokens=True), "not 'longest_first'"),
    ("max_length 2.5", (TEN,), dict(max_length=2.5, truncation=True), "max_length must be an int"),
    ("max_length '8'", (TEN,), dict(max_length="8", truncation=True), "max_length must be an int"),
]


@pytest.mark.parametrize("name, args, kwargs, said", TOKENIZER_REFUSALS, ids=_ids(TOKENIZER_REFUSALS))
def test_tokenizer_call_refuses_by_name(tok, name, args, kwargs, said):
    with pytest.raises(BertkitError, match=None) as e:
        tok(*args, **kwargs)
    assert said in str(e.value), str(e.value)


def test_tokenizer_windows_cover_the_text_and_share_stride_tokens(tok):
    enc = tok(TEN, max_length=6, truncation=True, stride=2, return_overflowing_tokens=True)
    windows = [ids[1:-1] for ids in enc["input_ids"]]
    whole = tok(TEN, add_special_tokens=False)["input_ids"]
    assert all(len(w) <= 4 for w in windows) and windows[0] == whole[:4]
    assert all(a[-2:] == b[:2] for a, b in zip(windows, windows[1:]))  # stride 2: two tokens shared
    assert windows[-1][-1] == whole[-1]  # the last window reaches the end of the text
    assert tok(["a", "film"], is_split_into_words=True).word_ids() == [None, 0, 1, None]


# ---------------------------------------------------------------------------------------------------
# collators, fed what a notebook feeds them
# ---------------------------------------------------------------------------------------------------


def _pad(tok, **kw):
    return bertkit.DataCollatorWithPadding(tok, **kw)


def _tokens(tok, **kw):
    return bertkit.DataCollatorForTokenClassification(tok, **kw)


COLLATOR_REFUSALS = [
    ("empty batch", _pad, {}, [], "empty batch"),
    ("numpy tensors", _pad, dict(return_tensors="np"), [{"input_ids": [2, 3]}], "PyTorch tensors only"),
    ("no input_ids", _pad, {}, [{"attention_mask": [1, 1]}], "needs input_ids in every example"),
    ("pad_to_multiple_of 0", _pad, dict(pad_to_multiple_of=0), [{"input_ids": [2, 3]}],
     "pad_to_multiple_of must be a positive int, got 0"),
    ("a label of None", _pad, {}, [{"input_ids": [2, 3], "label": None}], "example 0 of the batch has 'label' None"),
    ("one example without its label", _pad, {}, [{"input_ids": [2, 3], "label": 1}, {"input_ids": [2, 5, 3]}],
     "example 1 of the batch has no 'label' but example 0 has one"),
    ("a text column left in", _pad, {}, [{"input_ids": [2, 3], "text": "a"}], "column(s) ['text'] hold text"),
    ("tags as strings", _tokens, {}, [{"input_ids": [2, 5, 3], "labels": ["O", "B", "O"]}],
     "example 0 of the batch has labels ['O', 'B', 'O'] holding 'O'; token labels are class ids"),
    ("a NaN tag", _tokens, {}, [{"input_ids": [2, 5], "labels": [0.0, math.nan]}],
     "example 0 of the batch has labels [0.0, nan] holding nan"),
    ("mlm_probability 0 (an int)", lambda t, **kw: bertkit.DataCollatorForLanguageModeling(t, **kw),
     dict(mlm_probability=0), [{"input_ids": [2, 5, 6, 3]}], ""),
]


@pytest.mark.parametrize("name, make, kwargs, batch, said", COLLATOR_REFUSALS, ids=_ids(COLLATOR_REFUSALS))
def test_a_collator_collates_or_names_the_problem(tok, name, make, kwargs, batch, said):
    if name.startswith("mlm_probability 0"):  # the right answer is a batch with nothing masked
        out = make(tok, **kwargs)(batch)
        assert out["labels"].eq(-100).all() and out["input_ids"].tolist() == [[2, 5, 6, 3]]
        return
    with pytest.raises(BertkitError) as e:
        make(tok, **kwargs)(batch)
    assert said in str(e.value), str(e.value)


def test_token_labels_longer_than_the_input_are_refused(tok):
    with pytest.raises(BertkitError, match="example 0 of the batch has 3 labels for 2 input_ids"):
        _tokens(tok)([{"input_ids": [2, 3], "labels": [0, 1, 2]}])


# ---------------------------------------------------------------------------------------------------
# checkpoints on disk: edited configs, missing files, weights of the wrong kind
# ---------------------------------------------------------------------------------------------------


def _edited(ckpts, tmp_path, config=None, weights=None, replace=None) -> Path:
    import shutil

    from safetensors.torch import load_file, save_file

    d = tmp_path / "edited"
    shutil.copytree(ckpts["clf"], d)
    if config is not None:
        c = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**c, **config}))
    if weights is not None:
        save_file(weights(load_file(d / "model.safetensors")), d / "model.safetensors", metadata={"format": "pt"})
    for name, content in (replace or {}).items():
        target = d / name
        target.unlink()
        if content is None:
            target.mkdir()
        elif content != "":
            target.write_bytes(content)
    return d


LOAD_REFUSALS = [
    ("hidden_size edited", dict(config={"hidden_size": 64}), "hidden_size is 64 but the weights have 32"),
    ("heads that do not divide", dict(config={"num_attention_heads": 5}), "not divisible by num_attention_heads 5"),
    ("one layer fewer", dict(config={"num_hidden_layers": 1}), "num_hidden_layers is 1 but the weights have 2"),
    ("a third label", dict(config={"id2label": {"0": "a", "1": "b", "2": "c"}}), "classifier.weight: file (2, 32)"),
    ("labels with a gap", dict(config={"id2label": {"0": "a", "2": "c"}}), "id2label keys must be 0..n-1"),
    ("hidden_size as a string", dict(config={"hidden_size": "32"}), "hidden_size must be a positive int, got '32'"),
    ("config null", dict(replace={"config.json": b"null"}), "must hold a JSON object, got NoneType"),
    ("config empty", dict(replace={"config.json": b""}), "is not valid JSON"),
    ("config a directory", dict(replace={"config.json": None}), "config.json does not exist"),
    ("weights missing", dict(replace={"model.safetensors": ""}), "weights in"),
    ("weights a directory", dict(replace={"model.safetensors": None}), "weights in"),
    ("weights garbage", dict(replace={"model.safetensors": b"\x10" + b"\0" * 7 + b"{}garbage"}),
     "could not be read as safetensors"),
    ("weights empty", dict(replace={"model.safetensors": b"\0"}), "could not be read as safetensors"),
    ("a tensor of another shape", dict(weights=lambda sd: {k: v[:1] if k == "classifier.weight" else v
                                                          for k, v in sd.items()}), "shape mismatches"),
    ("an extra tensor in the encoder", dict(weights=lambda sd: {**sd, "bert.encoder.layer.0.foo": torch.zeros(1)}),
     "unexpected keys: ['bert.encoder.layer.0.foo']"),
    ("an extra tensor outside the model", dict(weights=lambda sd: {**sd, "foo.bar": torch.zeros(1)}),
     "unexpected keys: ['foo.bar']"),
    ("int32 weights", dict(weights=lambda sd: {k: (v * 100).to(torch.int32) for k, v in sd.items()}), "int32"),
    ("bool weights", dict(weights=lambda sd: {k: v > 0 for k, v in sd.items()}), "bool"),
]


@pytest.mark.parametrize("name, edit, said", LOAD_REFUSALS, ids=_ids(LOAD_REFUSALS))
def test_a_broken_checkpoint_is_refused_naming_what_is_wrong(ckpts, tmp_path, name, edit, said):
    d = _edited(ckpts, tmp_path, **edit)
    with pytest.raises(BertkitError) as e:
        bertkit.AutoModelForSequenceClassification.from_pretrained(d)
    assert said in str(e.value), str(e.value)


def test_nan_weights_are_refused_as_they_load_naming_the_weight(ckpts, tmp_path):
    """With autograd on, PyTorch's CPU attention kernel gave 0 for a NaN query: finite logits from NaN weights."""
    d = _edited(ckpts, tmp_path, weights=lambda sd: {k: v * math.nan if k.endswith("0.attention.self.query.weight")
                                                     else v for k, v in sd.items()})
    with pytest.raises(BertkitError, match=r"NaN or infinite values: \['bert.encoder.layer.0.attention.self.query."
                                           r"weight \(1024 of 1024\)'\]"):
        bertkit.AutoModelForSequenceClassification.from_pretrained(d)


def test_a_hub_name_and_a_file_path_are_named(ckpts):
    with pytest.raises(MissingFileError, match="hf download bert-base-uncased"):
        bertkit.AutoModel.from_pretrained("bert-base-uncased")
    with pytest.raises(MissingFileError, match=r"config.json is a file; pass the directory that holds it \(.*clf\)"):
        bertkit.AutoModel.from_pretrained(ckpts["clf"] / "config.json")


@pytest.mark.parametrize("name", ["my--model", "model.git", "run-", "org/name."])
def test_a_missing_directory_whose_name_is_no_hub_id_is_named_not_a_hub_error(monkeypatch, name):
    """huggingface_hub's HFValidationError ('Cannot have -- or .. in repo_id') came out raw."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(MissingFileError, match=f"checkpoint directory {name} does not exist"):
        bertkit.AutoModel.from_pretrained(name)


def test_save_pretrained_to_a_file_names_it_and_keeps_it(tiny_model, tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    with pytest.raises(BertkitError, match="notes.txt"):
        tiny_model().save_pretrained(f)
    assert f.read_text() == "mine"


@pytest.mark.parametrize("where", [".", "sub"])
def test_a_save_into_the_directory_a_script_works_in_leaves_it_working_there(tiny_model, tmp_path, monkeypatch,
                                                                            where):
    """The save swaps a new directory in; the process's working directory (the saved one, or one inside it) follows,
    so the next save and every relative path still work, and the user's files are where they were."""
    out = tmp_path / "model"
    (out / "sub").mkdir(parents=True)
    (out / "notes.txt").write_bytes(b"mine\n")
    (out / "sub" / "data.txt").write_bytes(b"also mine\n")
    monkeypatch.chdir(out / where)
    tiny_model().save_pretrained(out)
    assert os.getcwd() == str((out / where).resolve())
    bertkit.BertTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]).save_pretrained(".")
    assert Path("vocab.txt" if where == "." else "data.txt").is_file()
    assert (out / "notes.txt").read_bytes() == b"mine\n" and (out / "sub" / "data.txt").read_bytes() == b"also mine\n"
    assert bertkit.BertModel.from_pretrained(out).config.hidden_size == 32


# ---------------------------------------------------------------------------------------------------
# the Trainer from a notebook (beyond the cases of the Trainer's own tests)
# ---------------------------------------------------------------------------------------------------


def _trainer(ckpts, tmp_path, tok, rows, compute_metrics=None, **args):
    args = {"output_dir": str(tmp_path / "out"), "max_steps": 1, "save_strategy": "no",
            "per_device_train_batch_size": 2, "disable_tqdm": True, "report_to": "none", **args}
    return bertkit.Trainer(model=bertkit.AutoModelForSequenceClassification.from_pretrained(ckpts["clf"]),
                           args=bertkit.TrainingArguments(**args), train_dataset=rows, processing_class=tok,
                           compute_metrics=compute_metrics)


def _rows(tok, labels):
    return [{**tok(t), "label": y} for t, y in zip(["a good film", "bad", "dull film", "fine"], labels)]


def test_report_to_an_empty_list_reports_nowhere(tmp_path):
    assert bertkit.TrainingArguments(output_dir=str(tmp_path), report_to=[]).report_to == "none"


@pytest.mark.parametrize("labels, said", [
    ([5, 5, 5, 5], "label 5 at row 0 is not a class of BertForSequenceClassification, whose 2 labels are 0 to 1"),
    ([-1, -1, -1, -1], "label -1 at row 0 is not a class"),
    ([True, False, True, False], "label holds booleans (True/False); give class ids 0/1"),
    ([[0, 1], [1, 0], [0, 1], [1, 0]], "takes one class id per example"),
], ids=["5 on two labels", "-1", "bools", "one-hot lists"])
def test_labels_a_head_cannot_take_are_named(ckpts, tmp_path, tok, labels, said):
    with pytest.raises(BertkitError) as e:
        _trainer(ckpts, tmp_path, tok, _rows(tok, labels)).train()
    assert said in str(e.value), str(e.value)


def test_compute_metrics_that_returns_no_dict_is_named(ckpts, tmp_path, tok):
    with pytest.raises(BertkitError, match="compute_metrics"):
        _trainer(ckpts, tmp_path, tok, None, compute_metrics=lambda p: 0.5).evaluate(_rows(tok, [0, 1, 0, 1]))


# ---------------------------------------------------------------------------------------------------
# `bertkit serve`: bodies, headers and keys an attacker or a careless client sends
# ---------------------------------------------------------------------------------------------------

KEY = "bk-campaign-0123"


@pytest.fixture(scope="module")
def app(ckpts):
    """{"emb": TestClient of an embedding server with an API key, "rr": of a reranker without one}."""
    pytest.importorskip("fastapi", reason='bertkit serve needs FastAPI: pip install "bertkit[serve]"')
    pytest.importorskip("httpx", reason="FastAPI's TestClient needs httpx")
    from fastapi.testclient import TestClient

    from bertkit import pipeline
    from bertkit.inference.serve import create_app

    clients = {"emb": TestClient(create_app(pipeline("sentence-embedding", ckpts["enc"], progress=False),
                                            str(ckpts["enc"]), api_key=KEY, served_model_name="m")),
               "rr": TestClient(create_app(pipeline("rerank", ckpts["rr"], progress=False), str(ckpts["rr"])))}
    for c in clients.values():
        c.__enter__()
    yield clients
    for c in clients.values():
        c.__exit__(None, None, None)


@pytest.mark.parametrize("header", [
    None, "Bearer ", "Bearer", "Basic " + KEY, KEY, "Bearer " + KEY + "x", "Bearer\t" + KEY, "Token " + KEY,
    "Bearer " + KEY[:-1], "Bearer " + KEY.upper(),
])
def test_every_key_but_the_servers_is_refused(app, header):
    headers = {} if header is None else {"Authorization": header}
    r = app["emb"].post("/v1/embeddings", headers=headers, json={"input": "a good film"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "Unauthorized", r.text  # OpenAI's error body
    assert KEY not in r.text


@pytest.mark.parametrize("path", ["/health/", "/HEALTH", "//health", "/metrics", "/info", "/docs",
                                  "/openapi.json", "/tokenize"])
def test_only_health_is_open_however_the_path_is_spelt(app, path):
    assert app["emb"].get(path).status_code == 401
    assert app["emb"].get("/health").status_code == 200


@pytest.mark.parametrize("flags, said", [
    (["--host", ""], "host '' is not an address"),  # uvicorn binds "" to every interface: a door opened unasked
    (["--host", " "], "host ' ' is not an address"),
    (["--host", "127.0.0.1 "], "host '127.0.0.1 ' is not an address"),
    (["--served-model-name", ""], "served model name from --served-model-name ('') is empty"),  # showed the path
    (["--served-model-name", "  "], "is empty or not printable"),
    (["--served-model-name", "a\nb"], "is empty or not printable"),
    (["--api-key", " k"], "the API key from --api-key is not printable ASCII without spaces"),
    (["--port", "70000"], "port must be in [0, 65535], got 70000"),
    (["--max-wait-ms", "nan"], "max_wait_ms must be in [0, 10000], got nan"),
    (["--graceful-shutdown-s", "inf"], "graceful_shutdown_s must be a finite non-negative number, got inf"),
])
def test_serve_settings_that_would_open_or_mislabel_the_server_are_refused(ckpts, monkeypatch, capsys, flags, said):
    import bertkit.inference.serve as serve_module

    served = []
    monkeypatch.setattr(serve_module, "serve", lambda s: served.append(s) or {})
    monkeypatch.delenv("BERTKIT_API_KEY", raising=False)
    code, err = _cli(["serve", "--model", ckpts["enc"], "--task", "sentence-embedding", *flags], capsys)
    _one_line_error(code, err, said)
    assert not served


def test_create_app_refuses_an_empty_served_name(ckpts):
    pytest.importorskip("fastapi", reason='bertkit serve needs FastAPI: pip install "bertkit[serve]"')
    from bertkit.inference.serve import create_app

    pipe = bertkit.pipeline("sentence-embedding", ckpts["enc"], progress=False)
    with pytest.raises(BertkitError, match="served model name from served_model_name"):
        create_app(pipe, str(ckpts["enc"]), served_model_name="")


AUTH = {"Authorization": f"Bearer {KEY}"}
SERVE_REFUSALS = [
    ("dimensions -1", "/v1/embeddings", {"input": "a", "dimensions": -1}, 422, "dimensions must be an int in [1, 32]"),
    ("dimensions 1e30", "/v1/embeddings", {"input": "a", "dimensions": 10**30}, 422, "dimensions must be an int"),
    ("dimensions 4.0", "/v1/embeddings", {"input": "a", "dimensions": 4.0}, 422, "got 4.0"),
    ("dimensions true", "/v1/embeddings", {"input": "a", "dimensions": True}, 422, "got True"),
    ("dimensions '8'", "/v1/embeddings", {"input": "a", "dimensions": "8"}, 422, "got '8'"),
    ("id outside the vocabulary", "/v1/embeddings", {"input": [[2, 5, 3], [2, 99999, 3]]}, 422,
     "input 1 holds token id 99999"),
    ("negative id", "/v1/embeddings", {"input": [-1]}, 422, "token id -1"),
    ("no ids", "/v1/embeddings", {"input": [[]]}, 422, "non-empty lists of token ids"),
    ("ids as booleans", "/v1/embeddings", {"input": [True, False]}, 422, "true in it is not a token id"),
    # [CLS] [SEP] sent as ids is the empty text: it got their vector as if it were a text's
    ("only special ids", "/v1/embeddings", {"input": [[2, 3]]}, 422, "input 0 is empty"),
    ("a list in a list", "/v1/embeddings", {"input": [["a"]]}, 422, "input 0 is list"),
    ("encoding_format FLOAT", "/v1/embeddings", {"input": "a", "encoding_format": "FLOAT"}, 422, "encoding_format"),
    ("model 3", "/v1/embeddings", {"input": "a", "model": 3}, 422, "model must be a string"),
    ("text of zero-width spaces", "/v1/embeddings", {"input": "\u200b\u200b"}, 422, "input 0 is empty"),
    ("truncate false, too long", "/embed", {"inputs": "good " * 30, "truncate": False}, 422,
     "input 0 has 32 tokens, over max_length 16"),
    ("truncation_direction LEFT", "/embed", {"inputs": "good", "truncation_direction": "LEFT"}, 422,
     "truncation_direction must be"),
    ("similarity of no sentences", "/similarity", {"inputs": {"source_sentence": "a", "sentences": []}}, 422,
     "inputs.sentences is empty"),
    ("rerank on an embedder", "/rerank", {"query": "good", "texts": ["a"]}, 424, "/rerank needs a cross-encoder"),
]


@pytest.mark.parametrize("name, path, body, status, said", SERVE_REFUSALS, ids=_ids(SERVE_REFUSALS))
def test_a_bad_body_gets_a_4xx_naming_it(app, name, path, body, status, said):
    r = app["emb"].post(path, headers=AUTH, json=body)
    assert r.status_code == status, r.text
    assert said in refusal(r), r.text


@pytest.mark.parametrize("body, status, said", [
    # a 5,000-digit integer: Python's int() refuses it with a ValueError from inside json (a 500)
    (b'{"input": [2, ' + b"9" * 5000 + b", 3]}", 400, "a number of 5000 digits"),
    (b'{"input": [2, ' + b"9" * 4301 + b", 3]}", 400, "a number of 4301 digits"),
    (b'{"input": [2, ' + b"9" * 4300 + b", 3]}", 422, "input 0 holds token id 9999"),
    (b'{"input": "caf\xe9"}', 400, "not valid JSON"),
    (b"", 400, "not valid JSON"),
    (b"null", 422, "must be a JSON object"),
    (b"a=b", 400, "not valid JSON"),
])
def test_a_body_that_is_not_the_json_asked_for_is_a_4xx(app, body, status, said):
    r = app["emb"].post("/v1/embeddings", headers={**AUTH, "content-type": "application/json"}, content=body)
    assert r.status_code == status, r.text
    assert said in refusal(r), r.text
    assert app["emb"].get("/health").status_code == 200


@pytest.mark.parametrize("body, status, said", [
    ({"query": "", "texts": ["a film", "bad"]}, 422, "query is empty: '' holds no token"),  # ranked on nothing
    ({"query": "  ", "texts": ["a film"]}, 422, "query is empty: '  ' holds no token"),
    ({"query": "good", "texts": ["a film", "\t"]}, 422, "text 1 is empty: '\\t' holds no token"),
    ({"query": ["good"], "texts": ["bad"]}, 422, "query must be a string"),
    ({"query": "good", "texts": []}, 422, "texts must be a string or a non-empty list"),
    ({"query": "good", "texts": ["bad " * 200], "truncate": False}, 422, "over max_length 128"),
    ({"query": "good", "texts": ["bad"], "return_text": "yes"}, 422, "return_text must be true or false"),
])
def test_a_bad_rerank_gets_a_422_naming_it(app, body, status, said):
    r = app["rr"].post("/rerank", json=body)
    assert r.status_code == status, r.text
    assert said in r.json()["error"], r.text


def test_a_rerank_answer_is_the_pipelines_order(app, ckpts):
    texts = ["a film", "bad", "a good film", "dull"]
    got = app["rr"].post("/rerank", json={"query": "good film", "texts": texts, "return_text": True}).json()
    want = bertkit.pipeline("rerank", ckpts["rr"], progress=False)({"query": "good film", "texts": texts})
    assert [g["index"] for g in got] == [w["index"] for w in want]
    assert all(g["text"] == texts[g["index"]] for g in got)
    assert all(math.isclose(g["score"], w["score"], abs_tol=1e-6) for g, w in zip(got, want))


# ---------------------------------------------------------------------------------------------------
# settings files (--config) and flags
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lines(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("input") / "in.txt"
    p.write_text("a good film\nbad ||| dull\n")
    return p


CONFIG_FILES = [
    ("not UTF-8", "c.json", b'{"layers": "-1", "note": "caf\xe9"}', ("is not UTF-8 text (byte 29: b'\\xe9')", "save it as UTF-8")),
    ("UTF-16", "c.json", '{"layers": "-1"}'.encode("utf-16"), ("is not UTF-8 text (byte 0",)),
    ("a key twice", "c.json", b'{"layers": "-1", "layers": "0"}', ("the setting 'layers' is given twice",)),
    ("layers not ints", "c.json", b'{"layers": "-1,a"}', ("layers: expected a comma-separated list of int",)),
]


@pytest.mark.parametrize("name, file, content, said", CONFIG_FILES, ids=_ids(CONFIG_FILES))
def test_a_settings_file_bertkit_cannot_read_is_named_in_one_line(ckpts, lines, tmp_path, capsys, name, file, content,
                                                                 said):
    """Each was a raw UnicodeDecodeError; the key given twice quietly took the last value."""
    cfg = tmp_path / file
    cfg.write_bytes(content)
    out = tmp_path / "f.jsonl"
    code, err = _cli(["extract-features", "--config", cfg, "--model", ckpts["enc"], "--input", lines,
                      "--output-file", out, "--max-seq-length", 16, "--no-progress"], capsys)
    _one_line_error(code, err, str(cfg) if "layers" not in name else "", *said)
    assert not out.exists()


def test_a_settings_file_with_a_byte_order_mark_is_read(ckpts, lines, tmp_path, capsys):
    cfg = tmp_path / "c.json"
    cfg.write_bytes(b"\xef\xbb\xbf" + json.dumps({"layers": [-1]}).encode())
    out = tmp_path / "f.jsonl"
    code, err = _cli(["extract-features", "--config", cfg, "--model", ckpts["enc"], "--input", lines,
                      "--output-file", out, "--max-seq-length", 16, "--no-progress"], capsys)
    assert code == 0, err
    assert [layer["index"] for layer in json.loads(out.read_text().splitlines()[0])["features"][0]["layers"]] == [-1]
    code, err = _cli(["extract-features", "--config", tmp_path, "--model", ckpts["enc"], "--input", lines,
                      "--output-file", tmp_path / "g.jsonl", "--max-seq-length", 16], capsys)
    _one_line_error(code, err, "is a directory")


@pytest.mark.parametrize("layers, written", [
    ("-1", [-1]), ("0", [0]), ("2", [2]), ("-3", [-3]), ("1,-1", [1, -1]), ("-0", [0]),
    ("2,-1", "layers 2 and -1 in [2, -1] are the same hidden state of this model (2 layers: -1 = 2)"),
    ("1,,2", "expected a comma-separated list of int, got '1,,2'"),  # a layer left out, not the list 1,2
    ("3", "layer 3 does not exist: this model has 3 hidden states"), ("-4", "layer -4 does not exist"),
    ("", "give at least one layer index"), ("a", "--layers: expected a comma-separated list of int, got 'a'"),
    ("0:2", "expected a comma-separated list of int, got '0:2'"), ("all", "got 'all'"),
])
def test_extract_features_layer_specs(ckpts, lines, tmp_path, capsys, layers, written):
    out = tmp_path / "f.jsonl"
    code, err = _cli(["extract-features", "--model", ckpts["enc"], "--input", lines, "--output-file", out,
                      f"--layers={layers}", "--max-seq-length", 16, "--no-progress"], capsys)
    if isinstance(written, str):  # "invalid <lambda> value: 'a'" named neither the form nor an example
        _one_line_error(code, err, written)
        assert not out.exists()
        return
    assert code == 0, err
    first = json.loads(out.read_text().splitlines()[0])["features"][0]["layers"]
    assert [layer["index"] for layer in first] == written


# ---------------------------------------------------------------------------------------------------
# a command's output and the user's files
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command, name, refused_as", [
    # the model's vocabulary, replaced by its own predictions (now refused by its name already: no JSON lines file)
    (["predict", "text-classification"], "vocab.txt", "predict writes JSON lines (one object per input), not text"),
    (["predict", "text-classification"], "config.json", None),
    (["extract-features", "--layers=-1", "--max-seq-length", 16], "model.safetensors", None),  # the weights
])
def test_an_output_file_never_replaces_a_file_of_the_model_it_reads(ckpts, lines, tmp_path, capsys, command, name,
                                                                    refused_as):
    import shutil

    model = shutil.copytree(ckpts["clf"], tmp_path / "model")
    before = (model / name).read_bytes()
    code, err = _cli([*command, "--model", model, "--input", lines, "--output-file", model / name, "--overwrite",
                      "--no-progress"], capsys)
    _one_line_error(code, err, refused_as or f"would replace a file of the command's own input --model-name-or-path "
                                             f"{model}")
    assert (model / name).read_bytes() == before
    code, err = _cli([*command, "--model", model, "--input", lines, "--output-file", model / "out.jsonl",
                      "--no-progress"], capsys)  # a new file beside the model's is still fine
    assert code == 0 and (model / "out.jsonl").is_file(), err


def test_export_never_replaces_the_weights_it_exports(ckpts, tmp_path, capsys):
    """`export onnx --output-file MODEL/model.safetensors --overwrite` replaced the checkpoint by its ONNX graph."""
    import shutil

    model = shutil.copytree(ckpts["clf"], tmp_path / "model")
    before = (model / "model.safetensors").read_bytes()
    code, err = _cli(["export", "onnx", "--model", model, "--output-file", model / "model.safetensors", "--overwrite",
                      "--no-verify"], capsys)
    _one_line_error(code, err, f"would replace a file of the command's own input --model {model}")
    assert (model / "model.safetensors").read_bytes() == before


def test_export_onnx_from_python_never_replaces_the_weights_it_exports(ckpts, tmp_path):
    """export_onnx(model_dir, out=model_dir/"model.safetensors", overwrite=True) replaced the checkpoint: only the
    command line passed the model as an input the output must not be."""
    import shutil

    from bertkit.inference.export import export_onnx

    model = shutil.copytree(ckpts["clf"], tmp_path / "model")
    before = (model / "model.safetensors").read_bytes()
    with pytest.raises(BertkitError, match="would replace a file of the command's own input --model"):
        export_onnx(model, model / "model.safetensors", overwrite=True, verify=False)
    assert (model / "model.safetensors").read_bytes() == before


@pytest.mark.parametrize("where", ["equal", "holding"])
def test_quantize_checkpoint_from_python_never_writes_over_the_model_it_quantizes(ckpts, tmp_path, where):
    """quantize_checkpoint(model_dir, model_dir) replaced the float model's config.json (and tokenizer files) with
    the int8 model's: only the command line passed the model as an input the output must not be."""
    import shutil

    from bertkit.quantization import quantize_checkpoint

    model = shutil.copytree(ckpts["clf"], tmp_path / "float" / "model")
    before = {p.name: p.read_bytes() for p in model.iterdir()}
    out = model if where == "equal" else model.parent
    how = "is" if where == "equal" else "holds"
    with pytest.raises(BertkitError, match=f"output_dir {out} {how} the command's own input --model {model}"):
        quantize_checkpoint(model, out)
    assert {p.name: p.read_bytes() for p in model.iterdir()} == before
    assert sorted(p.name for p in out.iterdir()) == sorted(before if where == "equal" else ["model"])


def test_a_refused_output_directory_of_the_users_is_left_as_it_was(ckpts, tmp_path, capsys):
    """The refusal left a .bertkit-lock behind in the user's directory."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("x")
    code, err = _cli(["quantize", "--model", ckpts["clf"], "--output-dir", mine, "--overwrite"], capsys)
    _one_line_error(code, err, "bertkit did not write there (e.g. notes.txt)")
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


# ---------------------------------------------------------------------------------------------------
# the commands on odd corpora and files
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vocab(tmp_path_factory, tok) -> Path:
    d = tmp_path_factory.mktemp("vocab")
    tok.save_pretrained(d)
    return d


CORPORA = [
    ("empty", b"", "the corpus is empty"),
    ("blank lines", b"\n\n\n", "no text found"),
    ("one sentence", b"a good film.\n", "none of the 1 documents has two or more sentences"),
    ("latin-1", "a good caf\xe9.\n".encode("latin-1"), "line 1 (byte offset 10) is not valid UTF-8"),
    ("NUL bytes", b"a\x00good\n", "no text found"),
]


@pytest.mark.parametrize("name, content, said", CORPORA, ids=_ids(CORPORA))
def test_create_pretraining_data_on_an_odd_corpus_names_it(vocab, tmp_path, capsys, name, content, said):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(content)
    code, err = _cli(["create-pretraining-data", corpus, "--vocab", vocab, "--output-dir", tmp_path / "out",
                      "--max-seq-length", 16, "--max-predictions-per-seq", 2, "--dupe-factor", 1, "--no-progress",
                      "--num-workers", 1], capsys)
    _one_line_error(code, err, said)
    assert not list((tmp_path / "out").glob("shard-*"))


def test_a_refused_corpus_leaves_nothing_that_refuses_the_rerun(vocab, tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"\n\n")
    argv = ["create-pretraining-data", corpus, "--vocab", vocab, "--output-dir", tmp_path / "out",
            "--max-seq-length", 16, "--max-predictions-per-seq", 2, "--dupe-factor", 1, "--no-progress",
            "--num-workers", 1, "--input-format", "sentences"]
    assert _cli(argv, capsys)[0] == 2
    corpus.write_text("a good film .\nthe film is dull .\n\nbad .\nfine .\n")
    code, err = _cli(argv, capsys)
    assert code == 0, err


def test_a_flag_another_command_has_is_unknown_here_not_a_prefix(vocab, tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a good film .\nthe film is dull .\n")
    code, err = _cli(["create-pretraining-data", "--input", corpus, "--vocab", vocab, "--output-dir", tmp_path / "o"],
                     capsys)
    _one_line_error(code, err, "--input")
    assert "--input-format" not in err


def test_an_output_dir_inside_a_model_a_bertkit_run_wrote_is_refused(ckpts, tmp_path, capsys):
    """`finetune classify --model RUN/best --output-dir RUN/best/sub` was accepted: the model directory holds no
    manifest of its own (RUN's records it), and a later `--overwrite` of RUN removed the nested run's model."""
    train = tmp_path / "train.csv"
    train.write_text("text,label\na good film,pos\nthe film is dull,neg\n")
    args = ["finetune", "classify", "--train-file", train, "--validation-file", train, "--max-steps", 1,
            "--no-progress"]
    assert _cli([*args, "--model", ckpts["clf"], "--output-dir", tmp_path / "run"], capsys)[0] == 0
    model = tmp_path / "run" / "best"
    code, err = _cli([*args, "--model", model, "--output-dir", model / "sub"], capsys)
    _one_line_error(code, err, f"is inside the command's own input --model-name-or-path {model}")
    assert not (model / "sub").exists() and not list(model.glob(".*bertkit*"))
