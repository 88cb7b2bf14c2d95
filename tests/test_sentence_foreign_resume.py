"""sentence-transformers' trainers resuming a checkpoint-N bertkit's sentence trainers wrote. Its optimizer.pt is in
their parameter groups, which hold the pooler bertkit's trainers freeze (it gets no gradient; AdamW keeps no moments
for it), its scheduler.pt and rng_state.pth are theirs, and trainer_state.json holds the TrainerControl entry: their
resumed run logs the losses and rates of their uninterrupted run and ends at its weights. The moments are stored once:
bertkit's own resume reads them back from optimizer.pt into its groups."""

from __future__ import annotations

import csv
import importlib
import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from sentence_helpers import st_directory

st = pytest.importorskip("sentence_transformers")
datasets = pytest.importorskip("datasets")
pytest.importorskip("accelerate")


@pytest.fixture(scope="module")
def one_layer(minilm_2_layers, tmp_path_factory) -> Path:
    """MiniLM (its cut vocabulary) with one layer and dropout 0: a step of either library takes milliseconds."""
    out = tmp_path_factory.mktemp("minilm-1-layer")
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(minilm_2_layers / name, out / name)
    config = json.loads((minilm_2_layers / "config.json").read_text())
    config.update(num_hidden_layers=1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (out / "config.json").write_text(json.dumps(config))
    save_file({k: v for k, v in load_file(minilm_2_layers / "model.safetensors").items() if "layer.1." not in k},
              out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def stsb(data_dir) -> list[list[str]]:
    path = data_dir / "glue" / "STS-B" / "train.tsv"
    if not path.is_file():
        pytest.skip(f"{path} absent")
    with path.open(encoding="utf-8") as f:
        return list(csv.reader(f, delimiter="\t", quotechar=None))[1:41]


def _library(lib: str, kind: str):
    """(the package, the trainer's losses, BatchSamplers, MultiDatasetBatchSamplers) of ``lib`` for ``kind``."""
    if lib == "st":
        import sentence_transformers as S
        from sentence_transformers.sentence_transformer.training_args import (
            BatchSamplers,
            MultiDatasetBatchSamplers,
        )
        losses = {"st": "sentence_transformers.sentence_transformer.losses",
                  "ce": "sentence_transformers.cross_encoder.losses",
                  "sparse": "sentence_transformers.sparse_encoder.losses"}[kind]
    else:
        import bertkit.sentence as S
        from bertkit.sentence.training_args import BatchSamplers, MultiDatasetBatchSamplers
        losses = {"st": "bertkit.sentence.losses", "ce": "bertkit.sentence.cross_encoder.losses",
                  "sparse": "bertkit.sentence.sparse_encoder.losses"}[kind]
    return S, importlib.import_module(losses), BatchSamplers, MultiDatasetBatchSamplers


def _rows(case: dict, stsb: list[list[str]]):
    n, kind, loss = case["n"], case.get("kind", "st"), case.get("loss", "mnrl")
    if kind == "ce" or loss == "cosent":
        rows = [{"s1": r[7], "s2": r[8], "score": float(r[9]) / 5} for r in stsb[:n]]
    elif loss == "batch_all":
        rows = [{"text": r[7], "label": i % 4} for i, r in enumerate(stsb[:n])]
    else:
        rows = [{"anchor": r[7], "positive": r[8]} for r in stsb[:n]]
    if case.get("multi"):  # a second dataset, of another loss
        other = [{"s1": r[7], "s2": r[8], "score": float(r[9]) / 5} for r in stsb[n:n + 12]]
        return {"a": datasets.Dataset.from_list(rows), "b": datasets.Dataset.from_list(other)}
    return datasets.Dataset.from_list(rows)


def _train(lib: str, case: dict, model_dir: Path, stsb, out: Path, resume: str | None = None):
    """The training script of ``case``; ``lib`` picks the import. Returns each logged (step, loss, rate) and the
    trained weights."""
    kind = case.get("kind", "st")
    S, losses, BatchSamplers, MultiDatasetBatchSamplers = _library(lib, kind)
    if kind == "ce":
        model = S.CrossEncoder(str(model_dir), device="cpu")
        loss, Args, Trainer = losses.BinaryCrossEntropyLoss(model), S.CrossEncoderTrainingArguments, S.CrossEncoderTrainer
    elif kind == "sparse":
        model = S.SparseEncoder(str(model_dir), device="cpu")
        model.max_seq_length = 64
        loss = losses.SpladeLoss(model, losses.SparseMultipleNegativesRankingLoss(model),
                                 document_regularizer_weight=3e-3, query_regularizer_weight=5e-3)
        Args, Trainer = S.SparseEncoderTrainingArguments, S.SparseEncoderTrainer
    else:
        model = S.SentenceTransformer(str(model_dir), device="cpu")
        loss = {"mnrl": losses.MultipleNegativesRankingLoss, "cosent": losses.CoSENTLoss,
                "batch_all": losses.BatchAllTripletLoss}[case.get("loss", "mnrl")](model)
        if case.get("multi"):
            loss = {"a": loss, "b": losses.CoSENTLoss(model)}
        Args, Trainer = S.SentenceTransformerTrainingArguments, S.SentenceTransformerTrainer
    args = Args(output_dir=str(out), per_device_train_batch_size=case["batch"], max_steps=case["steps"],
                save_steps=case["save"], learning_rate=case.get("lr", 1e-4), weight_decay=case.get("decay", 0.01),
                warmup_steps=case.get("warmup", 1), lr_scheduler_type=case.get("schedule", "linear"),
                gradient_accumulation_steps=case.get("accumulation", 1), logging_steps=1, seed=case.get("seed", 3),
                batch_sampler=getattr(BatchSamplers, case.get("sampler", "BATCH_SAMPLER")),
                multi_dataset_batch_sampler=getattr(MultiDatasetBatchSamplers, case.get("multi", "PROPORTIONAL")),
                learning_rate_mapping=case.get("rates") or {}, report_to="none", use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=_rows(case, stsb), loss=loss)
    trainer.train(resume_from_checkpoint=resume)
    logged = [(h["step"], round(h["loss"], 5), h["learning_rate"]) for h in trainer.state.log_history if "loss" in h]
    return logged, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _model_dir(case: dict, one_layer: Path, tmp_path: Path) -> Path:
    kind = case.get("kind", "st")
    if kind == "ce":  # its classifier drawn once, so that both libraries start from it
        torch.manual_seed(0)
        st.CrossEncoder(str(one_layer), num_labels=1, device="cpu").save(str(tmp_path / "ce"))
        return tmp_path / "ce"
    if kind == "sparse":
        from sparse_helpers import masked_lm_checkpoint

        return masked_lm_checkpoint(one_layer, tmp_path / "mlm", dropout=0.0)
    return st_directory(one_layer, tmp_path / "model", dropout=0.0)


def _check(case: dict, one_layer: Path, stsb, tmp_path: Path, own: bool = True) -> None:
    """bertkit's run to ``save``, continued by sentence-transformers' trainer, against sentence-transformers'
    uninterrupted run: the same logged losses and rates, and weights as close as bertkit's own whole run is to it
    (the two libraries' forward passes differ by float rounding, which AdamW's first steps make ~1e-5). bertkit's
    resume of its own checkpoint (``own``) gives its uninterrupted run exactly."""
    model_dir = _model_dir(case, one_layer, tmp_path)
    ours, our_weights = _train("bertkit", case, model_dir, stsb, tmp_path / "bertkit")
    whole, weights = _train("st", case, model_dir, stsb, tmp_path / "whole")
    cut = tmp_path / "bertkit" / f"checkpoint-{case['save']}"
    shutil.copytree(cut, tmp_path / "resumed" / cut.name)
    resumed, resumed_weights = _train("st", case, model_dir, stsb, tmp_path / "resumed",
                                      str(tmp_path / "resumed" / cut.name))
    for got in (resumed, ours):  # (a loss may differ in its fifth decimal, as bertkit's own run's does)
        assert [(step, rate) for step, _, rate in got] == [(step, rate) for step, _, rate in whole], case
        assert [loss for _, loss, _ in got] == pytest.approx([loss for _, loss, _ in whole], abs=3e-5), case
    parity = max((our_weights[k] - weights[k]).abs().max().item() for k in weights)
    for name, value in resumed_weights.items():
        torch.testing.assert_close(value, weights[name], rtol=0, atol=max(1e-5, 2 * parity), msg=f"{name} {case}")
    if not own:
        return
    shutil.copytree(tmp_path / "bertkit", tmp_path / "bertkit-resumed")  # its manifest: the files are bertkit's
    for later in (tmp_path / "bertkit-resumed").glob("checkpoint-*"):
        if int(later.name.split("-")[1]) > case["save"]:
            shutil.rmtree(later)
    again, again_weights = _train("bertkit", case, model_dir, stsb, tmp_path / "bertkit-resumed",
                                  str(tmp_path / "bertkit-resumed" / cut.name))
    assert again == ours, case
    for name, value in again_weights.items():
        torch.testing.assert_close(value, our_weights[name], rtol=0, atol=0, msg=f"{name} {case}")


def test_sentence_transformers_trainer_resumes_a_bertkit_checkpoint_as_its_own_uninterrupted_run(one_layer, stsb,
                                                                                               tmp_path):
    """bertkit's checkpoint-2 of a 4-step run (weight decay: two groups; a warm-up), resumed by sentence-transformers'
    SentenceTransformerTrainer. Was: it found no optimizer.pt or scheduler.pt and went on, without a word, with a
    fresh AdamW and the schedule from its first step (step 3 at the warm-up's rate 0 where the run was at 6.7e-05),
    then stopped at its first save with KeyError: 'TrainerControl'. An optimizer.pt in bertkit's own groups (without
    the pooler) was refused: "loaded state dict contains a parameter group that doesn't match the size of
    optimizer's group". Now it logs sentence-transformers' uninterrupted losses and rates and ends at its weights;
    optimizer.pt lists the pooler's two tensors, without moments, and state.pt names it."""
    torch.set_num_threads(1)
    _check({"n": 16, "batch": 4, "steps": 4, "save": 2}, one_layer, stsb, tmp_path, own=False)
    cut = tmp_path / "bertkit" / "checkpoint-2"
    saved, state = torch.load(cut / "optimizer.pt", weights_only=True), torch.load(cut / "state.pt", weights_only=True)
    assert [len(g["params"]) for g in saved["param_groups"]] == [10, 13]  # the pooler's weight, then its bias
    assert len(saved["state"]) == 21 and {9, 22}.isdisjoint(saved["state"])
    assert state["optimizer"] == "optimizer.pt"  # the moments are stored once


@pytest.mark.slow  # the guard of the SoftmaxLoss refusal; the fast sibling above covers the common case
def test_a_loss_with_weights_of_its_own_is_refused_by_sentence_transformers_and_resumed_by_bertkit(one_layer, stsb,
                                                                                                   tmp_path):
    """SoftmaxLoss's classifier is the loss's, not the model's: sentence-transformers' resume restores the model's
    weights alone, so its run would go on with the classifier the script draws anew and the trained one's moments.
    Was: its trainer resumed bertkit's checkpoint so without a word (a 6-step run cut at 3: step 4's loss
    1.10087 where its uninterrupted run has 1.10743). Now optimizer.pt leaves the classifier out of their groups, so their trainer refuses it before a
    step; state.pt holds the classifier's moments, and bertkit's resume is its uninterrupted run, exactly."""
    import bertkit.sentence as bk
    from bertkit.sentence import losses

    torch.set_num_threads(1)
    model_dir = st_directory(one_layer, tmp_path / "model", dropout=0.0)
    rows = datasets.Dataset.from_list([{"s1": r[7], "s2": r[8], "label": int(float(r[9])) % 3} for r in stsb[:12]])

    def run(lib, out: Path, resume: str | None = None):
        S, lib_losses = (bk, losses) if lib == "bertkit" else (st, importlib.import_module(
            "sentence_transformers.sentence_transformer.losses"))
        model = S.SentenceTransformer(str(model_dir), device="cpu")
        torch.manual_seed(0)
        loss = lib_losses.SoftmaxLoss(model, sentence_embedding_dimension=384, num_labels=3)
        args = S.SentenceTransformerTrainingArguments(
            output_dir=str(out), per_device_train_batch_size=4, max_steps=4, save_steps=2, learning_rate=1e-3,
            logging_steps=1, seed=3, report_to="none", use_cpu=True, disable_tqdm=True)
        trainer = S.SentenceTransformerTrainer(model=model, args=args, train_dataset=rows, loss=loss)
        trainer.train(resume_from_checkpoint=resume)
        return [h["loss"] for h in trainer.state.log_history if "loss" in h], loss.classifier.weight.detach().clone()

    whole, classifier = run("bertkit", tmp_path / "bertkit")
    cut = tmp_path / "bertkit" / "checkpoint-2"
    shutil.copytree(cut, tmp_path / "st" / cut.name)
    with pytest.raises(ValueError, match="parameter group that doesn't match the size of optimizer's group"):
        run("st", tmp_path / "st", str(tmp_path / "st" / cut.name))
    shutil.copytree(tmp_path / "bertkit", tmp_path / "again")
    shutil.rmtree(tmp_path / "again" / "checkpoint-4")
    resumed, resumed_classifier = run("bertkit", tmp_path / "again", str(tmp_path / "again" / cut.name))
    assert resumed == whole and torch.equal(resumed_classifier, classifier)
    assert "optimizer_withheld" in torch.load(cut / "state.pt", weights_only=True)


@pytest.mark.parametrize("loss_name,save", [("SoftmaxLoss", True), ("SoftmaxLoss", False), ("CoSENTLoss", True)])
def test_a_run_whose_checkpoints_sentence_transformers_cannot_resume_says_so_as_it_starts(one_layer, stsb, tmp_path,
                                                                                          caplog, loss_name, save):
    """Was: a SoftmaxLoss run wrote its checkpoints without a word, and sentence-transformers' trainer resuming one
    failed with torch's bare "loaded state dict contains a parameter group that doesn't match the size of optimizer's
    group". Their checkpoints hold the model alone (the classifier is the loss's), so the file cannot be theirs and
    keep the run exact; the run now says so as it starts, naming the weights, wherever it writes checkpoints."""
    import bertkit.sentence as bk
    from bertkit.sentence import losses

    torch.set_num_threads(1)
    model = bk.SentenceTransformer(str(st_directory(one_layer, tmp_path / "model", dropout=0.0)), device="cpu")
    rows = datasets.Dataset.from_list([{"s1": r[7], "s2": r[8], "label": int(float(r[9])) % 3} for r in stsb[:4]])
    if loss_name == "SoftmaxLoss":
        loss = losses.SoftmaxLoss(model, sentence_embedding_dimension=384, num_labels=3)
    else:
        loss, rows = losses.CoSENTLoss(model), rows.map(lambda r: {"label": r["label"] / 2})
    args = bk.SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=1, report_to="none",
        save_strategy="steps" if save else "no", save_steps=1, use_cpu=True, disable_tqdm=True)
    with caplog.at_level("WARNING", logger="bertkit"):
        bk.SentenceTransformerTrainer(model=model, args=args, train_dataset=rows, loss=loss).train()
    said = [r.getMessage() for r in caplog.records if "weights of its own" in r.getMessage()]
    if loss_name == "CoSENTLoss" or not save:
        assert said == []
        return
    assert said == ["the loss has weights of its own (classifier.weight, classifier.bias), which this run's "
                    "checkpoints hold in state.pt: resume_from_checkpoint here continues them exactly; "
                    "sentence-transformers' trainers keep the model alone (a resume of theirs draws such weights "
                    "anew) and refuse these checkpoints' optimizer.pt (\"loaded state dict contains a parameter group "
                    "that doesn't match the size of optimizer's group\"); SentenceTransformer(checkpoint) loads the "
                    "model"]
    assert (tmp_path / "out" / "checkpoint-1" / "optimizer.pt").is_file()


def _cases(seed: int, count: int) -> list[dict]:
    """Varied scripts: the three trainers, each batch sampler, several datasets (each multi-dataset sampler), a
    learning rate per pattern (one matching the pooler alone: a group bertkit's optimiser does not have),
    accumulation, schedules, a cut anywhere in the run (within an epoch or at its end)."""
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        kind = rng.choice(["st", "st", "st", "ce", "sparse"])
        loss = rng.choice(["mnrl", "cosent", "batch_all"]) if kind == "st" else "mnrl"
        samplers = ["BATCH_SAMPLER", "NO_DUPLICATES"] + (["GROUP_BY_LABEL"] if loss == "batch_all" else [])
        steps = rng.randint(4, 8)
        case = {"kind": kind, "loss": loss, "n": rng.choice([16, 20, 24]), "steps": steps,
                "save": rng.randint(1, steps - 1), "sampler": rng.choice(samplers), "seed": rng.randint(0, 99),
                "decay": rng.choice([0.0, 0.01]), "warmup": rng.choice([0, 1, 2]),
                "schedule": rng.choice(["linear", "cosine", "constant_with_warmup"]),
                "accumulation": rng.choice([1, 1, 2]), "lr": rng.choice([1e-4, 2e-4])}
        case["batch"] = rng.choice([4, 8]) if case["sampler"] == "GROUP_BY_LABEL" else rng.choice([3, 4, 6])
        if rng.random() < 0.35:  # (the masked-LM model of the sparse encoder has no pooler)
            case["rates"] = rng.choice([{"encoder": 3e-4}, {"embeddings": 5e-5}] + (
                [{"pooler": 1e-3}, {r"model\.0\.model\.(encoder|pooler)": 2e-4}] if kind == "st" else []))
        if kind == "st" and loss != "batch_all" and rng.random() < 0.4:
            case["multi"] = rng.choice(["PROPORTIONAL", "ROUND_ROBIN"])
        cases.append(case)
    return cases


@pytest.mark.slow  # about 40 s
def test_sentence_transformers_trainers_resume_varied_bertkit_checkpoints(one_layer, stsb, tmp_path):
    torch.set_num_threads(1)
    for i, case in enumerate(_cases(seed=11, count=12)):
        _check(case, one_layer, stsb, tmp_path / str(i))
