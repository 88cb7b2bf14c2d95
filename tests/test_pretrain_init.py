"""The two initialisations pre-training from scratch can choose (--mlm-bias-init, --position-init): their
values, that a model starting from them is where they claim, and that the saved model stays a BERT that
transformers loads."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch


def test_unigram_prior_is_the_smoothed_log_frequency_of_the_sampled_targets(tiny_pretraining_data):
    from bertkit.data import PretrainingDataset
    from bertkit.heads import IGNORE_INDEX
    from bertkit.training.pretrain import unigram_log_prior

    ds = PretrainingDataset(tiny_pretraining_data / "data")
    prior = unigram_log_prior(ds, 1500, every=7)
    counts = np.ones(1500)
    for i in range(0, len(ds), 7):
        for t in ds[i]["labels"]:
            if t != IGNORE_INDEX:
                counts[t] += 1
    np.testing.assert_allclose(prior.numpy(), np.log(counts / counts.sum()), rtol=0, atol=1e-6)
    assert math.isclose(float(prior.exp().sum()), 1.0, rel_tol=1e-5)


def test_a_model_with_the_unigram_bias_starts_at_the_unigram_cross_entropy(tiny_pretraining_data):
    """Before any step the word-embedding term is tiny (entries of std 0.02), so the masked-LM loss is the
    prior's cross-entropy on the targets; with the zero bias it is about log(V)."""
    from bertkit import BertConfig
    from bertkit.data import PretrainingDataset, collate_pretraining
    from bertkit.heads import IGNORE_INDEX, BertForMaskedLM
    from bertkit.training.pretrain import unigram_log_prior

    ds = PretrainingDataset(tiny_pretraining_data / "data")
    prior = unigram_log_prior(ds, 1500, every=1)
    batch = collate_pretraining([ds[i] for i in range(64)], pad_id=0)
    batch.pop("next_sentence_label")
    targets = batch["labels"][batch["labels"] != IGNORE_INDEX]
    expected = float(-prior[targets].mean())
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig.preset("tiny", vocab_size=1500)).eval()
    with torch.no_grad():
        zero = float(model(**batch).mlm_loss)
        model.cls.predictions.bias.copy_(prior)
        unigram = float(model(**batch).mlm_loss)
    assert abs(zero - math.log(1500)) < 0.1
    assert abs(unigram - expected) < 0.1
    assert unigram < zero - 1.0


def test_sinusoidal_positions_are_the_transformer_table_at_the_embeddings_scale():
    from bertkit.training.pretrain import sinusoidal_positions

    table = sinusoidal_positions(512, 128, 0.02)
    assert table.shape == (512, 128)
    assert abs(float(table.std()) - 0.02) < 1e-6
    raw = table / table[0, 1]  # the scale undone: column 1 at position 0 is cos(0) = 1
    for pos, i in [(0, 0), (5, 0), (7, 3), (100, 17), (511, 63)]:
        angle = pos / 10000 ** (2 * i / 128)
        assert raw[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-5)
        assert raw[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-5)
    # the property that makes it useful: nearby positions are more alike than distant ones
    sim = torch.nn.functional.cosine_similarity(table[100:101], table, dim=-1)
    assert sim[101] > sim[110] > sim[300]


def test_pretrain_starts_from_both_initialisations_and_saves_a_bert_transformers_loads(tiny_pretraining_data,
                                                                                       tmp_path):
    transformers = pytest.importorskip("transformers")
    from bertkit.data import PretrainingDataset
    from bertkit.settings import PretrainSettings
    from bertkit.training.pretrain import pretrain, sinusoidal_positions, unigram_log_prior

    root = tiny_pretraining_data
    s = PretrainSettings(data=root / "data", vocab=root / "vocab", config_name="tiny", output_dir=tmp_path / "run",
                         max_steps=1, batch_size=4, learning_rate=1e-9, warmup_ratio=0.0, nsp=False,
                         mlm_bias_init="unigram", position_init="sinusoidal", progress=False)
    pretrain(s)
    loaded = transformers.BertForMaskedLM.from_pretrained(tmp_path / "run" / "final")
    prior = unigram_log_prior(PretrainingDataset(root / "data"), 1500)
    torch.testing.assert_close(loaded.cls.predictions.bias.detach(), prior, atol=1e-5, rtol=0)
    table = sinusoidal_positions(512, 128, 0.02)
    torch.testing.assert_close(loaded.bert.embeddings.position_embeddings.weight.detach(), table, atol=1e-5, rtol=0)


def test_the_shipped_one_hour_recipe_is_valid_settings_and_a_bert(tmp_path):
    """examples/pretrain-1h: its settings file builds PretrainSettings through the CLI's reader (a renamed or
    mistyped setting fails here, not an hour into a user's run) and its config.json is a post-LN BERT-tiny
    without dropout."""
    import argparse

    from bertkit.cli_flags import build_settings
    from bertkit.settings import PretrainSettings
    from bertkit.training.pretrain import model_config

    recipe = Path(__file__).resolve().parents[1] / "examples" / "pretrain-1h"
    args = argparse.Namespace(_config_file=[recipe / "pretrain.json"], data=tmp_path, vocab=tmp_path,
                              output_dir=tmp_path / "run", config_name=str(recipe / "config.json"))
    s = build_settings(PretrainSettings, args)
    assert (s.nsp, s.mlm_bias_init, s.position_init, s.batch_size) == (False, "unigram", "sinusoidal", 32)
    assert s.max_steps * s.batch_size > 500_000  # an hour of sequences at the measured ~200 per second
    config = model_config(s.config_name, 8192)
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (2, 128, 2)
    assert config.hidden_dropout_prob == config.attention_probs_dropout_prob == 0.0
    assert (config.vocab_size, config.max_position_embeddings) == (8192, 512)


@pytest.mark.parametrize("chosen", [dict(mlm_bias_init="unigram"), dict(position_init="sinusoidal"),
                                    dict(mlm_bias_init="unigram", position_init="sinusoidal")])
def test_a_new_weights_initialisation_with_init_from_is_refused(tmp_path, chosen):
    """Was: with --init-from the checkpoint's weights were loaded and the chosen initialisation silently not applied."""
    from bertkit.errors import BertkitError
    from bertkit.settings import PretrainSettings

    common = dict(data=tmp_path, vocab=tmp_path, output_dir=tmp_path / "out", max_steps=10, init_from=tmp_path / "m")
    flags = " and ".join(f"--{k.replace('_', '-')} {v}" for k, v in chosen.items())
    with pytest.raises(BertkitError, match=f"^{flags} initialise new weights, but --init-from {tmp_path / 'm'} "):
        PretrainSettings(**common, **chosen)
    assert PretrainSettings(**common, mlm_bias_init="zeros", position_init="normal").init_from == tmp_path / "m"
    assert PretrainSettings(**{**common, "init_from": None}, **chosen).init_from is None


def test_a_model_shape_with_init_from_or_an_empty_one_is_refused(tmp_path):
    """Was: `--config-name large --init-from SMALL` pre-trained SMALL's shape, the preset dropped without a word (the
    checkpoint's config.json is its shape); an empty --config-name was read as the path ".", "config file .
    does not exist"."""
    from bertkit.errors import BertkitError
    from bertkit.settings import PretrainSettings

    common = dict(data=tmp_path, vocab=tmp_path, output_dir=tmp_path / "out", max_steps=10)
    with pytest.raises(BertkitError, match=f"^--config-name large shapes a new model, but --init-from {tmp_path / 'm'} "
                       r"starts from a checkpoint of its own shape \(its config.json\): drop --config-name, or "
                       "--init-from$"):
        PretrainSettings(**common, config_name="large", init_from=tmp_path / "m")
    assert PretrainSettings(**common, init_from=tmp_path / "m").config_name == "mini"  # the default says nothing
    for empty in ("", " "):
        with pytest.raises(BertkitError, match=rf"^--config-name '{empty}' is empty: give a preset \(tiny, mini, "
                           r"small, medium, base, large\) or a config.json path$"):
            PretrainSettings(**common, config_name=empty)


def test_a_step_split_by_accumulation_logs_the_loss_of_its_whole_batch(tiny_pretraining_data, tmp_path):
    """A step of 8 instances logs the loss it trains on, the masked-LM mean over its predicted positions plus the
    next-sentence mean (google-research/bert's loss of the batch), however accumulation splits it. Was: 4 + 4 logged
    the mean of the two halves' masked-LM means (8.000330 against 8.000787 at step 1, while the weights were equal)."""
    from bertkit import BertConfig
    from bertkit.settings import PretrainSettings
    from bertkit.training.pretrain import pretrain

    root = tiny_pretraining_data
    config = BertConfig.preset("tiny", vocab_size=1500, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    logged = []
    for accum in (1, 2):
        result = pretrain(PretrainSettings(
            data=root / "data", vocab=root / "vocab", config_name=config, output_dir=tmp_path / f"accum{accum}",
            max_steps=2, batch_size=8, gradient_accumulation_steps=accum, learning_rate=1e-3, logging_steps=1,
            save_strategy="no", seed=1, progress=False))  # seed 1: step 1's halves hold 20 and 19 targets
        logged.append([r["loss"] for r in result.history if r["split"] == "train"])
    assert len(logged[0]) == 2
    np.testing.assert_allclose(logged[1], logged[0], rtol=1e-6)


def test_a_model_shape_from_a_directory_is_its_config_json(tmp_path, minilm_dir):
    """transformers' --config_name takes a model directory (AutoConfig.from_pretrained); --config-name DIR said
    "config file DIR does not exist". Now DIR is the config.json it holds, with the tokenizer's vocabulary size."""
    from bertkit.training.pretrain import model_config

    from_dir, from_file = model_config(str(minilm_dir), 1500), model_config(str(minilm_dir / "config.json"), 1500)
    assert from_dir.to_dict() == from_file.to_dict()
    assert (from_dir.num_hidden_layers, from_dir.hidden_size, from_dir.vocab_size) == (6, 384, 1500)
