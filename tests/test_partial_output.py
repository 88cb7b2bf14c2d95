"""What a resumed `extract-features` takes from the record of a run cut short (``feature_files.resume_point``):
only what the partial files beside the output still prove, each read once (tests/test_output_resume.py resumes one
under torchrun); how a shard is written so that it is on disk once; and the one refusal of a resume under another plan.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct

import pytest

from bertkit.feature_files import resume_point
from bertkit.partial_output import PartialOutput, partial_path


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _resuming(out, progress: dict) -> PartialOutput:
    """The partial write of ``out`` as a resume finds it: ``progress`` its record's."""
    partial = PartialOutput(out, "extract-features", {}, resume=True, overwrite=False)
    partial.progress = progress
    return partial


def test_resume_point_keeps_the_jsonl_rows_its_file_proves_and_drops_a_torn_file(tmp_path):
    out = tmp_path / "f.jsonl"
    partial_path(out).write_bytes(b"row0\nrow1\nrow2\nrow3\nro")  # four rows recorded, a fifth torn by the kill
    units = [[[0, 1], [2, 3], [4]]]
    entry = {"rows": 4, "bytes": 20, "sha256": _sha(b"row0\nrow1\nrow2\nrow3\n")}
    assert resume_point(_resuming(out, {"f.jsonl": entry}), out, [out], units) == ({"f.jsonl": entry}, {(0, 0), (0, 1)})
    partial_path(out).write_bytes(b"row0\nrow1\nrow")  # shorter than its record: every unit is made again
    assert resume_point(_resuming(out, {"f.jsonl": entry}), out, [out], units) == ({}, set())


def test_a_resumed_jsonl_extraction_reads_its_recorded_rows_once(tmp_path, monkeypatch, tiny_model):
    """Was: a resumed .jsonl extraction read the rows recorded twice, ``resume_point`` proving them against their
    sha256 and the ``Appender`` hashing them again to go on with the digest: a second full read of a features file
    that may be gigabytes. Now the proof's digest goes on with the rows to come: their bytes are read once."""
    import builtins

    from bertkit import BertTokenizer, features

    tok = BertTokenizer({t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "good",
                                                     "dull", "film"])})
    model = tiny_model()
    texts = [(t, None) for t in ("a good film", "a dull film", "good", "a film", "dull dull film", "a good dull film")]
    options = dict(layers=[-1, -2], batch_size=1, chunk_size=2, progress=False)  # three units of two lines
    whole = tmp_path / "whole.jsonl"
    features.extract_features(model, tok, texts, whole, **options)
    run, calls = features.run_batches, []

    def cut(*args, **kwargs):  # Ctrl-C as the third unit starts: two recorded
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return run(*args, **kwargs)

    out = tmp_path / "out.jsonl"
    monkeypatch.setattr(features, "run_batches", cut)
    with pytest.raises(KeyboardInterrupt):
        features.extract_features(model, tok, texts, out, **options)
    monkeypatch.undo()
    recorded = json.loads(partial_path(out, ".json").read_text())["progress"]["out.jsonl"]
    assert recorded["rows"] == 4
    opened, read = builtins.open, []

    class Counted:  # the partial file, its reads counted
        def __init__(self, f):
            self.f = f

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def read(self, n=-1):
            data = self.f.read(n)
            read.append(len(data))
            return data

    def counted(file, *args, **kwargs):
        f = opened(file, *args, **kwargs)
        return Counted(f) if os.fspath(file) == os.fspath(partial_path(out)) else f

    monkeypatch.setattr(builtins, "open", counted)
    features.extract_features(model, tok, texts, out, resume=True, **options)
    monkeypatch.undo()
    assert sum(read) == recorded["bytes"] > 0, read
    assert out.read_bytes() == whole.read_bytes()


def test_resume_point_drops_a_changed_shard_and_the_units_after_it(tmp_path):
    out = tmp_path / "s.safetensors"
    files = [tmp_path / "s-00001-of-00002.safetensors", tmp_path / "s-00002-of-00002.safetensors"]
    partial_path(files[0]).write_bytes(b"shard one")
    partial_path(files[1]).write_bytes(b"head" + b"ab" + b"cd")  # a 4-byte head, 2 layers of a 2-byte row each
    units = [[[0], [1]], [[2], [3]]]
    state = {"extraction": "e1", "shards": [_sha(b"shard one")], "units": 1, "bytes": 8, "layout": [4, 2, 2],
             "unit_sha256": [[0, 1, _sha(b"ac")]]}  # unit 0's row: the first byte of each layer
    assert resume_point(_resuming(out, {"safetensors": state}), out, files, units) == (
        {"safetensors": state}, {(0, 0), (0, 1), (1, 0)})
    partial_path(files[0]).write_bytes(b"shard 0ne")
    # the extraction's id is kept: the shards proven, and those made again, are one extraction's
    assert resume_point(_resuming(out, {"safetensors": state}), out, files, units) == (
        {"safetensors": {**state, "shards": [], "units": 0, "unit_sha256": []}}, set())


def test_a_safetensors_shard_is_on_disk_once_while_it_is_written(tmp_path, monkeypatch):
    """Was: a shard's states went to a file of their own (``.NAME.bertkit-partial.states``), and the shard was written
    from them when whole: both on disk at once, 2.0x the shard at the peak (2 GiB for the default 1 GiB shards).
    Now the states are put in place in the shard itself: the peak is the shard, 1.0x, and it reads back."""
    import numpy as np

    from bertkit.feature_files import read_features, safetensors_meta, write_safetensors

    layers, hidden, lengths = [-1, -2], 384, [5, 9, 3, 7, 11, 4, 6, 8]
    encoded = [{"input_ids": [101] + [7] * (n - 2) + [102], "token_type_ids": [0] * n} for n in lengths]
    units = [[[0, 1, 2], [3, 4, 5], [6, 7]]]
    sizes = []

    def on_disk() -> None:
        sizes.append(sum(p.stat().st_size for p in tmp_path.iterdir()
                         if ".json" not in p.name and not p.name.endswith(".lock")))  # the record, the lock: no states

    for name in ("replace", "link", "unlink"):  # each file made whole, placed, or removed: the moments of the peak
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda *a, real=real, **k: (on_disk(), real(*a, **k))[1])
    out = tmp_path / "out.safetensors"
    write_safetensors(PartialOutput(out, "extract-features", {}, resume=False, overwrite=False), [out],
                      [range(len(lengths))], units,
                      lambda p, u: {i: np.full((2, lengths[i], hidden), i, np.float32) for i in units[p][u]},
                      encoded, layers, np.dtype("float32"), safetensors_meta(layers, "float32", hidden, 16, "", False))
    monkeypatch.undo()
    assert [len(r["input_ids"]) for r in read_features(out)] == lengths
    assert [float(r["layers"][-2][0, 0]) for r in read_features(out)] == list(range(len(lengths)))
    assert max(sizes) == out.stat().st_size, sizes


def test_a_unit_torn_in_the_shard_being_made_is_made_again_with_those_after_it(tmp_path, monkeypatch, caplog):
    """Was: the states of the shard a kill cut short were trusted by their file's size alone, and that file is at its
    final size from the start: a unit torn by the kill (here its second unit's rows zeroed) was kept, and the
    resumed shard held zeros where the uninterrupted one holds the states. Now each unit's rows are checked
    against the sha256 recorded when they were flushed: that unit and the ones after it are made again."""
    import numpy as np

    from bertkit.feature_files import read_features, safetensors_meta, write_safetensors

    layers, hidden, lengths = [-1, -2], 8, [5, 9, 3, 7, 11, 4, 6, 8]
    encoded = [{"input_ids": [101] + [7] * (n - 2) + [102], "token_type_ids": [0] * n} for n in lengths]
    units = [[[0, 1], [2, 3], [4, 5], [6, 7]]]
    meta = safetensors_meta(layers, "float32", hidden, 16, "", False)
    calls = []

    def states_of(p, u):
        calls.append(u)
        if len(calls) == 4:  # the fourth unit: three recorded
            raise KeyboardInterrupt
        return {i: np.full((2, lengths[i], hidden), i + 1, np.float32) for i in units[p][u]}

    def write(out, resume=False):
        partial = PartialOutput(out, "extract-features", {}, resume=resume, overwrite=False)
        partial.progress, finished = resume_point(partial, out, [out], units)
        with partial:
            write_safetensors(partial, [out], [range(len(lengths))], units, states_of, encoded, layers,
                              np.dtype("float32"), meta)
        return finished

    out = tmp_path / "out.safetensors"
    with pytest.raises(KeyboardInterrupt):
        write(out)
    data = partial_path(out).read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    first = 8 + size + json.loads(data[8:8 + size])["layer.-1"]["data_offsets"][0]
    a, b = (first + sum(lengths[:n]) * hidden * 4 for n in (2, 4))  # unit 1's rows (lines 2 and 3) in layer -1
    with open(partial_path(out), "r+b") as f:  # as a kill mid-flush leaves them
        f.seek(a)
        f.write(bytes(b - a))
    calls.append(0)  # no more interruptions
    with caplog.at_level("WARNING", logger="bertkit"):
        assert write(out, resume=True) == {(0, 0)}
    assert "work unit 1's states differ from the sha256 recorded when they were written: it is made again, and the " \
           "1 after it" in caplog.text
    assert calls[5:] == [1, 2, 3]  # units 1 to 3 made again, unit 0 kept
    rows = list(read_features(out))
    assert [float(r["layers"][-1].min()) for r in rows] == [i + 1 for i in range(len(lengths))]



def test_a_shard_the_disk_has_no_room_for_is_refused_by_name_before_any_state_is_written(tmp_path, monkeypatch):
    """Was: the shard was a sparse file of its full size, its states written through a memmap: on a full disk the
    first page written was a SIGBUS, the process killed without a word (exit 135, seen on a 2 MB tmpfs). The room
    is taken when the file is made now, so the disk's refusal is write_error's one line."""
    import errno

    import numpy as np

    from bertkit.errors import BertkitError
    from bertkit.feature_files import safetensors_meta, write_safetensors

    if not hasattr(os, "posix_fallocate"):
        pytest.skip("no posix_fallocate on this system (macOS, Windows)")
    asked = []

    def full(fd, offset, length):
        asked.append(length)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    states = []
    out = tmp_path / "out.safetensors"
    meta = safetensors_meta([-1], "float32", 8, 16, "", False)
    encoded = [{"input_ids": [101, 7, 102], "token_type_ids": [0, 0, 0]}]
    with pytest.raises(BertkitError, match=f"no space left on the device while writing {out}"):
        with PartialOutput(out, "extract-features", {}, resume=False, overwrite=False) as partial:
            write_safetensors(partial, [out], [range(1)], [[[0]]], lambda p, u: states.append(u), encoded, [-1],
                              np.dtype("float32"), meta)
    assert states == [] and asked and asked[0] > 3 * 8 * 4  # refused before a unit was computed, the whole shard asked


def test_one_refusal_names_what_differs_then_and_now_in_each_command_s_words():
    """The three resume refusals (a directory run's settings, create-pretraining-data's plan, a file's partial write)
    are one comparison. Was, in the partial write's: a setting of two whole numbers (--layers -1,-2) was read as a
    model file's size and time ("--layers (-1 bytes, modified 1970-01-01 ...) then"), and settings past the fourth
    went unsaid; create-pretraining-data's tokenizer named three of its differences."""
    from bertkit.errors import BertkitError
    from bertkit.partial_output import refuse_other_plan

    then = {"settings": {"layers": [-1, -2], "w": 1, "x": 1, "y": 1, "z": 1}, "model": {"model.safetensors": [10, 0]}}
    now = {"settings": {"layers": [-1, -3], "w": 2, "x": 2, "y": 2, "z": 2}, "model": then["model"]}
    parts = {"settings": ("was cut short with other settings", "settings"), "model": ("... another model", "model")}
    with pytest.raises(BertkitError) as e:
        refuse_other_plan("into out.jsonl", "extract-features", then, now, parts, "start again, or choose another file")
    assert str(e.value) == (
        "cannot --resume into out.jsonl: its `bertkit extract-features` run was cut short with other settings "
        "(--layers [-1, -2] then, [-1, -3] now; --w 1 then, 2 now; --x 1 then, 2 now; --y 1 then, 2 now (and 1 "
        "more)); resume with the original settings, pass --overwrite to start again, or choose another file")
    with pytest.raises(BertkitError, match=r"run \.\.\. another model \(model\.safetensors \(10 bytes, modified 1970"):
        refuse_other_plan("into out.jsonl", "predict", {**then, "settings": now["settings"]},
                          {**now, "model": {"model.safetensors": [11, 0]}}, parts, "start again")
    with pytest.raises(BertkitError, match=r"run was started by another bertkit version \(format 0 then, 1 now\); "
                                           r"finish it with the bertkit version that started it, pass --overwrite"):
        refuse_other_plan("in out", "create-pretraining-data", {"format": 0}, {"format": 1},
                          {"format": ("was started by another bertkit version", None)}, "start again")


def test_overwrite_removes_only_this_outputs_partial_names_whatever_the_record_lists(tmp_path):
    """Was: --overwrite removed every name in the record that began with a dot and held ".bertkit-partial", so a
    record edited by hand (or copied beside another output) led it to another output's partial rows. Only this
    output's own partial names (itself or its shards, any kind) are removed now."""
    from bertkit.partial_output import FORMAT, PartialOutput

    out = tmp_path / "feats.safetensors"
    own = [partial_path(out).name, partial_path(tmp_path / "feats-00001-of-00002.safetensors").name]
    others = [partial_path(tmp_path / "notes.txt").name, partial_path(tmp_path / "other.safetensors").name]
    for name in own + others:
        (tmp_path / name).write_bytes(b"rows")
    partial_path(out, ".json").write_text(json.dumps({"format": FORMAT, "command": "extract-features",
                                                      "plan": {}, "files": own + others, "progress": {}}))
    PartialOutput(out, "extract-features", {}, resume=False, overwrite=True).release()  # (its lock, as a run ends)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(others)


def test_an_overwrite_cut_short_while_its_shards_are_placed_is_finished_by_resume_without_computing(
        tmp_path, monkeypatch, tiny_model):
    """The shards of an extraction are renamed into place one by one, over an earlier output's of the same names: a
    kill between two renames of an overwrite left some shards of each, neither output whole (read_features refused
    them), and --resume made the placed shards' states again; a kill before the earlier output's other shards were
    removed left them beside the new ones, with no record to finish it. Now the record goes only once those are
    removed, the refusal to read names --resume, and --resume finishes the placing from the files as they are,
    computing nothing: the output is the uninterrupted run's."""
    from bertkit import BertTokenizer, features, partial_output
    from bertkit.feature_files import read_features

    tok = BertTokenizer({t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "good",
                                                     "dull", "film"])})
    texts = [(t, None) for t in ("a good film", "a dull film", "good", "a film", "dull dull film", "a good dull film")]
    options = dict(layers=[-1], batch_size=2, chunk_size=2, progress=False)
    out = tmp_path / "f.safetensors"
    features.extract_features(tiny_model(seed=0), tok, texts, out, max_shard_bytes=400, **options)
    earlier = sorted(p.name for p in tmp_path.iterdir())
    assert earlier == [f"f-0000{k}-of-00006.safetensors" for k in range(1, 7)]
    model = tiny_model(seed=1)
    whole = tmp_path / "whole" / "f.safetensors"
    features.extract_features(model, tok, texts, whole, max_shard_bytes=1600, **options)
    want = list(read_features(whole))
    assert len(want) == 6 and len({p.name for p in whole.parent.iterdir()}) == 3

    publish, placed = partial_output._publish, []

    def killed(tmp, path):  # the kill after the first of three shards is in place
        if placed:
            raise KeyboardInterrupt
        placed.append(path.name)
        publish(tmp, path)

    monkeypatch.setattr(partial_output, "_publish", killed)
    with pytest.raises(KeyboardInterrupt):
        features.extract_features(model, tok, texts, out, max_shard_bytes=1600, overwrite=True, **options)
    monkeypatch.undo()
    assert placed == ["f-00003-of-00003.safetensors"]
    with pytest.raises(Exception, match=r"the shards of .*f.safetensors are not one extraction's: .* run the "
                                        r"extraction cut short again with --resume \(resume=True\) to finish it"):
        list(read_features(out))
    shard = tmp_path / ".f-00001-of-00003.safetensors.bertkit-partial"
    with pytest.raises(Exception, match=rf"run into {out} was cut short after 3 finished shard\(s\); its rows are in "
                                        rf"{shard}, .*-00002-of-00003.safetensors.bertkit-partial .*: pass --resume"):
        features.extract_features(model, tok, texts, out, max_shard_bytes=1600, **options)
    monkeypatch.setattr(features, "run_batches", lambda *a, **k: pytest.fail("a state computed again"))
    features.extract_features(model, tok, texts, out, max_shard_bytes=1600, resume=True, **options)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f-00001-of-00003.safetensors", "f-00002-of-00003.safetensors",
                                                          "f-00003-of-00003.safetensors", "whole"]
    got = list(read_features(out))
    assert [g["line_index"] for g in got] == [w["line_index"] for w in want] == list(range(6))
    for g, w in zip(got, want):
        assert g["input_ids"].tolist() == w["input_ids"].tolist()
        assert all((g["layers"][k] == w["layers"][k]).all() for k in w["layers"])


def test_a_second_writer_of_one_output_file_is_refused_from_the_first_ones_start(tmp_path):
    """Was: a run into an output file is known to others by its record, written once its first rows are made (after
    the model loads); two `predict --output-file OUT` started together both found none and wrote one partial file,
    and the first to finish published the rows of both (1,024 rows of one model, then 4,976 of the other's), while
    the second failed "No such file or directory" and left its record behind. Now the output's lock is taken before
    the record is read: the second is refused at once, naming the first, and the lock goes with the run."""
    import subprocess
    import sys
    from pathlib import Path

    from bertkit.errors import BertkitError

    out = tmp_path / "new" / "out.jsonl"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from bertkit.partial_output import "
         "PartialOutput; PartialOutput(Path(sys.argv[1]), 'predict text-classification', {}, resume=False, "
         "overwrite=False); print('ready', flush=True); time.sleep(60)", str(out)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")})
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(BertkitError, match=rf"^{out} is being written by pid {holder.pid} \(bertkit predict "
                                               r"text-classification\); wait for it to finish"):
            PartialOutput(out, "predict text-classification", {}, resume=False, overwrite=True)
    finally:
        holder.kill()
        holder.wait()
    with PartialOutput(out, "predict text-classification", {}, resume=False, overwrite=False) as partial:
        f = partial.appender(out)
        f.write("{}\n")
        f.commit(1)
        f.close()
        partial.finish([(f.tmp, out)])
    assert sorted(os.listdir(out.parent)) == ["out.jsonl"]  # the lock the killed holder left, removed with this one's
    with pytest.raises(ValueError, match="the model failed"):  # before any row: nothing left, nor the directory
        with PartialOutput(tmp_path / "other" / "x.jsonl", "predict text-classification", {}, resume=False,
                           overwrite=False):
            raise ValueError("the model failed")
    assert sorted(os.listdir(tmp_path)) == ["new"]


def _film_extraction(tiny_model):
    from bertkit import BertTokenizer

    tok = BertTokenizer({t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "good",
                                                     "dull", "film"])})
    texts = [(t, None) for t in ("a good film", "a dull film", "good", "a film", "dull dull film", "a good dull film")]
    return tiny_model(), tok, texts, dict(layers=[-1], batch_size=1, chunk_size=2, progress=False)


@pytest.mark.parametrize("suffix", [".jsonl", ".safetensors"])
def test_a_symlink_at_a_partial_name_is_replaced_never_written_through(tmp_path, monkeypatch, tiny_model, suffix):
    """Was: a symlink at an output's partial name (``.out.jsonl.bertkit-partial``) was written through: a resume
    proved the rows of the file it led to, truncated that file, appended the rest of the rows to it and renamed the
    symlink to ``out.jsonl``, so the user's file became the output (its own lines cut away) and the output a link to
    it; a run afresh truncated it. Now the symlink is replaced, as an atomic write replaces one at its name: the
    user's file keeps its bytes, and the output is a file of the uninterrupted run's bytes."""
    from bertkit import features

    model, tok, texts, options = _film_extraction(tiny_model)
    whole = tmp_path / f"whole{suffix}"
    features.extract_features(model, tok, texts, whole, **options)
    run, calls = features.run_batches, []

    def cut(*args, **kwargs):  # Ctrl-C as the third unit starts: two recorded
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return run(*args, **kwargs)

    out = tmp_path / f"out{suffix}"
    monkeypatch.setattr(features, "run_batches", cut)
    with pytest.raises(KeyboardInterrupt):
        features.extract_features(model, tok, texts, out, **options)
    monkeypatch.undo()
    mine = tmp_path / f"mine{suffix}"
    mine.write_bytes(partial_path(out).read_bytes() + b"the user's own bytes, after the rows\n" * 50)
    kept = mine.read_bytes()
    partial_path(out).unlink()
    partial_path(out).symlink_to(mine.name)
    features.extract_features(model, tok, texts, out, resume=True, **options)
    assert mine.read_bytes() == kept
    assert not out.is_symlink() and _same_features(out, whole)

    fresh = tmp_path / f"fresh{suffix}"  # a run afresh finding a symlink at its partial name
    partial_path(fresh).symlink_to(mine.name)
    features.extract_features(model, tok, texts, fresh, **options)
    assert mine.read_bytes() == kept
    assert not fresh.is_symlink() and _same_features(fresh, whole)


def _same_features(path, whole) -> bool:
    """A .jsonl's bytes; a .safetensors' lines (its metadata names its extraction, so its bytes are its own)."""
    from bertkit.feature_files import read_features

    if path.suffix == ".jsonl":
        return path.read_bytes() == whole.read_bytes()
    got, want = list(read_features(path)), list(read_features(whole))
    return len(got) == len(want) == 6 and all(
        list(a["input_ids"]) == list(b["input_ids"]) and (a["layers"][-1] == b["layers"][-1]).all()
        for a, b in zip(got, want))
