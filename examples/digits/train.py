"""Train the digits CNN in pure numpy and export it as the ONNX model the examples compile.

Pure numpy so that the example regenerates offline, in seconds, from ember's own dependencies
(plus scikit-learn for the data), bit-identically on one machine: every random choice comes from
one seeded generator. Run `python -m examples.digits.train` or `ember examples build --only digits`.

Network (NCHW, batch 1 in the export):
  input 1x8x8 -> conv1 3x3 (16) -> bn1 -> relu1 -> conv2 3x3 (32) -> bn2 -> relu2
  -> pool 2x2 -> flatten (512) -> fc (10) -> logits
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass

import numpy as np
import onnx
from numpy.lib.stride_tricks import sliding_window_view
from onnx import TensorProto, helper, numpy_helper

CHANNELS = (16, 32)
EPOCHS = 12
BATCH = 32
LEARNING_RATE = 3e-3
EVAL_COUNT = 450
CALIB_COUNT = 256
BN_EPSILON = 1e-5
OPSET = 17
IR_VERSION = 8  # what ONNX 1.12, which introduced opset 17, writes; older runtimes load it too
DEFAULT_SEED = 0


@dataclass(frozen=True)
class Splits:
    """Disjoint train and eval images; calib is a subset of train, as calibration data would be."""

    train_x: np.ndarray  # (N, 1, 8, 8) float32 in [0, 1]
    train_y: np.ndarray  # (N,) int64
    calib_x: np.ndarray
    eval_x: np.ndarray
    eval_y: np.ndarray


@dataclass(frozen=True)
class Trained:
    params: dict[str, np.ndarray]  # keyed by ONNX initializer name, BN statistics included
    eval_accuracy: float  # of the numpy model on Splits.eval_x


@dataclass(frozen=True)
class DigitsBuild:
    files: dict[str, bytes]  # file name -> contents
    accuracy_numpy: float
    accuracy_onnxruntime: float
    calib_count: int
    eval_count: int


def load_splits(seed: int = DEFAULT_SEED) -> Splits:
    """Scales pixels 0..16 to [0, 1] and splits by one seeded permutation."""
    from sklearn.datasets import load_digits  # only the examples need scikit-learn

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    eval_idx, train_idx = order[:EVAL_COUNT], order[EVAL_COUNT:]
    return Splits(train_x=x[train_idx], train_y=y[train_idx], calib_x=x[train_idx[:CALIB_COUNT]],
                  eval_x=x[eval_idx], eval_y=y[eval_idx])


# --- layers: forward returns (output, cache); backward takes the cache -----------------------

def im2col(x: np.ndarray) -> np.ndarray:
    """(N, C, H, W) -> (N*H*W, C*9): every 3x3 window (padding 1) as a row, so conv is a matmul."""
    n, c, h, w = x.shape
    windows = sliding_window_view(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3))
    return windows.transpose(0, 2, 3, 1, 4, 5).reshape(n * h * w, c * 9)


def col2im(cols: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The adjoint of im2col: sums each window's gradient back onto the pixels it read."""
    n, c, h, w = shape
    grads = cols.reshape(n, h, w, c, 3, 3).transpose(0, 3, 4, 5, 1, 2)
    padded = np.zeros((n, c, h + 2, w + 2), cols.dtype)
    for i in range(3):
        for j in range(3):
            padded[:, :, i:i + h, j:j + w] += grads[:, :, i, j]
    return padded[:, :, 1:-1, 1:-1]


def conv_forward(x, weight):
    cols = im2col(x)
    n, _, h, w = x.shape
    out = (cols @ weight.reshape(len(weight), -1).T).reshape(n, h, w, -1).transpose(0, 3, 1, 2)
    return out, (cols, x.shape)


def conv_backward(dout, cache, weight):
    cols, x_shape = cache
    dout_rows = dout.transpose(0, 2, 3, 1).reshape(-1, len(weight))
    dweight = (dout_rows.T @ cols).reshape(weight.shape)
    return col2im(dout_rows @ weight.reshape(len(weight), -1), x_shape), dweight


def batchnorm_forward(x, scale, bias):
    """Training mode: normalizes by this batch's per-channel statistics, which it returns too."""
    mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    inv_std = 1.0 / np.sqrt(var + BN_EPSILON)
    xhat = (x - mean[:, None, None]) * inv_std[:, None, None]
    return scale[:, None, None] * xhat + bias[:, None, None], (xhat, inv_std, mean, var)


def batchnorm_backward(dout, cache, scale):
    xhat, inv_std, _, _ = cache
    count = dout.size // dout.shape[1]
    dbias, dscale = dout.sum(axis=(0, 2, 3)), (dout * xhat).sum(axis=(0, 2, 3))
    dxhat = dout * scale[:, None, None]
    dx = (count * dxhat - dxhat.sum(axis=(0, 2, 3))[:, None, None]
          - xhat * (dxhat * xhat).sum(axis=(0, 2, 3))[:, None, None])
    return dx * (inv_std / count)[:, None, None], dscale, dbias


def maxpool_forward(x):
    """2x2, stride 2; the cache keeps which of the four inputs won, for the backward pass."""
    n, c, h, w = x.shape
    windows = x.reshape(n, c, h // 2, 2, w // 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(
        n, c, h // 2, w // 2, 4)
    winner = windows.argmax(axis=-1)[..., None]
    return np.take_along_axis(windows, winner, axis=-1)[..., 0], (winner, x.shape)


def maxpool_backward(dout, cache):
    winner, (n, c, h, w) = cache
    windows = np.zeros((n, c, h // 2, w // 2, 4), dout.dtype)
    np.put_along_axis(windows, winner, dout[..., None], axis=-1)
    return windows.reshape(n, c, h // 2, w // 2, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(
        n, c, h, w)


def softmax_cross_entropy(logits, labels):
    """Mean loss over the batch and its gradient with respect to the logits."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(shifted)
    probs /= probs.sum(axis=1, keepdims=True)
    rows = np.arange(len(labels))
    loss = -np.log(probs[rows, labels]).mean()
    probs[rows, labels] -= 1.0
    return loss, probs / len(labels)


# --- the network ------------------------------------------------------------------------------

def init_params(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """He-normal weights (ReLU network), BN as identity, zero biases."""
    def he_normal(*shape):
        fan_in = int(np.prod(shape[1:]))
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    c1, c2 = CHANNELS
    params = {"conv1.weight": he_normal(c1, 1, 3, 3), "conv2.weight": he_normal(c2, c1, 3, 3),
              "fc.weight": he_normal(10, c2 * 16), "fc.bias": np.zeros(10, np.float32)}
    for i, channels in enumerate(CHANNELS, start=1):
        params[f"bn{i}.scale"] = np.ones(channels, np.float32)
        params[f"bn{i}.bias"] = np.zeros(channels, np.float32)
    return params


def forward_train(params, x):
    """Logits with batch statistics in the BNs, and the caches that backward needs."""
    caches, h = {}, x
    for i in (1, 2):
        h, caches[f"conv{i}"] = conv_forward(h, params[f"conv{i}.weight"])
        h, caches[f"bn{i}"] = batchnorm_forward(h, params[f"bn{i}.scale"], params[f"bn{i}.bias"])
        caches[f"relu{i}"] = h > 0
        h = h * caches[f"relu{i}"]
    h, caches["pool"] = maxpool_forward(h)
    caches["flatten"] = h
    logits = h.reshape(len(h), -1) @ params["fc.weight"].T + params["fc.bias"]
    return logits, caches


def backward(params, caches, dlogits):
    pooled = caches["flatten"]
    grads = {"fc.weight": dlogits.T @ pooled.reshape(len(pooled), -1), "fc.bias": dlogits.sum(0)}
    dh = maxpool_backward((dlogits @ params["fc.weight"]).reshape(pooled.shape), caches["pool"])
    for i in (2, 1):
        dh = dh * caches[f"relu{i}"]
        dh, grads[f"bn{i}.scale"], grads[f"bn{i}.bias"] = batchnorm_backward(
            dh, caches[f"bn{i}"], params[f"bn{i}.scale"])
        dh, grads[f"conv{i}.weight"] = conv_backward(dh, caches[f"conv{i}"],
                                                     params[f"conv{i}.weight"])
    return grads


def forward_eval(params, x):
    """Inference: BNs use the stored statistics, exactly as onnxruntime evaluates the export."""
    h = x
    for i in (1, 2):
        h, _ = conv_forward(h, params[f"conv{i}.weight"])
        inv_std = params[f"bn{i}.scale"] / np.sqrt(params[f"bn{i}.var"] + BN_EPSILON)
        h = (h - params[f"bn{i}.mean"][:, None, None]) * inv_std[:, None, None]
        h = np.maximum(h + params[f"bn{i}.bias"][:, None, None], 0)
    h, _ = maxpool_forward(h)
    return h.reshape(len(h), -1) @ params["fc.weight"].T + params["fc.bias"]


def population_statistics(params, train_x) -> dict[str, np.ndarray]:
    """BN mean and variance over the whole training set with the final weights.

    Exact statistics replace momentum running averages, which lag the weights they describe.
    """
    _, caches = forward_train(params, train_x)
    stats = {}
    for i in (1, 2):
        stats[f"bn{i}.mean"], stats[f"bn{i}.var"] = caches[f"bn{i}"][2:]
    return stats


def adam_step(params, grads, state, step, beta1=0.9, beta2=0.999, eps=1e-8):
    """One Adam update (Kingma & Ba 2015) in place; `state` holds the two moment estimates."""
    for name, grad in grads.items():
        m, v = state.setdefault(name, (np.zeros_like(grad), np.zeros_like(grad)))
        m[:] = beta1 * m + (1 - beta1) * grad
        v[:] = beta2 * v + (1 - beta2) * grad * grad
        m_hat, v_hat = m / (1 - beta1 ** step), v / (1 - beta2 ** step)
        params[name] -= (LEARNING_RATE * m_hat / (np.sqrt(v_hat) + eps)).astype(np.float32)


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float((logits.argmax(axis=1) == labels).mean())


def train(splits: Splits, seed: int = DEFAULT_SEED, epochs: int = EPOCHS,
          train_limit: int | None = None) -> Trained:
    """Minibatch Adam; `train_limit` uses only the first images, for quick tests.

    BLAS runs on one thread: its sums are ordered by the thread count, and a difference in the
    last bit grows over training, so more threads would make the bytes depend on the machine's
    cores. The matrices are small; one thread is as fast.
    """
    from threadpoolctl import threadpool_limits  # a dependency of scikit-learn

    rng = np.random.default_rng(seed)
    params = init_params(rng)
    x, y = splits.train_x[:train_limit], splits.train_y[:train_limit]
    state, step = {}, 0
    with threadpool_limits(limits=1, user_api="blas"):
        for _ in range(epochs):
            order = rng.permutation(len(y))
            for start in range(0, len(y) - BATCH + 1, BATCH):  # full batches: stable BN stats
                batch = order[start:start + BATCH]
                logits, caches = forward_train(params, x[batch])
                _, dlogits = softmax_cross_entropy(logits, y[batch])
                step += 1
                adam_step(params, backward(params, caches, dlogits), state, step)
        params.update(population_statistics(params, x))
        eval_accuracy = accuracy(forward_eval(params, splits.eval_x), splits.eval_y)
    return Trained(params, eval_accuracy)


# --- export -----------------------------------------------------------------------------------

def to_onnx(params: dict[str, np.ndarray]) -> onnx.ModelProto:
    """Batch 1, as the accelerator runs one sample at a time; BN stays a node for the compiler."""
    nodes = []
    for i in (1, 2):
        previous = "input" if i == 1 else f"relu{i - 1}"
        bn_params = [f"bn{i}.{key}" for key in ("scale", "bias", "mean", "var")]
        nodes += [
            helper.make_node("Conv", [previous, f"conv{i}.weight"], [f"conv{i}"], name=f"conv{i}",
                             kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", [f"conv{i}", *bn_params], [f"bn{i}"],
                             name=f"bn{i}", epsilon=BN_EPSILON),
            helper.make_node("Relu", [f"bn{i}"], [f"relu{i}"], name=f"relu{i}"),
        ]
    nodes += [
        helper.make_node("MaxPool", ["relu2"], ["pool"], name="pool", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("Flatten", ["pool"], ["flatten"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flatten", "fc.weight", "fc.bias"], ["logits"], name="fc",
                         transB=1),
    ]
    graph = helper.make_graph(
        nodes, "digits_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
        initializer=[numpy_helper.from_array(params[name], name) for name in sorted(params)])
    model = helper.make_model(graph, producer_name="ember.examples", ir_version=IR_VERSION,
                              opset_imports=[helper.make_opsetid("", OPSET)],
                              doc_string="Digits CNN trained by examples/digits/train.py.")
    onnx.checker.check_model(model, full_check=True)
    return model


def onnxruntime_accuracy(model: onnx.ModelProto, images: np.ndarray, labels: np.ndarray) -> float:
    """Runs the export one sample at a time, as its static batch-1 input requires."""
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    logits = [session.run(["logits"], {"input": image[None]})[0] for image in images]
    return accuracy(np.concatenate(logits), labels)


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """An .npz that np.load reads, with fixed timestamps so equal arrays give equal bytes.

    np.savez stamps each member with the current time, which would make every rebuild a diff.
    """
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for key, value in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.ascontiguousarray(value), allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, member.getvalue())
    return buffer.getvalue()


def build(seed: int = DEFAULT_SEED, epochs: int = EPOCHS,
          train_limit: int | None = None) -> DigitsBuild:
    """Trains, exports, and checks that onnxruntime agrees with numpy on the eval accuracy."""
    splits = load_splits(seed)
    trained = train(splits, seed, epochs, train_limit)
    model = to_onnx(trained.params)
    ort_accuracy = onnxruntime_accuracy(model, splits.eval_x, splits.eval_y)
    if ort_accuracy != trained.eval_accuracy:
        raise RuntimeError(f"digits: onnxruntime top-1 {ort_accuracy:.4f} differs from numpy's "
                           f"{trained.eval_accuracy:.4f}; the export does not match training")
    files = {"model.onnx": model.SerializeToString(),
             "calib.npz": npz_bytes({"input": splits.calib_x}),
             "eval.npz": npz_bytes({"input": splits.eval_x, "labels": splits.eval_y})}
    return DigitsBuild(files, trained.eval_accuracy, ort_accuracy, len(splits.calib_x),
                       len(splits.eval_x))


if __name__ == "__main__":
    from examples.build import build_all, print_table

    print_table(build_all(which=("digits",)))
