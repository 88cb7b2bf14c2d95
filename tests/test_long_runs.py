"""What long runs and GPUs need, checked where it runs on a CPU: continued pre-training (--init-from), MLM-only
(--no-nsp), from_pretrained on intermediate checkpoints, fine-tuning curves, TensorBoard's message, fp16 with
a gradient scaler, gradient checkpointing, --device auto."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bertkit.errors import BertkitError
from bertkit.training.checkpoint import read_state


@pytest.fixture(scope="module")
def tiny(tiny_pretraining_data):
    """A 1,500-entry vocabulary and 32-token instances from Python's own docs (conftest.py; read-only)."""
    return tiny_pretraining_data


def _settings(root: Path, out: Path, **kw):
    from bertkit.settings import PretrainSettings

    base = dict(data=root / "data", vocab=root / "vocab", output_dir=out, max_steps=4, logging_steps=1, batch_size=8,
                learning_rate=1e-3, progress=False, device="cpu")
    if "init_from" not in kw:  # a checkpoint's config.json is its shape (another --config-name is refused)
        base["config_name"] = "tiny"
    return PretrainSettings(**{**base, **kw})


def test_init_from_a_checkpoint_keeps_its_encoder_and_reports_the_fresh_heads(tiny, tmp_path, caplog):
    from bertkit.config import BertConfig
    from bertkit.modeling import BertModel
    from bertkit.training.pretrain import pretrain

    torch.manual_seed(123)  # an encoder-only checkpoint (no MLM, no NSP head), as released models often are
    vocab_size = len((tiny / "vocab" / "vocab.txt").read_text(encoding="utf-8").splitlines())
    BertModel(BertConfig.preset("tiny", vocab_size=vocab_size)).save_pretrained(tmp_path / "released")
    released = load_file(tmp_path / "released" / "model.safetensors")
    caplog.set_level(logging.WARNING, logger="bertkit")
    # one step: its learning rate is 0 (the warm-up's first), so the weights are the starting ones
    pretrain(_settings(tiny, tmp_path / "run", init_from=tmp_path / "released", max_steps=1))
    final = load_file(tmp_path / "run" / "final" / "model.safetensors")
    encoder = [k for k in released if k.startswith(("embeddings.", "encoder."))]
    assert encoder and all(torch.equal(final["bert." + k] if "bert." + k in final else final[k], released[k])
                           for k in encoder)
    assert "initialised fresh" in caplog.text and "cls.predictions" in caplog.text
    # the same checkpoint in transformers' older torch pickle: the run fingerprints the file it has
    torch.save(released, tmp_path / "released" / "pytorch_model.bin")
    (tmp_path / "released" / "model.safetensors").unlink()
    pretrain(_settings(tiny, tmp_path / "run-pickle", init_from=tmp_path / "released", max_steps=1))
    assert torch.equal(load_file(tmp_path / "run-pickle" / "final" / "model.safetensors")["bert.encoder.layer.0."
                                                                                        "output.dense.weight"],
                       released["encoder.layer.0.output.dense.weight"])
    # a checkpoint whose vocabulary is not the data's is refused with the fix
    BertModel(BertConfig.preset("tiny", vocab_size=999)).save_pretrained(tmp_path / "other-vocab")
    with pytest.raises(BertkitError, match="with the tokenizer it was trained with"):
        pretrain(_settings(tiny, tmp_path / "run2", init_from=tmp_path / "other-vocab"))


def test_mlm_only_pretraining_and_loadable_intermediate_checkpoints(tiny, tmp_path):
    from bertkit.heads import BertForMaskedLM
    from bertkit.training.pretrain import pretrain

    out = tmp_path / "mlm"
    pretrain(_settings(tiny, out, nsp=False, save_steps=2, eval_data=tiny / "data", eval_instances=16))
    config = json.loads((out / "final" / "config.json").read_text())
    assert config["architectures"] == ["BertForMaskedLM"]
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert all("nsp_loss" not in r and "mlm_loss" in r for r in records)
    assert any(r["split"] == "eval" and 0 <= r["mlm_acc"] <= 1 for r in records)
    # the step-2 checkpoint loads with from_pretrained, and holds the weights a resume reads
    step2 = out / "checkpoints" / "step-00000002"
    model = BertForMaskedLM.from_pretrained(step2).state_dict()
    state = read_state(step2)["model"]
    assert state and all(torch.equal(model[k], v) for k, v in state.items())


def test_finetuning_draws_its_curves(tmp_path):
    from bertkit.heads import BertForSequenceClassification
    from bertkit.settings import TrainingSettings
    from bertkit.training.finetune_run import run_finetuning
    from distributed_helpers import classification_examples, pad_collate, tiny_config

    s = TrainingSettings(output_dir=tmp_path, learning_rate=1e-3, batch_size=8, num_train_epochs=1.0,
                         progress=False, device="cpu", logging_steps=2)
    run_finetuning(BertForSequenceClassification(tiny_config()), classification_examples(32), pad_collate, s,
                   lambda m: {"accuracy": 0.5}, {"task": "synthetic"})
    png = tmp_path / "metrics.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # long; in make test-slow (make test stays under 5 minutes)
def test_report_to_tensorboard_without_the_package_says_what_to_install(tiny, tmp_path):
    from bertkit.training.pretrain import pretrain

    try:
        import tensorboard  # noqa: F401
    except ModuleNotFoundError:
        with pytest.raises(BertkitError, match=r"pip install 'bertkit\[tensorboard\]'"):
            pretrain(_settings(tiny, tmp_path / "tb", report_to="tensorboard"))
    else:
        pretrain(_settings(tiny, tmp_path / "tb", report_to="tensorboard"))
        assert list((tmp_path / "tb" / "tensorboard").glob("events.out.tfevents.*"))


def test_fp16_trains_with_a_gradient_scaler_and_resumes_exactly(tiny, tmp_path):
    from bertkit.training.pretrain import pretrain

    full = pretrain(_settings(tiny, tmp_path / "full", fp16=True, max_steps=4, save_steps=2))
    assert all(r["loss"] == r["loss"] for r in full.history if r["split"] == "train")  # finite, not NaN
    state = torch.load(tmp_path / "full" / "checkpoints" / "step-00000004" / "state.pt", weights_only=True)
    assert state["scaler"]["scale"] > 0 and state["fingerprint"]["train"]["fp16"] is True
    # resume from step 2: the scaler's state comes back with the rest, so the run ends where the full one did
    part = tmp_path / "part"
    pretrain(_settings(tiny, part, fp16=True, max_steps=4, save_steps=2))
    import shutil

    shutil.rmtree(part / "checkpoints" / "step-00000004")
    shutil.rmtree(part / "final")
    pretrain(_settings(tiny, part, fp16=True, max_steps=4, save_steps=2, resume=True))
    assert (part / "final" / "model.safetensors").read_bytes() == (tmp_path / "full" / "final" /
                                                                  "model.safetensors").read_bytes()
    with pytest.raises(BertkitError, match="bf16 and fp16 are both set"):
        _settings(tiny, tmp_path / "x", fp16=True, bf16=True)


def test_bf16_training_on_a_cpu_without_bf16_says_so_once(tiny, tmp_path, monkeypatch, caplog):
    """`--bf16` on an AVX2-only CPU trains emulated (several times slower): one warning, where the run starts."""
    from bertkit import _hardware
    from bertkit.training.pretrain import pretrain

    _hardware.warn_if_bf16_is_emulated.cache_clear()
    monkeypatch.setattr(_hardware, "cpu_has_bf16", lambda: False)
    caplog.set_level(logging.WARNING, logger="bertkit")
    result = pretrain(_settings(tiny, tmp_path / "run", bf16=True, max_steps=3))
    assert all(r["loss"] == r["loss"] for r in result.history if r["split"] == "train")  # trains, finite
    assert caplog.text.count("no bf16 instructions") == 1
    _hardware.warn_if_bf16_is_emulated.cache_clear()


def test_gradient_checkpointing_gives_the_same_gradients_with_dropout_on():
    from bertkit.config import BertConfig
    from bertkit.heads import BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig.preset("tiny", vocab_size=100))  # dropout 0.1
    ids = torch.randint(5, 100, (4, 12))
    mask = torch.ones_like(ids)
    mask[2:, 9:] = 0  # padded rows: the unpadded layout goes through the recomputation too
    labels = torch.tensor([0, 1, 1, 0])
    grads = []
    for recompute in (False, True):
        model.zero_grad()
        model.bert.gradient_checkpointing = recompute
        torch.manual_seed(1)
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert all(torch.equal(grads[0][n], grads[1][n]) for n in grads[0])
    assert any(float(g.abs().sum()) > 0 for g in grads[0].values())


def test_device_auto_and_torchrun_environment(monkeypatch):
    from bertkit._parallel import info_from_env
    from bertkit.training.distributed import resolve_device

    assert resolve_device("auto") == ("cuda:0" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu", local_rank=3) == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(BertkitError, match="sees no CUDA GPU"):
            resolve_device("cuda")
    with pytest.raises(BertkitError, match="is not a device"):
        resolve_device("tpu:9")
    assert info_from_env({}).world_size == 1
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}
    info = info_from_env(env)
    assert (info.rank, info.world_size, info.local_rank, info.is_main) == (3, 4, 1, False)
    with pytest.raises(BertkitError, match="RANK 4 is not in"):
        info_from_env({**env, "RANK": "4"})


def test_logged_mlm_and_nsp_losses_add_up_to_the_steps_loss_under_accumulation(tiny, tmp_path):
    """The step's loss is the token mean of its masked positions over its micro-batches (plus the NSP mean); the
    logged mlm_loss and mlm_acc were each micro-batch's own token mean weighed by its rows, so with accumulation
    mlm_loss + nsp_loss missed the logged loss by up to 4e-3 and a micro-batch of few targets counted as much as
    one of many. Each is now the window's sums over its counts (targets, instances), as the evaluation's are."""
    from bertkit.data.pretraining import create_pretraining_data
    from bertkit.tokenization import BertTokenizer
    from bertkit.training.pretrain import pretrain

    # short sequences half the time: instances of 1 to 5 targets, so the micro-batches' target counts differ
    create_pretraining_data([tiny / "corpus" / "train.txt"], BertTokenizer.from_pretrained(tiny / "vocab"),
                            tmp_path / "data", max_seq_length=32, max_predictions_per_seq=5, short_seq_prob=0.5,
                            dupe_factor=1, input_format="sentences", seed=5, num_workers=1, progress=False)
    out = tmp_path / "run"
    pretrain(_settings(tiny, out, data=tmp_path / "data", batch_size=6, gradient_accumulation_steps=3, max_steps=3))
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    assert len(train) == 3
    for r in train:
        assert r["mlm_loss"] + r["nsp_loss"] == pytest.approx(r["loss"], rel=1e-6, abs=1e-6)
        assert 0 <= r["mlm_acc"] <= 1 and 0 <= r["nsp_acc"] <= 1
