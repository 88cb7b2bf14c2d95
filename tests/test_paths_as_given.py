"""A path a user gives is the file or directory the system opens for it: written where the system would put it (a
``..`` after a symlink is the parent of where the link leads), and what a save wrote loads back from the same
path, as transformers' and sentence-transformers' saves do."""

from __future__ import annotations

import hashlib
import os

import pytest
import torch

from bertkit.cli import main


@pytest.fixture
def linked(tmp_path, monkeypatch):
    """The working directory ``work``: ``link`` leads to ``runs/2026/latest``; ``out`` is a user's directory of
    notes, which ``link/../out`` (that is runs/2026/out) must not touch."""
    work = tmp_path / "work"
    (work / "runs" / "2026" / "latest").mkdir(parents=True)
    (work / "out").mkdir()
    (work / "out" / "notes.txt").write_text("the user's notes")
    (work / "link").symlink_to(work / "runs" / "2026" / "latest")
    monkeypatch.chdir(work)
    return work


def test_a_save_through_a_symlink_and_dotdot_lands_where_the_system_puts_it_and_loads_back(linked, tiny_checkpoint):
    """Was: the path was shortened as text first (``link/..`` dropped), so ``save_pretrained("link/../out")`` wrote
    config.json and model.safetensors into ./out, the user's directory of notes, and
    ``from_pretrained("link/../out")`` then failed ("checkpoint directory link/../out does not exist"), as
    transformers' writes to runs/2026/out."""
    from bertkit import BertForSequenceClassification

    model = BertForSequenceClassification.from_pretrained(tiny_checkpoint(linked / "model", "BertForSequenceClassification",
                                                                          labels=2))
    model.eval()
    model.save_pretrained("link/../out")
    assert sorted(os.listdir(linked / "out")) == ["notes.txt"]
    assert sorted(os.listdir(linked / "runs" / "2026" / "out")) == ["config.json", "model.safetensors"]
    ids = torch.tensor([[2, 5, 6, 3]])
    again = BertForSequenceClassification.from_pretrained("link/../out").eval()
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)


def test_a_command_output_dir_through_a_symlink_and_dotdot_is_the_systems(linked):
    """Was: ``train-tokenizer --output-dir link/../vocab`` wrote ./vocab, not runs/2026/vocab, where ``ls
    link/../vocab`` (and every other program) looks."""
    (linked / "corpus.txt").write_text("a film about a film\nthe cat sat on the mat\n" * 5, encoding="utf-8")
    assert main(["train-tokenizer", "corpus.txt", "--vocab-size", "40", "--no-progress", "--output-dir",
                 "link/../vocab"]) == 0
    assert not (linked / "vocab").exists()
    assert (linked / "runs" / "2026" / "vocab" / "vocab.txt").is_file()
    assert os.path.samefile("link/../vocab/vocab.txt", linked / "runs" / "2026" / "vocab" / "vocab.txt")


@pytest.mark.parametrize("command", [
    ["predict", "text-classification", "--model", "model", "--input", "texts.txt", "--out"],
    ["extract-features", "--model", "model", "--input", "texts.txt", "--layers=-1", "--out"],
    ["export", "onnx", "--model", "model", "--no-verify", "--out"],
], ids=["predict", "extract-features", "export onnx"])
def test_an_output_file_named_with_a_trailing_slash_is_refused_not_written_as_a_file(tmp_path, monkeypatch, capsys,
                                                                                     command):
    """Was: ``--out results/`` (a directory meant) wrote a file named ``results``, exit 0; ``export onnx --out
    model.onnx/`` wrote ``model.onnx``: the slash dropped without a word (Path("results/") is "results"), where the
    system, transformers' and torch's writers refuse to open such a name as a file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "texts.txt").write_text("a film\n")
    with pytest.raises(SystemExit) as usage:  # argparse's usage error, as for an empty path
        main([*command, "results/"])
    assert usage.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith("the output file results/ ends in '/', so it names a directory, not a file: give the file to "
                        "write, results (without the '/') or a file inside that directory"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["texts.txt"]


def test_the_python_writers_of_one_file_refuse_a_trailing_slash_too(tmp_path, tiny_checkpoint):
    from bertkit import BertModel, BertTokenizer
    from bertkit.features import extract_features
    from bertkit.inference.export import export_onnx

    model_dir = tiny_checkpoint(tmp_path / "model", tokenizer=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "film"])
    with pytest.raises(ValueError, match=r"the output file .*/feats.jsonl/ ends in '/', so it names a directory"):
        extract_features(BertModel.from_pretrained(model_dir), BertTokenizer.from_pretrained(model_dir),
                         [("film", None)], f"{tmp_path}/feats.jsonl/", layers=[-1])
    with pytest.raises(ValueError, match=r"the output file .*/model.onnx/ ends in '/', so it names a directory"):
        export_onnx(model_dir, f"{tmp_path}/model.onnx/", verify=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_long_file_name_the_system_allows_is_written(tmp_path):
    """Was: a 230-byte output name (the system allows 255) failed "File name too long", naming bertkit's temporary
    file ``.NAME.RANDOM.PID.bertkit-tmp`` beside it: a long name's temporary files are named by a hash of it."""
    from bertkit.outputs import atomic_write_text, remove_dead_temporaries

    path = tmp_path / ("p" * 240 + ".jsonl")
    atomic_write_text(path, '{"id": 0}\n')
    assert path.read_text() == '{"id": 0}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    # a temporary file a kill left (its pid, 2**22, above any live one) is found by the same hashed prefix
    dead = tmp_path / (".p" + "p" * 39 + "~" + hashlib.sha256(path.name.encode()).hexdigest()[:16]
                       + ".abcdefgh.4194304.bertkit-tmp")
    dead.write_text("torn")
    remove_dead_temporaries(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_a_directory_name_too_long_for_its_staging_name_is_refused_naming_the_limit(tmp_path, tiny_checkpoint):
    """Was: ``save_pretrained`` of a 240-byte name (which transformers writes) raised a bare "[Errno 36] File name
    too long: '.ddd...d.bertkit-staging'"; now the limit and the longest name that works are named, before anything
    is written, and that name works."""
    from bertkit import BertModel

    model = BertModel.from_pretrained(tiny_checkpoint(tmp_path / "model"))
    with pytest.raises(ValueError, match=r": its name is 240 bytes, and bertkit writes the directory beside it first "
                                         r"under a name 18 bytes longer \(.NAME.bertkit-staging\), past the file "
                                         r"system's 255 bytes a name: choose a name of at most 237 bytes"):
        model.save_pretrained(tmp_path / ("d" * 240))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    model.save_pretrained(tmp_path / ("d" * 237))
    assert sorted(os.listdir(tmp_path / ("d" * 237))) == ["config.json", "model.safetensors"]


def test_a_directory_under_a_file_is_refused_naming_the_file(tmp_path, monkeypatch, capsys, tiny_checkpoint):
    """Was: ``--out notes.txt/out`` stopped with "File exists: notes.txt" (quantize) or "Not a directory:
    notes.txt/sub" (train-tokenizer), and ``save_pretrained("notes.txt/out")`` raised a bare FileExistsError: none
    said that notes.txt is a file, where a directory was to be made."""
    from bertkit import BertModel

    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("the user's notes")
    (tmp_path / "corpus.txt").write_text("a film about a film\n" * 5)
    model = BertModel.from_pretrained(tiny_checkpoint(tmp_path / "model"))
    with pytest.raises(ValueError, match=f"^{tmp_path}/notes.txt/out cannot be made: {tmp_path}/notes.txt is a file, not a "
                                         "directory; a save writes a directory of files: pass a path inside a "
                                         "directory$"):
        model.save_pretrained("notes.txt/out")
    assert main(["train-tokenizer", "corpus.txt", "--vocab-size", "30", "--no-progress", "--out",
                 "notes.txt/sub/vocab"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"bertkit train-tokenizer: error: notes.txt/sub/vocab cannot be made: {tmp_path / 'notes.txt'} is a file, "
        "not a directory; a `train-tokenizer` run writes a directory of files: pass a path inside a directory")
    assert (tmp_path / "notes.txt").read_text() == "the user's notes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "model", "notes.txt"]


@pytest.mark.parametrize("argv", [
    ["predict", "text-classification", "--model", "model", "--input", "texts.txt/", "--out", "p.jsonl"],
    ["create-pretraining-data", "texts.txt", "--vocab", "model/vocab.txt/", "--out", "data"],
    ["train-tokenizer", "texts.txt/", "--out", "vocab"],
], ids=["--input", "--vocab", "files"])
def test_an_input_file_named_with_a_trailing_slash_is_refused(tmp_path, monkeypatch, capsys, tiny_checkpoint, argv):
    """Was: ``--input texts.txt/`` read texts.txt (Path drops the slash), where the system refuses to open the name
    (Not a directory): a directory was meant, or a typo."""
    monkeypatch.chdir(tmp_path)
    tiny_checkpoint(tmp_path / "model", tokenizer=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "film"])
    (tmp_path / "texts.txt").write_text("a film\n")
    with pytest.raises(SystemExit) as usage:
        main(argv)
    assert usage.value.code == 2
    named = next(a for a in argv if a.endswith("/"))
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        f"{named} ends in '/', which names a directory, and {named[:-1]} is a file: give {named[:-1]} without the '/'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "texts.txt"]
