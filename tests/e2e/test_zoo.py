"""ResNet-18, MobileNetV2 and SqueezeNet 1.1 (examples/zoo.py, seeded random weights) compile
and run bit-exact on the default and large presets (on edge, where ResNet-18 is 783K
instructions and a minute to compile, `benchmarks/bench_compile.py --presets edge` checks it):
profile with onnxruntime on random samples, quantize, compile, simulate. SqueezeNet's eight Concats cost no copy: the expands write into them."""

from __future__ import annotations

import numpy as np
import pytest

from ember.flow import compile_model
from examples import zoo
from profiler.model_inputs import input_specs
from profiler.run import RunOptions, profile
from profiler.sources.arrays import RandomData
from quantizer.errors import QuantizeWarning
from tests.e2e.flow import check_bit_exact, compile_and_check


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["default", "large"])
@pytest.mark.parametrize("name", ["resnet18", "mobilenetv2", "squeezenet"])
def test_zoo_model_is_bit_exact(name: str, preset: str) -> None:
    proto = getattr(zoo, name)()  # built here: examples/models/ is generated, not committed
    specs = input_specs(proto, {})
    prof = profile(proto, RandomData(2, specs, 0), specs, RunOptions())
    built = compile_model(proto, prof, arch=preset)
    rng = np.random.default_rng(1)
    sample = {s.name: rng.standard_normal(s.shape).astype(np.float32) for s in specs}
    result = check_bit_exact(built.qgraph, built.compiled, [sample])
    assert result.stats.bound_cycles <= result.stats.cycles


# The models issue #12 names, at small images: every operator on the accelerator, no host
# segment (hard-swish, hard-sigmoid and SiLU written out fuse into tables; the gates of
# squeeze-and-excitation are products on the vector unit; ConvTranspose is phase convolutions).
SMALL = {"mobilenetv3_small": {"image": 64}, "yolo": {"image": 64}, "unet": {"image": 32}}


@pytest.mark.parametrize("preset", ["default", pytest.param("edge", marks=pytest.mark.slow),
                                    pytest.param("large", marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", sorted(SMALL))
def test_new_zoo_model_runs_whole_on_the_accelerator(name: str, preset: str) -> None:
    compiled, result = compile_and_check(getattr(zoo, name)(**SMALL[name]), preset, count=1)
    assert compiled.program.host_segments == ()
    assert result.stats.bound_cycles <= result.stats.cycles


@pytest.mark.parametrize("preset", ["default", pytest.param("edge", marks=pytest.mark.slow),
                                    pytest.param("large", marks=pytest.mark.slow)])
def test_efficientnet_lite_with_dead_channels_runs_whole_on_the_accelerator(preset: str) -> None:
    """Its dead channels (weights of 1e-9 and a bias of -1.2 once BN folds) are floored with a
    warning naming each, not refused or kept in fp32; narrow, to stay fast."""
    proto = zoo.efficientnet_lite0(image=32, width=0.25, classes=10)
    with pytest.warns(QuantizeWarning) as caught:
        compiled, result = compile_and_check(proto, preset, count=1)
    said = " ".join(str(w.message) for w in caught)
    for bn, channels in zoo.EFFICIENTNET_LITE_DEAD.items():
        conv = bn.removesuffix(".bn")
        assert f"node '{conv}' (Conv): weight '{conv}/W_bn' has {len(channels)} of " in said
        assert f"slices ({', '.join(map(str, channels))})" in said, (conv, said)
    assert compiled.program.host_segments == ()
    assert result.stats.bound_cycles <= result.stats.cycles


@pytest.mark.parametrize("preset", ["default", pytest.param("edge", marks=pytest.mark.slow),
                                    pytest.param("large", marks=pytest.mark.slow)])
def test_lstm_classifier_runs_whole_on_the_accelerator(preset: str) -> None:
    """Its LSTM unrolled on import: 16 steps of MatMuls on the array, gate tables and products
    on the vector unit, no host segment."""
    compiled, result = compile_and_check(zoo.lstm_classifier(), preset, count=1)
    assert compiled.program.host_segments == ()
    assert result.stats.bound_cycles <= result.stats.cycles


@pytest.mark.parametrize("preset", ["default", pytest.param("edge", marks=pytest.mark.slow),
                                    pytest.param("large", marks=pytest.mark.slow)])
def test_transformer_encoder_runs_whole_on_the_accelerator(preset: str) -> None:
    """Two encoder blocks: attention's products on the array, Softmax and LayerNorm on the
    vector unit, GELU written with Erf as one table; no host segment."""
    compiled, result = compile_and_check(zoo.transformer_encoder(tokens=16, width=32), preset,
                                         count=1)
    assert compiled.program.host_segments == ()
    assert result.stats.bound_cycles <= result.stats.cycles
