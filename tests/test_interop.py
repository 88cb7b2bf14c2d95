"""bertkit models inside the libraries around BERT, each compared with transformers' model doing the same.

The libraries are in the ``test`` extra (peft, accelerate, sentence-transformers, onnxscript, onnxruntime).

bertkit's modules and state-dict keys are transformers' own (``bert.encoder.layer.3.attention.self.query``,
``cls.predictions.decoder``, ``classifier``), so whatever addresses a BERT by module name (peft's
``target_modules``, accelerate's ``prepare``, transformers' ``Trainer``, sentence-transformers' loader) sees
the same model. Each test runs the same recipe on a transformers model with the same weights and asserts the
same numbers; exporters (torch.compile, torch.export, the dynamo ONNX exporter) are compared with eager.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import transformers
from torch import nn

import bertkit
import bertkit.heads as H
from bertkit.config import BertConfig
from bertkit.errors import BertkitError
from bertkit.modeling import BertModel

# No dropout anywhere: training steps of the two libraries then compute the same numbers.
TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=64, type_vocab_size=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
CLASSES = [BertModel, H.BertForPreTraining, H.BertForMaskedLM, H.BertForNextSentencePrediction,
           H.BertForSequenceClassification, H.BertForTokenClassification, H.BertForQuestionAnswering,
           H.BertForMultipleChoice]
TOL = dict(atol=2e-5, rtol=1e-4)


def _pair(cls, seed: int = 0, **overrides):
    """(bertkit model, transformers model) with the same weights: transformers' initialisation, loaded into
    bertkit with a strict ``load_state_dict`` of its ``state_dict()``."""
    torch.manual_seed(seed)
    hf = getattr(transformers, cls.__name__)(transformers.BertConfig(**TINY, **overrides)).eval()
    ours = cls(BertConfig(**TINY, **overrides)).eval()
    ours.load_state_dict(hf.state_dict(), strict=True)
    return ours, hf


def _batch(B: int = 4, T: int = 12, seed: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded rows of different lengths, as a tokenizer gives them."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    ids = torch.randint(5, TINY["vocab_size"], (B, T), generator=g) * mask
    types = (torch.arange(T)[None] >= (lengths[:, None] // 2)).long() * mask
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


# ---------------------------------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_module_names_and_state_dicts_are_transformers_own(cls):
    """The same module paths, the same state-dict keys with the same shapes, and strict loading both ways."""
    ours, hf = _pair(cls)
    assert [n for n, _ in ours.named_modules()] == [n for n, _ in hf.named_modules()]
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in hf.state_dict().items()}
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in hf.named_parameters()]
    hf.load_state_dict(ours.state_dict(), strict=True)
    for key, value in ours.state_dict().items():
        assert torch.equal(value, hf.state_dict()[key]), key
    if hasattr(ours, "cls") and hasattr(ours.cls, "predictions"):  # the decoder is the word embeddings
        assert ours.cls.predictions.decoder.weight is ours.bert.embeddings.word_embeddings.weight
        assert ours.get_output_embeddings() is ours.cls.predictions.decoder


def test_projections_follow_the_weights_and_their_hooks():
    """q/k/v are three plain modules: an in-place update of a weight (as an optimiser step makes) reaches the next
    call, and a hook on one of them runs once per forward."""
    ours, hf = _pair(BertModel)
    batch = _batch()
    with torch.no_grad():
        before = ours(**batch).last_hidden_state
        ours.encoder.layer[0].attention.self.key.weight.mul_(1.5)
        hf.encoder.layer[0].attention.self.key.weight.mul_(1.5)
        after = ours(**batch).last_hidden_state
        want = hf(**batch).last_hidden_state
    mask = batch["attention_mask"].bool()
    assert not torch.allclose(before[mask], after[mask])
    torch.testing.assert_close(after[mask], want[mask], **TOL)
    seen = []
    ours.encoder.layer[1].attention.self.value.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    with torch.no_grad():
        again = ours(**batch).last_hidden_state
    assert len(seen) == 1
    torch.testing.assert_close(again[mask], want[mask], **TOL)


# ---------------------------------------------------------------------------------------------------
# peft
# ---------------------------------------------------------------------------------------------------



def test_forward_hooks_capture_transformers_tensors_on_a_padded_batch():
    """The feature-extraction recipe: forward hooks on the embeddings, a layer, its ``attention.self``, its
    ``intermediate``, its ``output.dense`` and the encoder (whose hook never ran) capture transformers' tensors,
    (B, T, ...) with its numbers, on a batch with padding (where padding is otherwise dropped and they would get the
    (N, ...) real-token rows); the model's outputs keep zeros at padding, and without hooks padding is dropped as
    before."""
    ours, hf = _pair(BertModel)
    batch = _batch()
    mask = batch["attention_mask"].bool()
    assert not mask.all()
    captured = {}
    for name, model in (("ours", ours), ("hf", hf)):
        seen = captured[name] = {}
        layer = model.encoder.layer[1]
        modules = {"embeddings": model.embeddings, "layer": layer, "self": layer.attention.self,
                   "intermediate": layer.intermediate, "output.dense": layer.output.dense, "encoder": model.encoder}
        names = {module: key for key, module in modules.items()}

        def capture(module, inputs, output, seen=seen, names=names):  # (states, ...) from a layer or the encoder
            seen[names[module]] = (output[0] if isinstance(output, (tuple, dict)) else output).detach()

        handles = [module.register_forward_hook(capture) for module in modules.values()]
        with torch.no_grad():
            out = model(**batch).last_hidden_state
        for h in handles:
            h.remove()
        if name == "ours":
            assert torch.equal(out[~mask], torch.zeros_like(out[~mask]))
            assert ours(**batch).token_layout.flat_index is not None  # unhooked: padding dropped again
    for key, want in captured["hf"].items():
        got = captured["ours"][key]
        assert got.shape == want.shape == (4, 12, want.shape[-1]), key
        torch.testing.assert_close(got, want, **TOL)

def _train(model, batches, steps: int, lr: float = 1e-2) -> list[float]:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    model.train()
    losses = []
    for step in range(steps):
        batch = batches[step % len(batches)]
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("targets", [["query", "value"], "all-linear"], ids=["query-value", "all-linear"])
def test_peft_lora_matches_transformers(targets, tmp_path):
    import peft

    ours, hf = _pair(H.BertForSequenceClassification, num_labels=3)
    models = []
    for model in (ours, hf):
        torch.manual_seed(11)  # the same LoRA initialisation, module by module in the same order
        config = peft.LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets)
        models.append(peft.get_peft_model(model, config))
    p_ours, p_hf = models
    assert p_ours.get_nb_trainable_parameters() == p_hf.get_nb_trainable_parameters()
    lora = sorted(n for n, p in p_ours.named_parameters() if p.requires_grad)
    assert lora == sorted(n for n, p in p_hf.named_parameters() if p.requires_grad)
    if targets == ["query", "value"]:
        assert any(".attention.self.query.lora_A." in n for n in lora)
        assert not any(".key.lora_" in n or ".dense.lora_" in n for n in lora)
    else:
        assert any(".intermediate.dense.lora_A." in n for n in lora)
    g = torch.Generator().manual_seed(5)
    batches = [dict(_batch(seed=s), labels=torch.randint(0, 3, (4,), generator=g)) for s in range(3)]
    # LoRA's B starts at zero: nudge it so the adapters change the outputs before training too.
    for model in (p_ours, p_hf):
        torch.manual_seed(12)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.1)
    with torch.no_grad():
        torch.testing.assert_close(p_ours.eval()(**batches[0]).logits, p_hf.eval()(**batches[0]).logits, **TOL)
    losses_ours, losses_hf = _train(p_ours, batches, 4), _train(p_hf, batches, 4)
    assert losses_ours == pytest.approx(losses_hf, abs=1e-5, rel=1e-4)
    with torch.no_grad():
        logits = p_ours.eval()(**batches[1]).logits
        torch.testing.assert_close(logits, p_hf.eval()(**batches[1]).logits, **TOL)

    merged = p_ours.merge_and_unload()
    assert type(merged) is H.BertForSequenceClassification
    assert all(type(m) is nn.Linear for n, m in merged.named_modules() if n.endswith((".query", ".value")))
    with torch.no_grad():
        torch.testing.assert_close(merged(**batches[1]).logits, logits, **TOL)
    merged.save_pretrained(tmp_path)
    again = H.BertForSequenceClassification.from_pretrained(tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(again(**batches[1]).logits, logits, **TOL)


def test_a_peft_adapter_saved_on_one_library_loads_on_the_other(tmp_path):
    """``save_pretrained`` of a LoRA model writes what it writes on transformers' model (adapter_config.json, with
    the base model's directory, and the tensors' names); each library's adapter loads with ``PeftModel.from_pretrained``
    on the other's base model, with the same outputs."""
    import json

    import peft
    from safetensors.torch import load_file

    _pair(H.BertForSequenceClassification)[0].save_pretrained(tmp_path / "base")
    batch = _batch()
    for lib in (bertkit, transformers):
        wrapped = _lora(lib.BertForSequenceClassification.from_pretrained(tmp_path / "base"), "SEQ_CLS")
        with torch.no_grad():
            for name, p in wrapped.named_parameters():
                if "lora_B" in name:
                    p.fill_(0.5)
        wrapped.save_pretrained(tmp_path / lib.__name__)
    ours, theirs = (tmp_path / "bertkit", tmp_path / "transformers")
    configs = [json.loads((d / "adapter_config.json").read_text()) for d in (ours, theirs)]
    assert configs[0]["base_model_name_or_path"] == str(tmp_path / "base")
    for config in configs:  # a set, written in hash order
        config["target_modules"] = sorted(config["target_modules"])
        config.pop("auto_mapping")  # the base model's class and module
    assert configs[0] == configs[1]
    weights = [load_file(d / "adapter_model.safetensors") for d in (ours, theirs)]
    assert weights[0].keys() == weights[1].keys() and any(".lora_B." in k for k in weights[0])
    outputs = {}
    for writer in (ours, theirs):
        for lib in (bertkit, transformers):
            base = lib.BertForSequenceClassification.from_pretrained(tmp_path / "base")
            with torch.no_grad():
                outputs[writer.name, lib.__name__] = peft.PeftModel.from_pretrained(base, writer)(**batch).logits
    want = outputs["transformers", "transformers"]
    assert (want - _pair(H.BertForSequenceClassification)[1](**batch).logits).abs().max() > 1e-3  # the adapter acts
    for logits in outputs.values():
        torch.testing.assert_close(logits, want, **TOL)


@pytest.mark.parametrize("kind", ["PromptTuningConfig", "PromptEncoderConfig"])
def test_peft_prompt_tuning_matches_transformers(kind):
    """Prompt tuning and P-tuning (virtual tokens before the input's embeddings): the same trainable parameters,
    outputs and training losses as on transformers' model."""
    import peft

    models = []
    for model in _pair(H.BertForSequenceClassification, num_labels=3):
        torch.manual_seed(11)
        config = getattr(peft, kind)(task_type="SEQ_CLS", num_virtual_tokens=3, encoder_hidden_size=16) \
            if kind == "PromptEncoderConfig" else getattr(peft, kind)(task_type="SEQ_CLS", num_virtual_tokens=3)
        models.append(peft.get_peft_model(model, config))
    ours, theirs = models
    assert ours.get_nb_trainable_parameters() == theirs.get_nb_trainable_parameters()
    g = torch.Generator().manual_seed(5)
    batches = [dict(_batch(seed=s), labels=torch.randint(0, 3, (4,), generator=g)) for s in range(3)]
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(**batches[0]).logits, theirs.eval()(**batches[0]).logits, **TOL)
    assert _train(ours, batches, 3) == pytest.approx(_train(theirs, batches, 3), abs=1e-5, rel=1e-4)


# ---------------------------------------------------------------------------------------------------
# accelerate and transformers' Trainer
# ---------------------------------------------------------------------------------------------------


class _Rows(torch.utils.data.Dataset):
    def __init__(self, n: int, num_labels: int = 2, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for i in range(n):
            row = {k: v[0] for k, v in _batch(1, 12, seed=seed * 1000 + i).items()}
            row["labels"] = torch.randint(0, num_labels, (), generator=g)
            self.rows.append(row)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.rows[i]


def test_accelerate_prepare_and_its_loop_match_transformers():
    import accelerate

    ours, hf = _pair(H.BertForSequenceClassification)
    accelerator = accelerate.Accelerator(cpu=True)
    losses = []
    for model in (ours, hf):
        loader = torch.utils.data.DataLoader(_Rows(12), batch_size=4, shuffle=False)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        model.train()
        run = []
        for _ in range(2):
            for batch in loader:
                loss = model(**batch).loss
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                run.append(loss.item())
        losses.append(run)
    assert len(losses[0]) == 6
    assert losses[0] == pytest.approx(losses[1], abs=1e-5, rel=1e-4)
    assert type(accelerator.unwrap_model(ours)) is H.BertForSequenceClassification


def test_transformers_trainer_trains_evaluates_and_saves_a_bertkit_model(tmp_path, minilm_dir):
    """transformers' ``Trainer`` with a bertkit model and tokenizer: the same losses as with transformers' model.
    ``trainer.save_model(dir)`` writes what Trainer writes for a model that is not a ``PreTrainedModel``: the
    state dict as model.safetensors (transformers' names, so it is a checkpoint) and the tokenizer, but no
    config.json; ``from_pretrained(dir, config=model.config)`` loads it in one call."""
    from bertkit.tokenization import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(minilm_dir)  # saved by save_model; the rows are token ids already
    results = []
    for index, model in enumerate(_pair(H.BertForSequenceClassification)):
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / f"run{index}"), max_steps=4, per_device_train_batch_size=4,
            per_device_eval_batch_size=4, learning_rate=1e-3, logging_steps=1, report_to=[], use_cpu=True,
            save_strategy="no", seed=3, disable_tqdm=True, dataloader_num_workers=0)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=_Rows(16), eval_dataset=_Rows(8, seed=1),
                                       processing_class=tokenizer if index == 0 else None)
        train = trainer.train()
        metrics = trainer.evaluate()
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        results.append((train.training_loss, metrics["eval_loss"], losses))
        if index == 0:
            trainer.save_model(str(tmp_path / "saved"))
    (ours_train, ours_eval, ours_losses), (hf_train, hf_eval, hf_losses) = results
    assert len(ours_losses) == 4 and ours_losses == pytest.approx(hf_losses, abs=1e-5, rel=1e-4)
    assert ours_eval == pytest.approx(hf_eval, abs=1e-5, rel=1e-4)
    assert ours_train == pytest.approx(hf_train, abs=1e-5, rel=1e-4)

    saved = tmp_path / "saved"
    assert (saved / "model.safetensors").is_file() and (saved / "vocab.txt").is_file()
    assert not (saved / "config.json").exists()
    model = _pair(H.BertForSequenceClassification)[0]
    reloaded = H.BertForSequenceClassification.from_pretrained(saved, config=model.config)
    from safetensors.torch import load_file

    for key, value in load_file(str(saved / "model.safetensors")).items():
        assert torch.equal(reloaded.state_dict()[key], value), key


def _lora(model, task_type: str | None):
    import peft

    torch.manual_seed(11)  # the same LoRA initialisation
    config = peft.LoraConfig(task_type=task_type, r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["query", "value"])
    return peft.get_peft_model(model, config)


@pytest.mark.parametrize("task_type", ["SEQ_CLS", None])
def test_bertkits_trainer_trains_a_peft_model_as_transformers_trainer(task_type, tmp_path):
    """peft's wrapper names fewer forward arguments than the model it wraps (``token_type_ids`` is not among a
    SEQ_CLS wrapper's, a wrapper without task_type names none) and passes the rest on: the Trainer keeps the columns
    the base model takes, as transformers' Trainer does. The same losses and LoRA weights."""
    runs = []
    for lib, model in zip((bertkit, transformers), _pair(H.BertForSequenceClassification)):
        wrapped = _lora(model, task_type)
        with torch.no_grad():  # LoRA's B starts at zero: nudge it so the adapters change the outputs from step 1
            for name, p in wrapped.named_parameters():
                if "lora_B" in name:
                    p.fill_(0.05)
        args = lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), max_steps=4, per_device_train_batch_size=4,
                                     learning_rate=1e-2, logging_steps=1, report_to="none", use_cpu=True,
                                     save_strategy="no", seed=3, disable_tqdm=True)
        trainer = lib.Trainer(model=wrapped, args=args, train_dataset=_Rows(16))
        trainer.train()
        runs.append(([h["loss"] for h in trainer.state.log_history if "loss" in h],
                     {n: p.detach().clone() for n, p in wrapped.named_parameters() if p.requires_grad}))
    (ours, ours_weights), (theirs, their_weights) = runs
    assert len(ours) == 4 and ours == pytest.approx(theirs, rel=1e-6)
    assert ours_weights.keys() == their_weights.keys()
    for name, weight in ours_weights.items():
        torch.testing.assert_close(weight, their_weights[name], rtol=1e-5, atol=1e-7)


def test_a_peft_wrapped_token_head_is_trained_on_the_steps_token_mean(tmp_path):
    """The token loss of a peft-wrapped tagger is divided by the labelled tokens of the whole step, as the tagger's own
    (the wrapper passes ``num_items_in_batch`` on): batches of 8 and 4 with accumulation 2 log the same losses and
    train the same LoRA weights, though the first step's micro-batches hold 20 and 4 labelled tokens."""
    g = torch.Generator().manual_seed(7)
    rows = []
    for i, row in enumerate(_Rows(16)):
        labels = torch.randint(0, 3, (12,), generator=g)
        labels[1 + 8 * (i < 2):] = -100  # one labelled token per row, 9 in the first two
        rows.append({**{k: v for k, v in row.items() if k != "labels"}, "labels": labels})
    runs = []
    for batch_size, accumulation in ((8, 1), (4, 2)):
        model = _lora(_pair(H.BertForTokenClassification, num_labels=3)[0], "TOKEN_CLS")
        args = bertkit.TrainingArguments(output_dir=str(tmp_path / str(batch_size)), max_steps=2,
                                         per_device_train_batch_size=batch_size, gradient_accumulation_steps=accumulation,
                                         learning_rate=1e-2, logging_steps=1, report_to="none", save_strategy="no",
                                         seed=3, disable_tqdm=True, train_sampling_strategy="sequential")
        trainer = bertkit.Trainer(model=model, args=args, train_dataset=rows)
        trainer.train()
        runs.append(([h["loss"] for h in trainer.state.log_history if "loss" in h],
                     [p.detach().clone() for p in model.parameters() if p.requires_grad]))
    (one, one_weights), (accumulated, accumulated_weights) = runs
    assert accumulated == pytest.approx(one, rel=1e-6)
    for weight, want in zip(accumulated_weights, one_weights):
        torch.testing.assert_close(weight, want, rtol=1e-5, atol=1e-7)


class _MaskedRows(torch.utils.data.Dataset):
    """Masked-LM rows: every fourth real token is to be predicted (the rest of ``labels`` is -100)."""

    def __init__(self, n: int, seed: int = 0):
        self.rows = []
        for i in range(n):
            row = {k: v[0] for k, v in _batch(1, 12, seed=seed * 1000 + i).items()}
            labels = torch.full_like(row["input_ids"], -100)
            labels[1::4] = row["input_ids"][1::4]
            row["labels"] = torch.where(row["attention_mask"].bool(), labels, -100)
            self.rows.append(row)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.rows[i]


def test_transformers_trainer_checkpoints_loads_the_best_and_saves_a_bertkit_mlm_model(tmp_path):
    """transformers' ``Trainer`` with a bertkit masked-LM model, checkpointing every 2 steps and with
    ``load_best_model_at_end``: the same losses, evaluations and best checkpoint as with transformers' model, and
    the weights it ends with are the best checkpoint's. A model that is not a ``PreTrainedModel`` is saved by
    safetensors from ``state_dict()``, which refuses tensors that share memory: the tied decoder is listed as a
    copy, so the checkpoints and ``save_model`` are written, and ``from_pretrained(dir, config=...)`` reads them
    back tied."""
    from safetensors.torch import load_file

    runs = []
    for index, model in enumerate(_pair(H.BertForMaskedLM)):
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / f"run{index}"), max_steps=8, per_device_train_batch_size=4,
            per_device_eval_batch_size=4, learning_rate=3e-2, logging_steps=1, eval_strategy="steps", eval_steps=2,
            save_strategy="steps", save_steps=2, load_best_model_at_end=True, metric_for_best_model="eval_loss",
            report_to=[], use_cpu=True, seed=3, disable_tqdm=True, dataloader_num_workers=0)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=_MaskedRows(16),
                                       eval_dataset=_MaskedRows(8, seed=1))
        trainer.train()
        runs.append({
            "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
            "evals": [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h],
            "best": Path(trainer.state.best_model_checkpoint).name,
            "weights": {k: v.clone() for k, v in model.state_dict().items()},
        })
        if index == 0:
            trainer.save_model(str(tmp_path / "saved"))
            ours, checkpoint = model, Path(trainer.state.best_model_checkpoint)
    assert len(runs[0]["losses"]) == 8 and runs[0]["losses"] == pytest.approx(runs[1]["losses"], abs=1e-5, rel=1e-4)
    assert len(runs[0]["evals"]) == 4 and runs[0]["evals"] == pytest.approx(runs[1]["evals"], abs=1e-5, rel=1e-4)
    assert runs[0]["best"] == runs[1]["best"]
    best = load_file(str(checkpoint / "model.safetensors"))
    assert set(best) == set(ours.state_dict())  # every key, the tied decoder included
    for key, value in best.items():  # the model now holds the best checkpoint's weights
        assert torch.equal(runs[0]["weights"][key], value), key
        # Adam at this rate turns rounding noise into ~1e-4 moves of near-zero parameters
        torch.testing.assert_close(runs[0]["weights"][key], runs[1]["weights"][key], atol=1e-3, rtol=1e-3)
    if runs[0]["best"] != "checkpoint-8":  # the best was not the last: loading it changed the weights
        last = load_file(str(checkpoint.parent / "checkpoint-8" / "model.safetensors"))
        assert not torch.equal(last["bert.embeddings.word_embeddings.weight"],
                               best["bert.embeddings.word_embeddings.weight"])
    again = H.BertForMaskedLM.from_pretrained(tmp_path / "saved", config=ours.config)
    assert again.cls.predictions.decoder.weight is again.bert.embeddings.word_embeddings.weight
    for key, value in ours.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key


def test_a_checkpoint_transformers_saved_in_shards_loads_with_its_outputs(tmp_path):
    """``save_pretrained(max_shard_size=...)`` writes shards and ``model.safetensors.index.json`` (BERT-LARGE
    checkpoints on the Hub come so): bertkit reads every shard, with transformers' outputs."""
    ours, hf = _pair(H.BertForPreTraining)
    hf.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and len(list(tmp_path.glob("model-*"))) > 2
    loaded = H.BertForPreTraining.from_pretrained(tmp_path)
    batch = _batch()
    real = batch["attention_mask"].bool()  # bertkit gives zeros at padding (docs/coming-from-transformers.md)
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).prediction_logits[real], hf(**batch).prediction_logits[real], **TOL)


def test_a_checkpoint_with_an_untied_decoder_is_refused_for_masked_lm_and_loads_as_an_encoder(tmp_path):
    """transformers writes its own decoder where tie_word_embeddings is false; bertkit's masked-LM head is tied, so
    reading that checkpoint as a masked LM would give other logits without a word: refused, naming the tensor. The
    encoder loads, with transformers' hidden states."""
    torch.manual_seed(0)
    hf = transformers.BertForMaskedLM(transformers.BertConfig(**TINY, tie_word_embeddings=False)).eval()
    assert hf.cls.predictions.decoder.weight.data_ptr() != hf.bert.embeddings.word_embeddings.weight.data_ptr()
    hf.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"a masked-LM decoder other than the tied one: \['cls.predictions.decoder."
                                         r"weight differs from bert.embeddings.word_embeddings.weight'\]"):
        H.BertForMaskedLM.from_pretrained(tmp_path)
    batch = _batch()
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        torch.testing.assert_close(BertModel.from_pretrained(tmp_path)(**batch).last_hidden_state[real],
                                   hf.bert(**batch).last_hidden_state[real], **TOL)


@pytest.mark.parametrize("cls", [H.BertForMaskedLM, H.BertForPreTraining], ids=lambda c: c.__name__)
def test_a_checkpoint_holding_the_masked_lm_bias_as_the_decoders_loads_it(cls, tmp_path):
    """The masked-LM bias stored only under its tied copy's name, cls.predictions.decoder.bias: transformers' tied-
    weight map loads it as cls.predictions.bias, and so does bertkit (not a fresh zero bias, other logits)."""
    from safetensors.torch import load_file, save_file

    ours, hf = _pair(cls)
    with torch.no_grad():
        hf.cls.predictions.bias.normal_()
    hf.save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    state["cls.predictions.decoder.bias"] = state.pop("cls.predictions.bias")
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    batch = _batch()
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        theirs = getattr(transformers, cls.__name__).from_pretrained(tmp_path)(**batch)
        loaded = cls.from_pretrained(tmp_path)(**batch)
    logits = theirs.logits if cls is H.BertForMaskedLM else theirs.prediction_logits
    torch.testing.assert_close(loaded.prediction_logits[real], logits[real], **TOL)
    with torch.no_grad():
        torch.testing.assert_close(loaded.prediction_logits[real], hf(**batch)[0][real], **TOL)


def test_fill_mask_runs_a_checkpoint_holding_the_masked_lm_bias_as_the_decoders(tmp_path, tiny_checkpoint):
    """The pipeline's check for a masked-LM head reads the names as loading does: cls.predictions.decoder.bias is
    the bias, and the scores are transformers' fill-mask pipeline's on the same directory."""
    from safetensors.torch import load_file, save_file

    import bertkit

    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(30)]
    directory = tiny_checkpoint(tmp_path, H.BertForMaskedLM, tokenizer=tokens, **{k: v for k, v in TINY.items()
                                                                                   if k != "vocab_size"})
    state = load_file(str(directory / "model.safetensors"))
    state["cls.predictions.decoder.bias"] = state.pop("cls.predictions.bias").normal_(generator=torch.Generator()
                                                                                      .manual_seed(0))
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    texts = ["w1 w2 [MASK] w3", "[MASK] w7"]
    ours = bertkit.pipeline("fill-mask", directory)(texts, top_k=3)
    theirs = transformers.pipeline("fill-mask", model=str(directory), device="cpu", top_k=3)(texts)
    assert [[c["token"] for c in r] for r in ours] == [[c["token"] for c in r] for r in theirs]
    assert [c["score"] for r in ours for c in r] == pytest.approx([c["score"] for r in theirs for c in r], abs=1e-6)


def test_bertkits_own_checkpoints_keep_the_tied_decoder_as_a_view(tmp_path):
    """Only ``state_dict()`` for others lists the tied decoder as a copy: the training loop's checkpoint state
    shares the word-embedding storage (torch.save writes it once) and loading reads the model's views."""
    from bertkit.training.checkpoint import model_state

    model, _ = _pair(H.BertForMaskedLM)
    state = model_state(model)
    embeddings = state["bert.embeddings.word_embeddings.weight"]
    assert state["cls.predictions.decoder.weight"].data_ptr() == embeddings.data_ptr()
    assert model.state_dict()["cls.predictions.decoder.weight"].data_ptr() != embeddings.data_ptr()
    torch.save(state, tmp_path / "shared.pt")
    torch.save(model.state_dict(), tmp_path / "copied.pt")
    grow = (tmp_path / "copied.pt").stat().st_size - (tmp_path / "shared.pt").stat().st_size
    assert grow >= embeddings.numel() * 4  # the copy is written a second time; the view is not


# ---------------------------------------------------------------------------------------------------
# sentence-transformers
# ---------------------------------------------------------------------------------------------------


def test_sentence_transformers_opens_a_bertkit_directory(tmp_path, minilm_2_layers):
    import sentence_transformers as st

    from bertkit import pipeline
    from bertkit.tokenization import BertTokenizer

    model = BertModel.from_pretrained(minilm_2_layers)  # how the directory reads: the same at any depth
    model.save_pretrained(tmp_path)
    BertTokenizer.from_pretrained(minilm_2_layers).save_pretrained(tmp_path)
    texts = ["A man is playing a guitar.", "The quick brown fox jumps over the lazy dog.", "Short.",
             "Sentence embeddings put similar sentences close together, and different ones apart."]
    theirs = st.SentenceTransformer(str(tmp_path), device="cpu")  # no modules.json: it adds mean pooling
    assert any(type(m).__name__ == "Pooling" for m in theirs)
    got = torch.as_tensor(theirs.encode(texts, normalize_embeddings=True))
    want = torch.as_tensor(pipeline("sentence-embedding", str(tmp_path))(texts))
    cosine = torch.nn.functional.cosine_similarity(got, want)
    assert float(cosine.min()) > 0.9999, cosine


# ---------------------------------------------------------------------------------------------------
# torch.compile, torch.export, ONNX (dynamo)
# ---------------------------------------------------------------------------------------------------


def _has_compiler() -> bool:
    return any(shutil.which(c) for c in ("g++", "c++", "clang++"))


@pytest.mark.skipif(not _has_compiler(), reason="torch.compile (inductor) needs a C++ compiler on the CPU")
@pytest.mark.slow  # long; in make test-slow (make test stays under 5 minutes)
def test_torch_compile_equals_eager():
    torch._dynamo.reset()
    ours, _ = _pair(H.BertForSequenceClassification)
    batch = _batch()
    with torch.no_grad():
        want = ours(**batch).logits
        compiled = torch.compile(ours)
        got = compiled(**batch).logits
        got_other = compiled(**_batch(B=4, T=12, seed=1)).logits
        want_other = ours(**_batch(B=4, T=12, seed=1)).logits
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(got_other, want_other, **TOL)


@pytest.mark.parametrize("train", [pytest.param(False, marks=pytest.mark.slow), True], ids=["eval", "train"])
def test_torch_compile_traces_the_whole_model_in_one_graph_as_transformers(train):
    """torch.compile(model) (and fullgraph=True) sees one graph with no break, as on transformers' model: attention
    is traced with the rest (kept out of the graph, each layer was a break: 2 here, 6 on MiniLM, and fullgraph=True
    failed)."""
    ours, hf = _pair(H.BertForSequenceClassification)
    batch = {**_batch(), "labels": torch.tensor([0, 1, 1, 0])}
    for model in (ours, hf):
        torch._dynamo.reset()
        model.train(train)
        explained = torch._dynamo.explain(model)(**batch)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), [r.reason for r in
                                                                                explained.break_reasons]


def test_the_trainer_refuses_a_compiled_model_naming_torch_compile(tmp_path):
    """torch.compile(model)'s forward names no argument: no column would reach the model (transformers' Trainer fails
    on the first batch, "includes input_ids, but you provided ['label']"). Refused when constructed, nothing written,
    naming TrainingArguments(torch_compile=True)."""
    ours, _ = _pair(H.BertForSequenceClassification)
    args = bertkit.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=1, report_to="none")
    for model in (ours, _lora(ours, "SEQ_CLS")):
        with pytest.raises(BertkitError, match=r"^Trainer got torch.compile\(model\) \((BertFor|PeftModelFor)"
                                               r"SequenceClassification compiled\).*TrainingArguments\(torch_compile=True\)"):
            bertkit.Trainer(model=torch.compile(model), args=args, train_dataset=_Rows(4))
    assert not (tmp_path / "out").exists()


def test_torch_export_with_dynamic_batch_and_sequence_equals_eager():
    ours, _ = _pair(BertModel)
    batch, seq = torch.export.Dim("batch", max=64), torch.export.Dim("sequence", min=2, max=TINY["max_position_embeddings"])
    dims = {0: batch, 1: seq}
    b = _batch(3, 10)
    program = torch.export.export(ours, (b["input_ids"], b["attention_mask"], b["token_type_ids"]),
                                  dynamic_shapes=(dims, dims, dims))
    exported = program.module()
    for B, T, seed in ((3, 10, 1), (6, 21, 2), (1, 5, 3)):
        x = _batch(B, T, seed)
        with torch.no_grad():
            want = ours(**x)
            got = exported(x["input_ids"], x["attention_mask"], x["token_type_ids"])
        mask = x["attention_mask"].bool()
        torch.testing.assert_close(got.last_hidden_state[mask], want.last_hidden_state[mask], **TOL)
        torch.testing.assert_close(got.pooler_output, want.pooler_output, **TOL)


# make test-slow (5 s a class): make test keeps test_torch_export_with_dynamic_batch_and_sequence_equals_eager (the
# torch.export capture with dynamic axes the dynamo exporter runs) and test_export.py's onnxruntime checks
@pytest.mark.slow
@pytest.mark.parametrize("cls", [BertModel, H.BertForSequenceClassification, H.BertForQuestionAnswering],
                         ids=lambda c: c.__name__)
def test_dynamo_onnx_export_runs_in_onnxruntime_equal_to_eager(cls, tmp_path):
    """``torch.onnx.export(model, ..., dynamo=True)`` on the model itself (its output dataclass flattens to
    tensors), with dynamic batch and sequence axes, run in onnxruntime on other shapes."""
    import onnxruntime as ort  # the dynamo exporter needs onnxscript too (both in the test extra)

    ours, _ = _pair(cls)
    b = _batch(3, 10)
    dims = {0: torch.export.Dim("batch", max=64), 1: torch.export.Dim("sequence", min=2, max=64)}
    path = tmp_path / "model.onnx"
    torch.onnx.export(ours, (b["input_ids"], b["attention_mask"], b["token_type_ids"]), str(path), dynamo=True,
                      input_names=["input_ids", "attention_mask", "token_type_ids"], dynamic_shapes=(dims, dims, dims))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for B, T, seed in ((3, 10, 1), (5, 17, 2)):
        x = _batch(B, T, seed)
        got = session.run(None, {k: v.numpy() for k, v in x.items()})
        with torch.no_grad():
            out = ours(**x)
        mask = x["attention_mask"].bool()
        if cls is BertModel:
            want = [out.last_hidden_state[mask], out.pooler_output]
            got = [torch.from_numpy(got[0])[mask], torch.from_numpy(got[1])]
        elif cls is H.BertForSequenceClassification:
            want, got = [out.logits], [torch.from_numpy(got[0])]
        else:
            want = [out.start_logits[mask], out.end_logits[mask]]
            got = [torch.from_numpy(got[0])[mask], torch.from_numpy(got[1])[mask]]
        for a, w in zip(got, want):
            torch.testing.assert_close(a, w, **TOL)


# ---------------------------------------------------------------------------------------------------
# datasets
# ---------------------------------------------------------------------------------------------------


def test_datasets_map_with_the_tokenizer_set_format_torch_and_a_forward_pass(minilm_dir):
    """Dataset.map(tokenizer, batched=True) and set_format("torch") give the same columns with bertkit's tokenizer
    as with BertTokenizerFast, and the forward pass on them equals transformers' model."""
    datasets = pytest.importorskip("datasets")
    from bertkit import BertTokenizer

    texts = {"text": ["A man is playing a guitar.", "Paris is the capital of France!", "ok", "Naïve café déjà vu"],
             "label": [0, 1, 1, 0]}
    columns = ["input_ids", "token_type_ids", "attention_mask", "label"]
    encoded = {}
    for name, tok in (("ours", BertTokenizer.from_pretrained(minilm_dir)),
                      ("theirs", transformers.BertTokenizerFast.from_pretrained(minilm_dir))):
        ds = datasets.Dataset.from_dict(texts).map(
            lambda batch, tok=tok: tok(batch["text"], truncation=True, max_length=16, padding="max_length"),
            batched=True)
        ds.set_format("torch", columns=columns)
        encoded[name] = ds[:]
    for c in columns:
        assert torch.equal(encoded["ours"][c], encoded["theirs"][c]), c
    ours, hf = _pair(H.BertForSequenceClassification)
    batch = {k: encoded["ours"][k] % TINY["vocab_size"] if k == "input_ids" else encoded["ours"][k]
             for k in columns[:3]}  # the tiny model's 99 ids: the ids' values were compared above
    with torch.no_grad():
        torch.testing.assert_close(ours(**batch, labels=encoded["ours"]["label"]).logits,
                                   hf(**batch, labels=encoded["theirs"]["label"]).logits, **TOL)
