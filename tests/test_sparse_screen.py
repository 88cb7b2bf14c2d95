"""The screened SPLADE head (``sparse_encoder.screen``): CPU inference's max pooling screens the vocabulary with an
int8 product and recomputes in fp32 only the pieces its error bound leaves possibly active. The screen
must never drop a piece the plain fp32 head keeps: checked here against ``_MaxLogits`` on an ``nn.Linear`` decoder
on inputs built to break a loose bound (maxima within 1e-3 of the threshold, maxima exactly at it, a token of 1,000x
the others' norm, a bias that makes most pieces active, NaN and inf), the bound itself checked to hold at every
(text, piece)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from bertkit._hardware import int8_kernel, int_mm_exact
from bertkit.errors import BertkitError
from bertkit.sentence.sparse_encoder.modules import _MaxLogits
from bertkit.sentence.sparse_encoder.screen import ScreenedMaxLogits, screened_max_logits

needs_int8 = pytest.mark.skipif(not int_mm_exact(), reason="torch._int_mm is not exact on this CPU")


def fp32_maxima(states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """(B, V): each text's maximum logit per piece, bias included, from the plain fp32 head (no relu)."""
    decoder = torch.nn.Linear(weight.shape[1], weight.shape[0])
    decoder.weight.data, decoder.bias.data = weight, bias
    with torch.no_grad():
        return _MaxLogits.apply(states, weight, bias, decoder, lengths, 64, False)


def check(screen: ScreenedMaxLogits, states: torch.Tensor, lengths: list[int], want: torch.Tensor) -> None:
    """The screen's vectors are the fp32 head's, and its bound lies above every fp32 maximum."""
    ends = torch.tensor(lengths).cumsum(0).tolist()
    with torch.inference_mode():
        for rows in (5, 64):  # blocks that split texts, and that hold whole ones
            bound = screen._bound(states, lengths, ends, rows, {})
            assert bool((bound >= want).all()), float((want - bound).max())
            got = screen(states, lengths, rows)
            assert torch.equal(got > 0, want > 0), int(((got > 0) != (want > 0)).sum())
            torch.testing.assert_close(got, want.relu(), atol=1e-5, rtol=1e-5)


def drawn(seed: int, lengths: list[int], H: int = 96, V: int = 3000) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    states = torch.randn(sum(lengths), H, generator=g) * 2  # (N, H): a LayerNorm's output, then its scale
    states[:, :4] *= 4  # outlier channels, as a LayerNorm's weight makes
    return states, torch.randn(V, H, generator=g) * 0.05


@needs_int8
def test_int8_screen_keeps_maxima_within_1e3_of_the_threshold():
    """A third of the (text, piece) maxima lie within 1e-3 of 0, where the int8 product alone (errors ~5e-2 on these
    logits) gets the active set wrong; the screen's pieces and values are fp32's."""
    lengths = [7, 1, 30, 12]
    states, weight = drawn(0, lengths)
    V = weight.shape[0]
    maxima = fp32_maxima(states, weight, torch.zeros(V), lengths)
    g = torch.Generator().manual_seed(1)
    bias = -maxima[torch.arange(V) % len(lengths), torch.arange(V)] + (torch.rand(V, generator=g) - 0.5) * 2e-3
    want = fp32_maxima(states, weight, bias, lengths)
    assert ((want > 0) & (want < 1e-3)).sum() > 400
    def int8(v: torch.Tensor) -> torch.Tensor:  # each row rounded to 255 levels of its own step
        step = v.abs().amax(1, keepdim=True) / 127
        return (v / step).round() * step

    low = int8(states) @ int8(weight).T + bias  # the screening product on its own
    low_max = torch.stack([low[e - n:e].amax(0) for e, n in zip(torch.tensor(lengths).cumsum(0).tolist(), lengths)])
    assert int(((low_max > 0) != (want > 0)).sum()) > 100
    check(ScreenedMaxLogits(weight, bias), states, lengths, want)


@needs_int8
def test_int8_screen_at_maxima_exactly_on_the_threshold():
    """States and weights that are small multiples of powers of two sum exactly in fp32 in any order, so a bias of
    minus a maximum puts that logit at exactly 0 (inactive in every fp32 head), and 2^-12 more at a positive one:
    the screen keeps exactly the latter."""
    g = torch.Generator().manual_seed(2)
    lengths, H, V = [5, 9, 3], 64, 1024
    states = torch.randint(-64, 65, (sum(lengths), H), generator=g).float() / 16
    weight = torch.randint(-64, 65, (V, H), generator=g).float() / 256
    maxima = fp32_maxima(states, weight, torch.zeros(V), lengths)
    bias = -maxima[torch.arange(V) % len(lengths), torch.arange(V)] + (torch.arange(V) % 2) * 2.0 ** -12
    want = fp32_maxima(states, weight, bias, lengths)
    on = want[torch.arange(V) % len(lengths), torch.arange(V)]
    assert torch.equal(on, (torch.arange(V) % 2) * 2.0 ** -12)  # half exactly 0, half just above
    check(ScreenedMaxLogits(weight, bias), states, lengths, want)


@needs_int8
def test_int8_screen_with_a_token_of_1000x_the_others_norm():
    """One token per text 1,000x the others: the text's int8 step is set by it, and the other tokens' codes are
    mostly 0, their logits carried by the error bound alone; the pieces they make active are still found."""
    lengths = [6, 11, 4]
    states, weight = drawn(3, lengths)
    states[[0, 6, 17]] *= 1000
    states[[0, 6, 17], 4:] = 0  # the large tokens hold a few channels, so the small ones' maxima still matter
    bias = torch.full((weight.shape[0],), -0.8)
    want = fp32_maxima(states, weight, bias, lengths)
    small = fp32_maxima(states[1:6], weight, bias, [5])
    assert ((small[0] > 0) & (want[0] == small[0])).sum() > 50  # maxima held by the small tokens
    check(ScreenedMaxLogits(weight, bias), states, lengths, want)


@needs_int8
def test_int8_screen_with_a_bias_that_makes_most_pieces_active():
    """A bias of +1 makes ~95% of the (text, piece) maxima active: nearly every piece is recomputed, in buffers over
    KEEP_BYTES for a chunk of many rows, and the vectors are still fp32's."""
    lengths = [40, 3, 25]
    states, weight = drawn(4, lengths)
    bias = torch.full((weight.shape[0],), 1.0)
    want = fp32_maxima(states, weight, bias, lengths)
    assert (want > 0).float().mean() > 0.9
    screen = ScreenedMaxLogits(weight, bias)
    screen.KEEP_BYTES = 1 << 12  # every buffer fresh, as a batch too large to keep
    check(screen, states, lengths, want)


@needs_int8
def test_int8_screen_nan_and_inf_reach_their_text_only():
    """A NaN or inf state makes every piece of its text a candidate (a NaN bound), so fp32 decides, as in the plain
    head: NaN there, and the other texts untouched."""
    lengths = [3, 2, 4]
    states, weight = drawn(5, lengths)
    bias = torch.full((weight.shape[0],), -0.8)
    clean = fp32_maxima(states, weight, bias, lengths).relu()
    states[3, 7] = float("nan")
    states[6, 0] = float("inf")
    screen = ScreenedMaxLogits(weight, bias)
    with torch.inference_mode():
        got = screen(states, lengths, 5)
    assert torch.isnan(got[1]).all() and torch.equal(got[0], screen(states[:3], [3], 5)[0])
    assert torch.equal(got[0] > 0, clean[0] > 0)
    want = fp32_maxima(states, weight, bias, lengths).relu()
    assert torch.equal(torch.isnan(got[2]), torch.isnan(want[2])) and torch.equal(got[2] > 0, want[2] > 0)
    with pytest.raises(BertkitError, match="ScreenedMaxLogits computes no gradient"):
        screen(states.requires_grad_(), lengths, 5)


def test_the_screen_is_chosen_by_what_this_cpu_computes_exactly():
    """The int8 screen where torch._int_mm is exact and int8 runs at 8 bits (AVX512-VNNI or AMX), else none (the
    fp32 product)."""
    weight, bias = torch.randn(64, 16), torch.zeros(64)
    kernel = int8_kernel()
    want = ScreenedMaxLogits if (int_mm_exact() and kernel is not None and kernel.activation_bits == 8) else \
        type(None)
    assert type(screened_max_logits(weight, bias)) is want


AVX2_CHOICE = r'''
import torch
from bertkit._hardware import int_mm_exact
from bertkit.sentence.sparse_encoder.model import splade_embedder
from bertkit.sentence.sparse_encoder.modules import SpladePooling
captured = []
class Pooling(SpladePooling):
    def forward(self, out, mask, head, decoder=None):
        captured.append(type(decoder).__name__)
        return torch.zeros(1)
head = torch.nn.Module()
head.decoder, head.bias = torch.nn.Linear(16, 64), torch.nn.Parameter(torch.zeros(64))
splade_embedder(lambda *a: None, head, Pooling(), True)({"input_ids": None, "attention_mask": None})
print(int_mm_exact(), captured[0])
'''


@pytest.mark.slow  # a process of its own: 4-10 s
def test_an_avx2_cpu_runs_the_fp32_product():
    """On an AVX2 CPU (emulated) torch._int_mm saturates its int16 pair sums (127 x 127 x 2 > 32767), so the int8
    screen would be wrong there: the probe says so and the head runs the plain fp32 product, as before the screen."""
    env = dict(os.environ, ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2", MKL_ENABLE_INSTRUCTIONS="AVX2")
    out = subprocess.run([sys.executable, "-c", AVX2_CHOICE], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["False", "PreparedLinear"], out.stdout + out.stderr
