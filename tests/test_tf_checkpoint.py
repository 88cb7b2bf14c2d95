"""google-research/bert TensorFlow checkpoints: read without TensorFlow, converted to the HF layout.

The slow test builds a tiny BERT in TensorFlow itself with Google's variable names and Google's
conventions (x @ kernel, (in, out) kernels, output_weights (out, in)), computes its outputs in TensorFlow,
saves it with tf.compat.v1.train.Saver (the way run_pretraining.py does, optimizer slots and
global_step included), converts it with `bertkit convert-tf-checkpoint`, and compares bertkit's and
transformers' outputs on the converted directory with TensorFlow's.
"""

from __future__ import annotations

import errno
import json
import os
import re

import numpy as np
import pytest
import torch

from bertkit.cli import main
from bertkit.errors import BertkitError
from bertkit.heads import BertForPreTraining
from bertkit.inference.tf_checkpoint import (
    convert_tf_checkpoint,
    read_sstable,
    read_tf_checkpoint,
    tf_to_published,
)
from bertkit.tokenization import BertTokenizer
from tf_bundle_helpers import reference_crc32c, write_bundle  # tests/ is on sys.path under pytest

V, H, L, NH, I, P, B, T = 40, 16, 2, 4, 24, 32, 2, 9
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(V - 5)]


def _build_tf_checkpoint(tf, directory, ids, types, mask) -> dict[str, np.ndarray]:
    """Save a tiny Google-named BERT with TensorFlow; returns TensorFlow's outputs on the inputs."""
    v1 = tf.compat.v1
    rng = np.random.default_rng(0)
    graph = tf.Graph()
    with graph.as_default():
        def var(name, shape, around=0.0):
            return v1.get_variable(name, initializer=(around + rng.normal(0, 0.2, shape)).astype(np.float32))

        def dense(x, scope, n_out):
            with v1.variable_scope(scope):
                return tf.matmul(x, var("kernel", [x.shape[-1], n_out])) + var("bias", [n_out])

        def layer_norm(x, scope):
            with v1.variable_scope(scope):
                gamma, beta = var("gamma", [H], around=1.0), var("beta", [H])
                mean, variance = tf.nn.moments(x, [-1], keepdims=True)
                return (x - mean) * tf.math.rsqrt(variance + 1e-12) * gamma + beta

        def gelu(x):
            return 0.5 * x * (1.0 + tf.math.erf(x / np.sqrt(2.0)))

        def split_heads(t):
            return tf.transpose(tf.reshape(t, [B, T, NH, H // NH]), [0, 2, 1, 3])

        with v1.variable_scope("bert"):
            with v1.variable_scope("embeddings"):
                word = var("word_embeddings", [V, H])
                x = (tf.gather(word, ids) + tf.gather(var("token_type_embeddings", [2, H]), types)
                     + var("position_embeddings", [P, H])[None, :T])
                x = tf.reshape(layer_norm(x, "LayerNorm"), [B * T, H])
            additive = (1.0 - tf.constant(mask, tf.float32)[:, None, None, :]) * -10000.0
            with v1.variable_scope("encoder"):
                for i in range(L):
                    with v1.variable_scope(f"layer_{i}"):
                        with v1.variable_scope("attention"):
                            with v1.variable_scope("self"):
                                q, k, v = (split_heads(dense(x, n, H)) for n in ("query", "key", "value"))
                            scores = tf.matmul(q, k, transpose_b=True) / np.sqrt(H // NH) + additive
                            ctx = tf.reshape(tf.transpose(tf.matmul(tf.nn.softmax(scores), v), [0, 2, 1, 3]), [B * T, H])
                            with v1.variable_scope("output"):
                                a = layer_norm(dense(ctx, "dense", H) + x, "LayerNorm")
                        with v1.variable_scope("intermediate"):
                            h = gelu(dense(a, "dense", I))
                        with v1.variable_scope("output"):
                            x = layer_norm(dense(h, "dense", H) + a, "LayerNorm")
            sequence = tf.reshape(x, [B, T, H])
            with v1.variable_scope("pooler"):
                pooled = tf.tanh(dense(sequence[:, 0], "dense", H))
        with v1.variable_scope("cls/predictions"):
            with v1.variable_scope("transform"):
                t = layer_norm(gelu(dense(x, "dense", H)), "LayerNorm")
            mlm = tf.reshape(tf.matmul(t, word, transpose_b=True) + var("output_bias", [V]), [B, T, V])
        with v1.variable_scope("cls/seq_relationship"):
            nsp = tf.matmul(pooled, var("output_weights", [2, H]), transpose_b=True) + var("output_bias", [2])
        # What run_pretraining.py checkpoints also carry: Adam slots and the step counter.
        var("bert/embeddings/word_embeddings/adam_m", [V, H])
        var("cls/seq_relationship/output_bias/adam_v", [2])
        v1.train.get_or_create_global_step()
        saver = v1.train.Saver()
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            outputs = sess.run({"sequence": sequence, "pooled": pooled, "mlm": mlm, "nsp": nsp})
            saver.save(sess, str(directory / "bert_model.ckpt"))
    (directory / "bert_config.json").write_text(json.dumps({
        "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": H,
        "initializer_range": 0.02, "intermediate_size": I, "max_position_embeddings": P, "num_attention_heads": NH,
        "num_hidden_layers": L, "type_vocab_size": 2, "vocab_size": V}))
    (directory / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return outputs


@pytest.fixture(scope="module")
def tf_checkpoint(tmp_path_factory):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # plain kernels: the reference should not vary
    tf = pytest.importorskip("tensorflow", reason="needs TensorFlow to write the checkpoint: pip install tensorflow-cpu")
    rng = np.random.default_rng(1)
    ids = rng.integers(5, V, (B, T))
    ids[:, 0] = 2
    types = np.zeros((B, T), dtype=np.int64)
    types[:, 5:] = 1
    mask = np.ones((B, T), dtype=np.int64)
    mask[1, 6:] = 0
    ids[1, 6:] = 0
    d = tmp_path_factory.mktemp("google_bert")
    outputs = _build_tf_checkpoint(tf, d, ids, types, mask)
    return d, outputs, (ids, types, mask)


@pytest.mark.slow
def test_tensorflow_checkpoint_converts_to_equal_outputs(tf_checkpoint, tmp_path):
    d, ref, (ids, types, mask) = tf_checkpoint
    out = tmp_path / "converted"
    assert main(["convert-tf-checkpoint", "--tf-checkpoint", str(d / "bert_model.ckpt"), "--bert-config",
                 str(d / "bert_config.json"), "--vocab", str(d / "vocab.txt"), "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForPreTraining"]
    assert json.loads((out / "tokenizer_config.json").read_text())["do_lower_case"] is True  # uncased vocab
    inputs = [torch.from_numpy(a) for a in (ids, types, mask)]
    real = inputs[2].bool()
    model = BertForPreTraining.from_pretrained(out).eval()
    with torch.no_grad():
        o = model(inputs[0], inputs[2], inputs[1], output_hidden_states=True)  # transformers order: ids, mask, types
    tol = dict(atol=2e-5, rtol=0)
    torch.testing.assert_close(o.hidden_states[-1][real], torch.from_numpy(ref["sequence"])[real], **tol)
    torch.testing.assert_close(o.prediction_logits[real], torch.from_numpy(ref["mlm"])[real], **tol)
    torch.testing.assert_close(o.seq_relationship_logits, torch.from_numpy(ref["nsp"]), **tol)
    transformers = pytest.importorskip("transformers")
    hf = transformers.BertForPreTraining.from_pretrained(out).eval()
    with torch.no_grad():
        h = hf(input_ids=inputs[0], token_type_ids=inputs[1], attention_mask=inputs[2])
    torch.testing.assert_close(h.prediction_logits[real], torch.from_numpy(ref["mlm"])[real], **tol)
    torch.testing.assert_close(h.seq_relationship_logits, torch.from_numpy(ref["nsp"]), **tol)


@pytest.mark.slow
def test_reader_sees_every_variable_and_refuses_mismatches(tf_checkpoint, tmp_path):
    d, _, _ = tf_checkpoint
    variables = read_tf_checkpoint(d / "bert_model.ckpt")
    assert "global_step" in variables and variables["global_step"].dtype == np.int64
    assert variables["bert/encoder/layer_1/intermediate/dense/kernel"].shape == (H, I)  # (in, out) in TF
    assert len(read_sstable(d / "bert_model.ckpt.index")) == len(variables) + 1  # + the bundle header
    with pytest.raises(BertkitError, match="not a TensorFlow checkpoint index"):
        (tmp_path / "x.ckpt.index").write_bytes(b"not a table" * 10)
        read_tf_checkpoint(tmp_path / "x.ckpt")


# ---------------------------------------------------------------------------------------------------
# A tensor bundle written without TensorFlow (tf_bundle_helpers): the reader and the name table in the fast suite
# ---------------------------------------------------------------------------------------------------


def _google_names(published: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """The published names back to Google's, written out by hand (independent of ``published_name``)."""
    out = {}
    for name, t in published.items():
        g = name.replace("bert.encoder.layer.", "bert/encoder/layer_").replace(".", "/")
        g = re.sub(r"LayerNorm/weight$", "LayerNorm/gamma", g)
        g = re.sub(r"LayerNorm/bias$", "LayerNorm/beta", g)
        a = t.numpy()
        if g.endswith("_embeddings/weight"):
            g = g[: -len("/weight")]
        elif g == "cls/predictions/bias":
            g = "cls/predictions/output_bias"
        elif g.startswith("cls/seq_relationship/"):
            g = g.replace("/weight", "/output_weights").replace("/bias", "/output_bias")
        elif g.endswith("/weight"):
            g, a = g[: -len("weight")] + "kernel", a.T
        out[g] = a
    return out


def test_bundle_written_without_tensorflow_converts_to_equal_outputs(tmp_path, tiny_model, monkeypatch):
    model = tiny_model(BertForPreTraining, vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=NH,
                       intermediate_size=I, max_position_embeddings=P, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0).eval()
    google = _google_names(model.published_state_dict())
    assert "bert/encoder/layer_1/attention/self/query/kernel" in google and "cls/predictions/output_bias" in google
    google["global_step"] = np.zeros((), np.float32)
    google["bert/pooler/dense/kernel/adam_m"] = np.zeros((H, H), np.float32)
    write_bundle(tmp_path / "bert_model.ckpt", google)
    config = {k: v for k, v in model.config.to_dict().items() if k not in ("model_type", "architectures")}
    (tmp_path / "bert_config.json").write_text(json.dumps(config))
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    assert set(read_tf_checkpoint(tmp_path / "bert_model.ckpt")) == set(google)
    out = tmp_path / "out"
    result = convert_tf_checkpoint(tmp_path / "bert_model.ckpt.index", tmp_path / "bert_config.json",
                                   tmp_path / "vocab.txt", out)
    assert result["architecture"] == "BertForPreTraining" and result["tensors"] == len(google) - 2  # optimizer slot and step skipped
    with pytest.raises(BertkitError, match="already holds config.json"):
        convert_tf_checkpoint(tmp_path / "bert_model.ckpt", tmp_path / "bert_config.json", tmp_path / "vocab.txt", out)
    # another tokenizer's tokenizer.json (the file transformers reads first) is not replaced either
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "tokenizer.json").write_text("{}")
    with pytest.raises(BertkitError, match="already holds tokenizer.json"):
        convert_tf_checkpoint(tmp_path / "bert_model.ckpt", tmp_path / "bert_config.json", tmp_path / "vocab.txt",
                              tmp_path / "other")
    # truncation=True cuts at the model's positions (was 512 over its P, and transformers' forward an IndexError)
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == P
    assert len(BertTokenizer.from_pretrained(out)(" ".join(VOCAB * 3), truncation=True)["input_ids"]) == P
    converted = BertForPreTraining.from_pretrained(out).eval()
    ids = torch.randint(5, V, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = model(ids), converted(ids)
    torch.testing.assert_close(b.prediction_logits, a.prediction_logits, atol=0, rtol=0)
    torch.testing.assert_close(b.seq_relationship_logits, a.seq_relationship_logits, atol=0, rtol=0)
    with pytest.raises(BertkitError, match=r"missing keys: \['bert.encoder.layer.1.output.dense.weight'"):
        write_bundle(tmp_path / "partial.ckpt", {k: v for k, v in google.items() if "layer_1/output/dense" not in k})
        convert_tf_checkpoint(tmp_path / "partial.ckpt", tmp_path / "bert_config.json", tmp_path / "vocab.txt",
                              tmp_path / "partial")
    # a config with fewer layers than the checkpoint: the layers past it are named, nothing is written
    (tmp_path / "one_layer.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    with pytest.raises(BertkitError, match=r"unexpected keys: \['bert.encoder.layer.1.attention"):
        convert_tf_checkpoint(tmp_path / "bert_model.ckpt", tmp_path / "one_layer.json", tmp_path / "vocab.txt",
                              tmp_path / "one_layer")
    assert not (tmp_path / "one_layer").exists() and not (tmp_path / "partial").exists()
    # a failure while saving the tokenizer: no model without its vocabulary at the name, and the next run is not
    # refused for the files of the one that failed (it wrote config.json and model.safetensors, then stopped)
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(BertTokenizer, "save_pretrained", full)
        with pytest.raises(BertkitError, match="no space left on the device"):
            convert_tf_checkpoint(tmp_path / "bert_model.ckpt", tmp_path / "bert_config.json",
                                  tmp_path / "vocab.txt", tmp_path / "again")
    assert not (tmp_path / "again").exists()
    convert_tf_checkpoint(tmp_path / "bert_model.ckpt", tmp_path / "bert_config.json", tmp_path / "vocab.txt",
                          tmp_path / "again")
    assert (tmp_path / "again" / "vocab.txt").read_text() == (tmp_path / "vocab.txt").read_text()
    with pytest.raises(BertkitError, match=r"variables bertkit does not know: \['cls/squad/extra'\]"):
        tf_to_published({**google, "cls/squad/extra": np.zeros(2, np.float32)})


@pytest.mark.parametrize("extra", [
    # google-research/bert's AdamWeightDecayOptimizer as a tf.train.Optimizer subclass names its slots after itself
    ("bert/pooler/dense/kernel/AdamWeightDecayOptimizer", "bert/pooler/dense/kernel/AdamWeightDecayOptimizer_1"),
    # tf.train.AdamOptimizer: slots Adam, Adam_1 and its two non-slot accumulators at the root
    ("bert/pooler/dense/kernel/Adam", "bert/pooler/dense/kernel/Adam_1", "beta1_power", "beta2_power"),
    # NVIDIA's LAMBOptimizer (DeepLearningExamples' TensorFlow BERT), beside its loss scaling's variables
    ("bert/pooler/dense/kernel/lamb_m", "bert/pooler/dense/kernel/lamb_v", "good_steps", "loss_scale"),
])
def test_optimizer_state_of_other_optimizers_is_skipped(extra):
    """Optimizer state is skipped (every variable transformers' load_tf_weights_in_bert skips, and LAMB's slots):
    the same weights come out, not an error on a training checkpoint."""
    rng = np.random.default_rng(0)
    weights = {"bert/pooler/dense/bias": rng.standard_normal(H).astype(np.float32),
               "bert/pooler/dense/kernel": rng.standard_normal((H, 3)).astype(np.float32)}
    published = tf_to_published({**weights, **{name: np.ones((), np.float32) for name in extra}})
    assert list(published) == ["bert.pooler.dense.bias", "bert.pooler.dense.weight"]
    assert torch.equal(published["bert.pooler.dense.weight"], torch.from_numpy(weights["bert/pooler/dense/kernel"].T))


def test_a_vocabulary_of_another_size_is_refused_before_the_checkpoint_is_read(tmp_path, monkeypatch):
    """A vocab.txt that is not the checkpoint's is named before the weights (1.3 GB for BERT-LARGE) are read."""
    import bertkit.inference.tf_checkpoint as tf_checkpoint

    (tmp_path / "bert_config.json").write_text(json.dumps({"vocab_size": V, "hidden_size": H, "num_hidden_layers": L,
                                                            "num_attention_heads": NH, "intermediate_size": I}))
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB[:-1]) + "\n")
    monkeypatch.setattr(tf_checkpoint, "read_tf_checkpoint", lambda *a, **k: pytest.fail("the checkpoint was read"))
    with pytest.raises(BertkitError, match=rf"vocab.txt has {V - 1} tokens but .*bert_config.json says vocab_size {V}"):
        convert_tf_checkpoint(tmp_path / "bert_model.ckpt", tmp_path / "bert_config.json", tmp_path / "vocab.txt",
                              tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_tensorflow_2_object_based_checkpoint_is_read_and_named_as_such_by_the_converter(tmp_path):
    """tf.train.Checkpoint (tensorflow/models' BERT) names variables by object path beside a string object graph:
    read as tf.train.load_checkpoint reads it (was refused by the reader too), refused by the converter as that kind
    of checkpoint, saying what to convert instead, not as unknown variables."""
    write_bundle(tmp_path / "bert_model.ckpt", {"_CHECKPOINTABLE_OBJECT_GRAPH": np.zeros(1, np.float32),
                                                "model/w/.ATTRIBUTES/VARIABLE_VALUE": np.ones((2, 2), np.float32)})
    assert read_tf_checkpoint(tmp_path)["model/w/.ATTRIBUTES/VARIABLE_VALUE"].tolist() == [[1.0, 1.0], [1.0, 1.0]]
    (tmp_path / "bert_config.json").write_text(json.dumps({"vocab_size": V, "hidden_size": H, "num_hidden_layers": L,
                                                            "num_attention_heads": NH, "intermediate_size": I}))
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    with pytest.raises(BertkitError, match=r"bert_model.ckpt is a TensorFlow 2 object-based checkpoint .*: convert "
                                           r"the bert_model.ckpt of google-research/bert's download of the same model, "
                                           r"or save the variables with tf.compat.v1.train.Saver"):
        convert_tf_checkpoint(tmp_path / "bert_model.ckpt", tmp_path / "bert_config.json", tmp_path / "vocab.txt",
                              tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_without_the_next_sentence_head_converts_as_a_masked_lm(tmp_path, tiny_model):
    """No cls/seq_relationship variables: the masked LM it holds, not a pre-training model whose next-sentence head
    would be written with random weights that load later as if they were the checkpoint's."""
    from bertkit.heads import BertForMaskedLM

    model = tiny_model(BertForPreTraining, vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=NH,
                       intermediate_size=I, max_position_embeddings=P).eval()
    google = {k: v for k, v in _google_names(model.published_state_dict()).items()
              if not k.startswith("cls/seq_relationship/")}
    write_bundle(tmp_path / "bert_model.ckpt", google)
    config = {k: v for k, v in model.config.to_dict().items() if k not in ("model_type", "architectures")}
    (tmp_path / "bert_config.json").write_text(json.dumps(config))
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    result = convert_tf_checkpoint(tmp_path / "bert_model.ckpt", tmp_path / "bert_config.json", tmp_path / "vocab.txt",
                                   tmp_path / "out")
    assert result["architecture"] == "BertForMaskedLM" and result["tensors"] == len(google)
    ids = torch.randint(5, V, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = model(ids).prediction_logits, BertForMaskedLM.from_pretrained(tmp_path / "out")(ids).logits
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_crc32c_matches_the_standard_check_value_and_a_bitwise_reference():
    from bertkit.inference.tf_checkpoint import crc32c

    assert crc32c(b"123456789") == 0xE3069283 == reference_crc32c(b"123456789")  # RFC 3720's check value
    data = np.random.default_rng(0).integers(0, 256, 70_001, dtype=np.uint8).tobytes()  # chunked and a tail
    assert crc32c(data) == reference_crc32c(data)
    assert crc32c(b"") == 0


def test_a_corrupted_data_shard_fails_its_checksum_naming_the_tensor_and_file(tmp_path):
    """TF records each tensor's masked crc32c in the index; one flipped byte in the data shard is refused, naming
    the variable and the file, instead of converting into a model with one wrong weight."""
    rng = np.random.default_rng(0)
    tensors = {"bert/pooler/dense/bias": rng.standard_normal(H).astype(np.float32),
               "bert/pooler/dense/kernel": rng.standard_normal((H, H)).astype(np.float32)}
    write_bundle(tmp_path / "bert_model.ckpt", tensors)
    assert read_tf_checkpoint(tmp_path / "bert_model.ckpt")["bert/pooler/dense/kernel"].shape == (H, H)
    shard = tmp_path / "bert_model.ckpt.data-00000-of-00001"
    data = bytearray(shard.read_bytes())
    data[H * 4 + 5] ^= 0x01  # a byte of the kernel (the bias comes first, sorted by name)
    shard.write_bytes(bytes(data))
    with pytest.raises(BertkitError, match=r"data-00000-of-00001: variable bert/pooler/dense/kernel fails its checksum"):
        read_tf_checkpoint(tmp_path / "bert_model.ckpt")


def test_a_flipped_byte_in_the_index_fails_its_block_checksum_not_read_as_another_tensor(tmp_path):
    """Each SSTable block ends with the masked crc32c TensorFlow checks ("block checksum mismatch"). Unchecked, a
    variable's dtype flipped from float32 (1) to int32 (3) read the kernel's bytes as integers (1.5 -> 1069547520),
    and other flips read no variable at all or failed with a TypeError."""
    kernel = np.full((H, H), 1.5, np.float32)
    write_bundle(tmp_path / "bert_model.ckpt", {"bert/pooler/dense/kernel": kernel})
    good = (tmp_path / "bert_model.ckpt.index").read_bytes()
    at = good.index(b"bert/pooler/dense/kernel") + len(b"bert/pooler/dense/kernel")
    assert good[at:at + 2] == b"\x08\x01"  # the entry's first field: dtype float32
    (tmp_path / "bert_model.ckpt.index").write_bytes(good[:at + 1] + b"\x03" + good[at + 2:])
    with pytest.raises(BertkitError, match=r"bert_model\.ckpt\.index is corrupt: a block of \d+ bytes at offset 0 "
                                           r"fails its checksum \(crc32c 0x[0-9a-f]{8}, recorded 0x[0-9a-f]{8}\)"):
        read_tf_checkpoint(tmp_path / "bert_model.ckpt")
    (tmp_path / "bert_model.ckpt.index").write_bytes(good)
    assert read_tf_checkpoint(tmp_path / "bert_model.ckpt")["bert/pooler/dense/kernel"].tolist() == kernel.tolist()


def test_a_checkpoint_is_found_from_its_directory_or_any_of_its_files(tmp_path):
    """tf.train.load_checkpoint takes a directory (its `checkpoint` file names the latest save): so does bertkit,
    and a directory of one checkpoint without that file (Google's downloads); .meta is a checkpoint's file too."""
    from bertkit.inference.tf_checkpoint import checkpoint_prefix

    bias = {"bert/pooler/dense/bias": np.arange(H, dtype=np.float32)}
    write_bundle(tmp_path / "bert_model.ckpt", bias)
    for name in ("", "bert_model.ckpt.index", "bert_model.ckpt.meta", "bert_model.ckpt.data-00000-of-00001"):
        assert checkpoint_prefix(tmp_path / name) == tmp_path / "bert_model.ckpt"
    assert read_tf_checkpoint(tmp_path)["bert/pooler/dense/bias"].tolist() == list(range(H))
    write_bundle(tmp_path / "model.ckpt-20", {"bert/pooler/dense/bias": np.ones(H, np.float32)})
    with pytest.raises(BertkitError, match=r"holding 2 TensorFlow checkpoints \(\['bert_model.ckpt', 'model.ckpt-20'\]"
                                           r"\) and no `checkpoint` file naming the latest"):
        read_tf_checkpoint(tmp_path)
    # as tf.compat.v1.train.Saver writes it, and one moved here from the machine that trained (a name in octal)
    for latest in ('"model.ckpt-20"', '"/gone/run/model.ckpt-20"'):
        (tmp_path / "checkpoint").write_text(f'model_checkpoint_path: {latest}\nall_model_checkpoint_paths: '
                                             f'"bert_model.ckpt"\nall_model_checkpoint_paths: {latest}\n')
        assert read_tf_checkpoint(tmp_path)["bert/pooler/dense/bias"].tolist() == [1.0] * H
    # a copy of a run whose `checkpoint` names the original's files by absolute path: the copy's own are read
    (tmp_path / "copy").mkdir()
    write_bundle(tmp_path / "copy" / "model.ckpt-20", {"bert/pooler/dense/bias": np.full(H, 2.0, np.float32)})
    (tmp_path / "copy" / "checkpoint").write_text(f'model_checkpoint_path: "{tmp_path / "model.ckpt-20"}"\n')
    assert read_tf_checkpoint(tmp_path / "copy")["bert/pooler/dense/bias"].tolist() == [2.0] * H
    write_bundle(tmp_path / "mod\u00e8l.ckpt", bias)
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "mod\\303\\250l.ckpt"\n')
    assert checkpoint_prefix(tmp_path) == tmp_path / "mod\u00e8l.ckpt"
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "saved_model.pb").write_bytes(b"")
    with pytest.raises(BertkitError, match=r"saved is a TensorFlow SavedModel, not a checkpoint: its variables are "
                                           r"the TensorFlow 2 checkpoint .*saved/variables/variables"):
        read_tf_checkpoint(tmp_path / "saved")
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-30"\n')
    with pytest.raises(BertkitError, match=r"checkpoint names model.ckpt-30 as the latest checkpoint, but .* has no "
                                           r"model.ckpt-30.index"):
        read_tf_checkpoint(tmp_path)


def test_a_shard_of_empty_tensors_only_is_read(tmp_path):
    """TensorFlow writes a 0-byte data file when every tensor is empty; it cannot be memory-mapped (was: numpy's
    "cannot mmap an empty file")."""
    write_bundle(tmp_path / "bert_model.ckpt", {"bert/pooler/dense/bias": np.zeros((0, 3), np.float32)})
    assert (tmp_path / "bert_model.ckpt.data-00000-of-00001").stat().st_size == 0
    assert read_tf_checkpoint(tmp_path / "bert_model.ckpt")["bert/pooler/dense/bias"].shape == (0, 3)


@pytest.mark.parametrize("dropped", ["bert/pooler/dense/", "cls/predictions/transform/", "cls/seq_relationship/output_bias"])
def test_a_checkpoint_lacking_a_weight_of_the_model_it_holds_is_refused_not_converted_with_random_ones(tmp_path,
                                                                                                      tiny_model,
                                                                                                      dropped):
    """Was: the pooler, the masked-LM transform or the next-sentence bias missing from the checkpoint were written
    as freshly initialised weights (one warning, exit 0), which every later load took for the checkpoint's."""
    model = tiny_model(BertForPreTraining, vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=NH,
                       intermediate_size=I, max_position_embeddings=P).eval()
    google = _google_names(model.published_state_dict())
    write_bundle(tmp_path / "bert_model.ckpt", {k: v for k, v in google.items() if not k.startswith(dropped)})
    config = {k: v for k, v in model.config.to_dict().items() if k not in ("model_type", "architectures")}
    (tmp_path / "bert_config.json").write_text(json.dumps(config))
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    with pytest.raises(BertkitError, match=r"bert_model.ckpt holds a BertForPreTraining without .*: converted, "
                                           "those weights would be random numbers") as refused:
        convert_tf_checkpoint(tmp_path / "bert_model.ckpt", tmp_path / "bert_config.json", tmp_path / "vocab.txt",
                              tmp_path / "out")
    named = re.search(r"without (.*): converted", str(refused.value)).group(1).split(", ")  # Google's names
    assert sorted(named) == sorted(k for k in google if k.startswith(dropped))
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_string_variables_read_as_tensorflow_reads_them(tmp_path):
    """tf.string variables (a step or a note kept beside the weights) were refused as a dtype bertkit does not read;
    now read as tf.train.load_checkpoint returns them: bytes objects, empty and non-UTF-8 ones included."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    tf = pytest.importorskip("tensorflow", reason="needs TensorFlow to write the checkpoint: pip install tensorflow-cpu")
    v1 = tf.compat.v1
    values = {"note": b"step 1000", "table": np.array([[b"x", b""], [b"\xff\x00z" * 50, "\u00fc".encode()]], object),
              "none": np.zeros(0, object), "bert/pooler/dense/bias": np.arange(3, dtype=np.float32)}
    graph = tf.Graph()
    with graph.as_default():
        saver = v1.train.Saver({name: v1.Variable(value, name=f"v{i}") for i, (name, value) in enumerate(values.items())})
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            prefix = saver.save(sess, str(tmp_path / "model.ckpt"))
    reader, got = tf.train.load_checkpoint(prefix), read_tf_checkpoint(tmp_path)
    for name in values:
        want = np.asarray(reader.get_tensor(name))
        assert got[name].shape == want.shape and got[name].tolist() == want.tolist(), name
    assert got["note"].dtype == object and got["table"][1, 0] == b"\xff\x00z" * 50


def test_a_string_variable_whose_lengths_do_not_fit_its_bytes_is_named_corrupt(tmp_path):
    """TensorFlow's string layout: each length as a varint, their masked crc32c, then the bytes (the slow test above
    reads TensorFlow's own). An entry without a checksum whose lengths overrun its bytes: named, not an IndexError."""
    from tf_bundle_helpers import _field, write_table

    def entry(size: int) -> bytes:  # dtype 7 (string), shape [2], offset 0, no crc32c
        return _field(1, 7) + _field(2, _field(2, _field(1, 2))) + _field(4, 0) + _field(5, size)

    data = bytes([2, 3]) + b"\x00" * 4 + b"abxyz"  # "ab", "xyz" (an unchecked length checksum)
    (tmp_path / "s.ckpt.data-00000-of-00001").write_bytes(data)
    write_table(tmp_path / "s.ckpt.index", [(b"", _field(1, 1)), (b"names", entry(len(data)))])
    assert read_tf_checkpoint(tmp_path / "s.ckpt")["names"].tolist() == [b"ab", b"xyz"]
    (tmp_path / "s.ckpt.data-00000-of-00001").write_bytes(bytes([2, 9]) + data[2:])
    with pytest.raises(BertkitError, match=r"s\.ckpt\.index: the lengths of string variable names do not fit its 11 "
                                           r"bytes: the checkpoint is corrupt"):
        read_tf_checkpoint(tmp_path / "s.ckpt")


def test_the_flags_of_transformers_conversion_script_say_what_they_are_here(capsys):
    """Was: "unrecognized arguments" for convert_bert_original_tf_checkpoint_to_pytorch.py's flags."""
    with pytest.raises(SystemExit):
        main(["convert-tf-checkpoint", "--tf_checkpoint_path", "c/bert_model.ckpt", "--bert_config_file",
              "c/bert_config.json", "--vocab", "c/vocab.txt", "--pytorch_dump_path", "c/pytorch_model.bin"])
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "bertkit: error: unrecognized arguments: --tf-checkpoint-path c/bert_model.ckpt --pytorch-dump-path "
        "c/pytorch_model.bin (--tf-checkpoint-path is --tf-checkpoint here; --pytorch-dump-path is --output-dir here: "
        "a directory (config.json, model.safetensors, the tokenizer's files), not one weights file)")


def test_an_output_directory_at_the_checkpoints_prefix_is_refused_not_made_to_hide_it(tmp_path, tiny_model, capsys):
    """Was: `convert-tf-checkpoint --tf-checkpoint d/bert_model.ckpt --output-dir d/bert_model.ckpt` converted into a
    new directory at the prefix (exit 0); from then on the checkpoint read from its prefix was that directory ("holding
    0 TensorFlow checkpoints"). With --overwrite the same output was refused as the command's own input."""
    model = tiny_model(BertForPreTraining, vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=NH,
                       intermediate_size=I, max_position_embeddings=P)
    write_bundle(tmp_path / "bert_model.ckpt", _google_names(model.published_state_dict()))
    config = {k: v for k, v in model.config.to_dict().items() if k not in ("model_type", "architectures")}
    (tmp_path / "bert_config.json").write_text(json.dumps(config))
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    prefix = tmp_path / "bert_model.ckpt"
    args = ["convert-tf-checkpoint", "--tf-checkpoint", str(prefix), "--bert-config", str(tmp_path / "bert_config.json"),
            "--vocab", str(tmp_path / "vocab.txt")]
    assert main([*args, "--output-dir", str(prefix)]) == 2
    assert (f"--output-dir {prefix} is the command's own input --tf-checkpoint {prefix}; bertkit never writes into "
            "or clears a command's inputs: choose an output outside them") in capsys.readouterr().err
    assert not os.path.lexists(prefix)
    assert main([*args, "--output-dir", str(tmp_path / "converted")]) == 0  # the checkpoint still read from its prefix


@pytest.mark.parametrize("below", [False, True], ids=["a file", "below a file"])
def test_an_output_directory_that_is_a_file_is_refused_before_the_checkpoint_is_read(tmp_path, monkeypatch, below):
    """convert_tf_checkpoint onto a file (or a path below one) read the whole checkpoint (1.3 GB for BERT-LARGE) and
    loaded it before the save refused the path; now it is refused first, naming it, and the file is left as it was."""
    from bertkit.inference import tf_checkpoint

    (tmp_path / "bert_config.json").write_text(json.dumps({"vocab_size": len(VOCAB), "hidden_size": H,
                                                           "num_hidden_layers": L, "num_attention_heads": NH,
                                                           "intermediate_size": I}))
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    (tmp_path / "notes.txt").write_text("mine")
    monkeypatch.setattr(tf_checkpoint, "read_tf_checkpoint", lambda *a, **k: pytest.fail("the checkpoint was read"))
    out = tmp_path / "notes.txt" / "model" if below else tmp_path / "notes.txt"
    with pytest.raises(BertkitError, match=rf"{tmp_path / 'notes.txt'}.* is a file, not a directory"):
        convert_tf_checkpoint(tmp_path / "bert_model.ckpt", tmp_path / "bert_config.json", tmp_path / "vocab.txt", out)
    assert (tmp_path / "notes.txt").read_text() == "mine"
