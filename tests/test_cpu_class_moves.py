"""What one CPU class leaves behind and another reads: Inductor's on-disk cache shared by an AVX-512 machine and
an AVX2 one (emulated here by ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``, as BENCHMARKS.md does).

Inductor keys its cache on the graph and its settings, not on the vector ISA its CPU kernels are written for, so a
``TORCHINDUCTOR_CACHE_DIR`` one class filled handed the other kernels of the wrong vector width: ``finetune
--torch-compile`` on the AVX-512 CPU after one on the AVX2 CPU died with "free(): invalid pointer", the other order
with a segmentation fault, and int8's compiled per-token quantization computed wrong ranges. bertkit's compiles state
the width (``model_checks.compile_options``), which puts it in the key.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bertkit import BertConfig, BertModel
from bertkit._hardware import cpu_class
from bertkit.model_checks import compile_options
from bertkit.quantization import kernels

AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def _tiny() -> BertModel:
    torch.manual_seed(0)
    return BertModel(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=48, max_position_embeddings=64)).eval()


def test_compile_options_state_the_simd_width_inductor_picks_here():
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    width = pick_vec_isa().bit_width()
    assert compile_options() == {"cpp.simdlen": width}
    assert width == {"avx512-bf16": 512, "avx512-vnni": 512, "avx2": 256}.get(cpu_class(), width)


@pytest.mark.parametrize("given, expected", [
    ({}, {}),
    ({"mode": "max-autotune-no-cudagraphs"}, {"max_autotune": True, "coordinate_descent_tuning": True}),
    ({"options": {"cpp.simdlen": 256, "max_autotune": True}}, {"cpp.simdlen": 256, "max_autotune": True}),
])
def test_compile_layers_puts_the_simd_width_in_inductors_options(monkeypatch, given, expected):
    """Every layer is compiled with the width in its options (a mode given as its options: torch.compile takes one or
    the other); the caller's own options win."""
    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: calls.append(kwargs) or fn)
    _tiny().compile_layers(**given)
    assert calls == [{"dynamic": True, "options": {**compile_options(), **expected}}]


def test_compile_layers_leaves_other_backends_and_a_mode_with_options_to_torch(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: calls.append(kwargs) or fn)
    _tiny().compile_layers(backend="aot_eager")
    _tiny().compile_layers(mode="max-autotune", options={"max_autotune": False})  # torch.compile refuses the pair
    assert calls == [{"dynamic": True, "backend": "aot_eager"},
                     {"dynamic": True, "mode": "max-autotune", "options": {"max_autotune": False}}]


def test_int8s_compiled_quantization_states_the_simd_width(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: calls.append(kwargs) or fn)
    fused = kernels._Compiled(kernels.quantize_per_token)
    fused.compile_next()
    fused(torch.randn(kernels.COMPILE_FROM // 64, 64), torch.rand(64) + 0.5, 255)
    assert calls == [{"dynamic": True, "options": compile_options()}] and fused.checked


def _records() -> list[dict]:
    """The precision records of a tiny int8 model and of its float original, as prepared on this CPU."""
    from bertkit import BertConfig, BertModel
    from bertkit.inference.prepare import prepare_model
    from bertkit.quantization import quantize_int8

    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=48, max_position_embeddings=64)).eval()
    ids = torch.randint(1, 64, (2, 9))
    int8 = quantize_int8(model, calibration=[{"input_ids": ids, "attention_mask": torch.ones_like(ids)}])
    return [prepare_model(m)[1].record() for m in (int8, model)]


_RECORD = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
           "from test_cpu_class_moves import _records; print(json.dumps(_records()))")


def test_an_int8_precision_record_names_the_kernel_and_width_that_ran():
    """A prediction report (``Precision.record``: predict, extract-features, the benchmark commands) names the int8
    kernel and activation width of the CPU class it ran on: the same int8 directory runs at 8-bit activations on
    an AVX-512 VNNI CPU and at 7 on an AVX2 one (about three times the rounding), and both reports said only
    "int8". Float runs record no kernel. Here as the probe the code uses sees this CPU; on an AVX-512 CPU also under
    the AVX2 emulation, in a process of its own."""
    from bertkit._hardware import check_int8_kernel

    native = _records()
    kernel = check_int8_kernel()
    assert native[0] == {"quantize": "int8", "calibration": "built-in", "kernel": kernel.name,
                         "activation_bits": kernel.activation_bits, "float_dtype": "float32"}
    assert native[1] == {"quantize": None, "float_dtype": "float32"}
    if cpu_class() not in ("avx512-bf16", "avx512-vnni"):
        return  # no wider CPU to emulate the AVX2 class on
    env = {**{k: v for k, v in os.environ.items() if k not in AVX2}, **AVX2}
    run = subprocess.run([sys.executable, "-c", _RECORD], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    avx2 = json.loads(run.stdout.splitlines()[-1])
    assert avx2 == [{**native[0], "kernel": "fbgemm", "activation_bits": 7}, native[1]]


_CHILD = r"""
import json, random, sys
import torch
from bertkit import BertConfig, BertModel
from bertkit._hardware import cpu_class
from bertkit.quantization import kernels

torch.set_num_threads(1)
rng = random.Random(int(sys.argv[1]))
torch.manual_seed(0)
model = BertModel(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=48, max_position_embeddings=64)).eval()
compiled = BertModel(model.config).eval()
compiled.load_state_dict(model.state_dict())
compiled.compile_layers()
layer_err = 0.0
with torch.no_grad():
    for _ in range(3):  # token counts drawn per batch: the dynamic kernel's tail loops differ from its vector body
        b, t = rng.randint(1, 4), rng.randint(3, 40)
        ids = torch.randint(1, 64, (b, t), generator=torch.Generator().manual_seed(rng.randint(0, 999)))
        mask = (torch.arange(t)[None] < torch.randint(1, t + 1, (b, 1))).long()
        want = model(ids, attention_mask=mask).last_hidden_state
        got = compiled(ids, attention_mask=mask).last_hidden_state
        layer_err = max(layer_err, float((got - want)[mask.bool()].abs().max()))
x = torch.randn(kernels.COMPILE_FROM // 48 + rng.randint(1, 37), 48) * 3 - 1
inv = torch.rand(48) + 0.5
fused = kernels._Compiled(kernels.quantize_per_token)
fused.compile_next()
got = fused(x, inv, 255)
print(json.dumps({"class": cpu_class(), "layer_err": layer_err, "int8_kept": fused.checked and not fused.failed,
                  "codes_err": int((got[0].int() - kernels.quantize_per_token(x, inv, 255)[0].int()).abs().max())}))
"""


@pytest.mark.slow  # three processes compiling for real: about 45 s
@pytest.mark.skipif(cpu_class() not in ("avx512-bf16", "avx512-vnni"), reason="needs an AVX-512 CPU to emulate AVX2 on")
def test_a_compile_cache_shared_by_two_cpu_classes_serves_each_its_own_kernels(tmp_path):
    """AVX2, then AVX-512, then AVX2 again compile a layer and int8's quantization into one fresh
    TORCHINDUCTOR_CACHE_DIR (AVX-512 after AVX2 died with "double free or corruption", AVX2 after AVX-512 had its
    compiled quantization dropped as wrong): every process finishes, its compiled layer gives eager's outputs within
    fp32 rounding on token counts drawn per process (seeded), and its compiled quantization passes the check against
    eager and is kept."""
    env = {k: v for k, v in os.environ.items() if k not in AVX2}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), OMP_NUM_THREADS="1")
    seen = []
    for seed, held in enumerate([AVX2, {}, AVX2]):
        run = subprocess.run([sys.executable, "-c", _CHILD, str(seed)], capture_output=True, text=True,
                             env={**env, **held}, timeout=300)
        assert run.returncode == 0, (held, run.returncode, run.stderr[-2000:])
        seen.append(json.loads(run.stdout.splitlines()[-1]))
    assert [s["class"] for s in seen] == ["avx2", cpu_class(), "avx2"]
    assert all(s["layer_err"] < 1e-5 and s["int8_kept"] and s["codes_err"] <= 1 for s in seen), seen


def test_a_resume_on_another_cpu_class_or_thread_count_says_so(monkeypatch):
    """The checkpoint records the CPU class and thread count its steps ran on; a resume elsewhere continues (its
    numbers equal an uninterrupted run's within float rounding) with a warning naming both, and a bf16 run moved to a
    CPU without bf16 instructions is told it stays in bf16, emulated. (A resume on AVX2 of a run checkpointed on
    AVX-512, or on 2 threads of one on 1, said nothing and ended 3e-8 away from the uninterrupted run's weights.)"""
    from bertkit.training import run_setup
    from bertkit.training.run_setup import computed_on, warn_if_moved

    here = computed_on("cpu")
    assert here == {"cpu_class": cpu_class(), "threads": torch.get_num_threads()} and computed_on("meta") is None
    assert not warn_if_moved(here, "cpu", bf16=True) and not warn_if_moved(None, "cpu", bf16=False)
    records = []
    handler = type("H", (logging.Handler,), {"emit": lambda self, r: records.append(r.getMessage())})()
    logging.getLogger("bertkit").addHandler(handler)
    try:
        assert warn_if_moved({"cpu_class": "avx2-elsewhere", "threads": 3}, "cpu", bf16=False)
        monkeypatch.setattr(run_setup, "cpu_has_bf16", lambda: False)  # as on an AVX2 CPU
        other = torch.get_num_threads() + 1  # another thread count than this process's, whatever it runs on
        assert warn_if_moved({"cpu_class": cpu_class(), "threads": other}, "cpu", bf16=True)
    finally:
        logging.getLogger("bertkit").removeHandler(handler)
    fp32, bf16 = records
    assert f"resuming on CPU class {cpu_class()} on {torch.get_num_threads()} thread(s)" in fp32
    assert "checkpointed on CPU class avx2-elsewhere on 3 thread(s)" in fp32 and "not bit for bit" in fp32
    assert "computes in bf16" not in fp32 and f"checkpointed on CPU class {cpu_class()} on {other} thread(s)" in bf16
    assert ("The run computes in bf16, as it did, and this CPU has no bf16 instructions: it runs emulated" in bf16
            and "--no-bf16, another output directory" in bf16)


@pytest.mark.slow  # three fine-tuning processes: about 10 s
@pytest.mark.skipif(cpu_class() not in ("avx512-bf16", "avx512-vnni"), reason="needs an AVX-512 CPU to emulate AVX2 on")
def test_finetune_killed_on_avx2_and_resumed_here_warns_and_ends_near_the_uninterrupted_run(tmp_path, tiny_checkpoint):
    from safetensors.torch import load_file

    from killing import launch_paused
    from test_finetune_resume import _args, _make_setup

    setup = _make_setup(tmp_path / "setup", 24, tiny_checkpoint)
    env = {**{k: v for k, v in os.environ.items() if k not in AVX2}, "OMP_NUM_THREADS": "1"}
    full, moved = tmp_path / "full", tmp_path / "moved"
    subprocess.run(_args(setup, full, epochs=1), check=True, env=env, capture_output=True)
    assert launch_paused(_args(setup, moved, epochs=1)[3:], "renamed", 1, tmp_path / "stop", {**env, **AVX2})
    resumed = subprocess.run(_args(setup, moved, "--resume", epochs=1), env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert (f"resuming on CPU class {cpu_class()} on 1 thread(s) a run checkpointed on CPU class avx2 on 1 thread(s)"
            in resumed.stderr)
    a, b = (load_file(str(d / "model" / "model.safetensors")) for d in (full, moved))
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
