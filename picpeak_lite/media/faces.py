"""Faces for "Find me" (issue 36): where they are in a picture and a 128-number description of each; the one
home of dlib, its models (``face_recognition_models``) and numpy.

Why dlib: ``dlib-bin`` is a prebuilt wheel (4 MB, no compiler), and ``face_recognition_models`` ships dlib's
trained models inside its package (nothing is fetched at run time, nothing leaves the box). Its HOG detector
finds frontal and near-frontal faces on a CPU without a GPU, and its ResNet embedding (99.38 % on LFW, the
model ``face_recognition`` uses) puts two pictures of one person within 0.6 of each other.

Where the CPU goes (issue 36: under 0.2 s a photo): dlib-bin is built without a BLAS, and its ResNet cost 92 ms
a face; :class:`_Network` runs the same network, read from the same model file, as numpy matrix products
(OpenBLAS): 13 ms a face, a photo's faces in one batch, descriptors equal to dlib's within 1e-6. The detector
scans a copy of at most DETECT_SIDE px (its cost grows with the pixels: 153 ms at 1600, 84 at 1200); the
landmarks and the descriptor are read from the full view image.

Sync and pure: it runs only in an image child (``pipeline/imagejobs.py``), never in the server's process, so
the models (about 40 MB mapped) load there, lazily on the first face job, under that child's deadline and
address-space limit. Both packages are an optional extra (``pip install 'picpeak-lite[faces]'``):
:func:`available` tells the pages whether to offer the feature, without importing either.

An embedding travels and is stored as 128 float32 numbers, 512 bytes (:func:`pack`); a face box as
(left, top, right, bottom) in the view image's pixels. Nothing else of a face is kept.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from picpeak_lite.media import images

DIMENSIONS = 128
EMBEDDING_BYTES = DIMENSIONS * 4
# Two faces of one person are within 0.6 of each other for dlib's model (its authors' threshold); a little
# tighter keeps look-alikes in a crowd of 150 guests out. Chosen on tests/faces (see tests/test_faces.py).
MATCH_DISTANCE = 0.55
# "Not me": a shown face this near the refused one is the same person, and is hidden with it.
SAME_PERSON_DISTANCE = 0.45
# The detector's input: the view image is ~1600 px already; a selfie is shrunk to this too (a phone's 12 MP
# would cost a second and find the same face).
MAX_SIDE = 1600
SELFIE_MAX_PIXELS = 50_000_000
VIEW_MAX_PIXELS = 25_000_000  # a view image is ~1600 px; anything far bigger is not one of ours
# The detector's copy of a view image. Its smallest face is ~60 px of what it scans, so a 1600-px view's faces
# of under ~80 px (5 % of the long edge; 300 px of a 24 MP original) are not found: the price of 84 ms instead of
# 153 (measured with tests/faces pasted small on a 1600-px canvas: at 1600 the smallest found were 50-62 px, at
# 1200 62-86 px). Faces that small still match (0.47 from their portraits at 60 px), so this is a CPU trade-off,
# not an accuracy one; a guest's selfie is far above it.
DETECT_SIDE = 1200
# Faces smaller than this (pixels of the box's side in the picture) are not described.
MIN_FACE = 48
# Faces described in one batch: the first layer's patches take 3 MB a face, held to the child's address space.
BATCH = 16


@dataclass(frozen=True)
class Face:
    box: tuple[int, int, int, int]  # left, top, right, bottom
    embedding: bytes  # DIMENSIONS float32, little-endian


def available() -> bool:
    """Whether the ``faces`` extra is installed (dlib, its models and numpy), without importing any of them."""
    return all(importlib.util.find_spec(name) is not None
               for name in ("dlib", "numpy", "face_recognition_models"))


def models_dir() -> Path:
    """Where ``face_recognition_models`` keeps dlib's model files. Its __init__ imports pkg_resources only to
    find them; the path is enough."""
    spec = importlib.util.find_spec("face_recognition_models")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("face_recognition_models is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "models"


class _Models:
    """The detector, the landmark predictor and the embedding network, loaded once per child process."""

    def __init__(self) -> None:
        import dlib

        models = models_dir()
        self.detector = dlib.get_frontal_face_detector()
        self.landmarks = dlib.shape_predictor(str(models / "shape_predictor_5_face_landmarks.dat"))
        self.network = _Network(models / "dlib_face_recognition_resnet_model_v1.dat")


def _int(data: bytes, at: int) -> tuple[int, int]:
    """One integer as dlib serializes it (a byte with its length and sign, then little-endian bytes), and
    where the next value starts."""
    head = data[at]
    size = head & 0x0F
    value = int.from_bytes(data[at + 1:at + 1 + size], "little")
    return (-value if head & 0x80 else value), at + 1 + size


def _tensor(data: bytes, at: int) -> tuple[Any, int]:
    """A dlib tensor (version 2: its four dimensions, then raw little-endian float32s) as a flat array."""
    import numpy as np

    version, at = _int(data, at)
    if version != 2:
        raise RuntimeError(f"dlib tensor version {version} is not known")
    count = 1
    for _ in range(4):
        size, at = _int(data, at)
        count *= size
    return np.frombuffer(data, dtype="<f4", count=count, offset=at), at + 4 * count


class _Network:
    """dlib's face description network (``dlib_face_recognition_resnet_model_v1``, the ResNet of dlib's
    ``dnn_face_recognition_ex.cpp``) evaluated with numpy, from the weights in its model file.

    The file is read in its order, input to output: each layer's name (``con_4``, ``affine_``, ``max_pool_2``,
    ``avg_pool_2``, ``fc_2``), its parameter tensor and its sizes; anything else between them (versions, the
    relu/tag/add layers) has no parameters and is skipped. The network's shape is checked as it is read, so a
    different model file fails here, loudly, rather than describing faces wrongly. Each ``affine_`` (a trained
    batch norm) is folded into the convolution before it. Activations are NHWC float32; a convolution is one
    matrix product over its patches."""

    _LAYER = re.compile(rb"\x05con_4|\x07affine_|\x0amax_pool_2|\x0aavg_pool_2|\x04fc_2")
    MEAN_RGB = (122.782, 117.001, 104.298)  # input_rgb_image_sized: (pixel - mean) / 256
    CHIP = 150
    PADDING = 0.25
    # (channels, blocks) of its five stages; every stage but the first starts by halving the size.
    STAGES = ((32, 3), (64, 4), (128, 3), (256, 3), (256, 1))

    def __init__(self, path: Path) -> None:
        import numpy as np

        data = path.read_bytes()
        layers: list[tuple[str, Any, list[int]]] = []
        at = 0
        while (found := self._LAYER.search(data, at)) is not None:
            kind, at = found.group()[1:].decode(), found.end()
            if kind in ("con_4", "affine_"):
                params, at = _tensor(data, at)
                sizes = []
                if kind == "con_4":  # filters, rows, columns, stride y, x, padding y, x
                    for _ in range(7):
                        value, at = _int(data, at)
                        sizes.append(value)
                layers.append((kind, params, sizes))
            elif kind == "fc_2":
                outputs, at = _int(data, at)
                inputs, at = _int(data, at)
                params, at = _tensor(data, at)
                layers.append((kind, params[:inputs * outputs].reshape(inputs, outputs), [inputs, outputs]))
            else:  # rows, columns, stride y, x, padding y, x
                sizes = []
                for _ in range(6):
                    value, at = _int(data, at)
                    sizes.append(value)
                layers.append((kind, (), sizes))
        self._layers = iter(layers)
        self.stem = self._conv(3, 32, 7)
        self._expect("max_pool_2", [3, 3, 2, 2, 0, 0])
        self.blocks: list[tuple[tuple[Any, Any, int, int], tuple[Any, Any, int, int], bool]] = []
        channels = 32
        for stage, (width, count) in enumerate(self.STAGES):
            for block in range(count):
                down = stage > 0 and block == 0
                first = self._conv(channels, width, 3)
                second = self._conv(width, width, 3)
                if down:
                    self._expect("avg_pool_2", [2, 2, 2, 2, 0, 0])
                self.blocks.append((first, second, down))
                channels = width
        self._expect("avg_pool_2", [0, 0, 1, 1, 0, 0])  # the average over everything
        kind, weights, sizes = self._next()
        if kind != "fc_2" or sizes != [channels, DIMENSIONS] or next(self._layers, None) is not None:
            raise RuntimeError("the face model file is not the network this code knows")
        self.fc = weights.copy()  # the views into the file's bytes go with this method
        del self._layers
        self.mean = np.array(self.MEAN_RGB, dtype=np.float32)

    def _next(self) -> tuple[str, Any, list[int]]:
        return next(self._layers, ("end", (), []))

    def _expect(self, kind: str, sizes: list[int]) -> None:
        layer = self._next()
        if layer[0] != kind or layer[2] != sizes:
            raise RuntimeError("the face model file is not the network this code knows")

    def _conv(self, inputs: int, outputs: int, side: int) -> tuple[Any, Any, int, int]:
        """The next convolution with the batch norm after it folded in: (weights as a (side*side*inputs,
        outputs) matrix in the patches' order, bias, stride, padding)."""
        import numpy as np

        kind, params, sizes = self._next()
        affine, scale_shift, _ = self._next()
        if kind != "con_4" or affine != "affine_" or sizes[:3] != [outputs, side, side] \
                or sizes[3] != sizes[4] or sizes[5] != sizes[6] \
                or params.size != outputs * (inputs * side * side + 1) or scale_shift.size != 2 * outputs:
            raise RuntimeError("the face model file is not the network this code knows")
        _, _, _, stride, _, padding, _ = sizes
        filters = params[:-outputs].reshape(outputs, inputs, side, side)
        bias, gamma, beta = params[-outputs:], scale_shift[:outputs], scale_shift[outputs:]
        matrix = (filters * gamma[:, None, None, None]).transpose(2, 3, 1, 0).reshape(side * side * inputs, outputs)
        return (np.ascontiguousarray(matrix, dtype=np.float32), (bias * gamma + beta).astype(np.float32),
                stride, padding)

    def describe(self, chips: Any) -> Any:
        """The 128 numbers of each face chip (an (n, 150, 150, 3) uint8 RGB array, as dlib's
        ``get_face_chips`` cuts them), as an (n, 128) float32 array."""
        import numpy as np

        x = (chips.astype(np.float32) - self.mean) * np.float32(1 / 256)
        x = _max_pool(np.maximum(_convolve(x, *self.stem), 0), 3, 2)
        for first, second, down in self.blocks:
            y = _convolve(np.maximum(_convolve(x, *first), 0), *second)
            y = _add(y, _average_pool(x, 2, 2) if down else x)
            x = np.maximum(y, 0, out=y)
        return x.mean(axis=(1, 2)) @ self.fc


def _convolve(x: Any, matrix: Any, bias: Any, stride: int, padding: int) -> Any:
    """A convolution as one matrix product over its patches, each patch's pixels whole (all their channels in
    a row, the weights' order). The padding is a copy into zeros: ``np.pad`` cost 8 ms of a 3-face batch."""
    import numpy as np

    n, height, width, channels = x.shape
    side = round((matrix.shape[0] // channels) ** 0.5)
    if padding:
        padded = np.zeros((n, height + 2 * padding, width + 2 * padding, channels), dtype=np.float32)
        padded[:, padding:padding + height, padding:padding + width] = x
        x = padded
    windows = np.lib.stride_tricks.sliding_window_view(x, (side, side), axis=(1, 2))[:, ::stride, ::stride]
    rows, columns = windows.shape[1], windows.shape[2]
    patches = windows.transpose(0, 1, 2, 4, 5, 3).reshape(n * rows * columns, side * side * channels)
    out = patches @ matrix
    out += bias
    return out.reshape(n, rows, columns, matrix.shape[1])


def _taps(x: Any, dy: int, dx: int, rows: int, columns: int, stride: int) -> Any:
    """The pixels a window's tap (dy, dx) reads, for every window."""
    return x[:, dy:dy + stride * (rows - 1) + 1:stride, dx:dx + stride * (columns - 1) + 1:stride]


def _max_pool(x: Any, side: int, stride: int) -> Any:
    import numpy as np

    rows, columns = (x.shape[1] - side) // stride + 1, (x.shape[2] - side) // stride + 1
    out = _taps(x, 0, 0, rows, columns, stride).copy()
    for tap in range(1, side * side):
        np.maximum(out, _taps(x, *divmod(tap, side), rows, columns, stride), out=out)
    return out


def _average_pool(x: Any, side: int, stride: int) -> Any:
    rows, columns = (x.shape[1] - side) // stride + 1, (x.shape[2] - side) // stride + 1
    out = _taps(x, 0, 0, rows, columns, stride).copy()
    for tap in range(1, side * side):
        out += _taps(x, *divmod(tap, side), rows, columns, stride)
    out *= 1 / (side * side)
    return out


def _add(a: Any, b: Any) -> Any:
    """dlib's add_prev: where the two differ in size, the missing elements count as 0 and the sum takes the
    larger size of each dimension (a halving block's shortcut has fewer channels, and in the last stages one
    more row and column than the convolution's output)."""
    import numpy as np

    if a.shape == b.shape:
        return a + b
    out = np.zeros(tuple(max(i, j) for i, j in zip(a.shape, b.shape, strict=True)), dtype=np.float32)
    out[:, :a.shape[1], :a.shape[2], :a.shape[3]] = a
    out[:, :b.shape[1], :b.shape[2], :b.shape[3]] += b
    return out


_models: _Models | None = None


def _loaded() -> _Models:
    global _models
    if _models is None:
        # One BLAS thread: the child is one job at a time, and each BLAS thread maps its own buffers (the address
        # space the child is held to). Read by numpy when it is first imported, which is here.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        _models = _Models()
    return _models


def find(source: images.Source, *, max_pixels: int = SELFIE_MAX_PIXELS, upsample: int = 0) -> list[Face]:
    """Every face big enough to describe in the picture ``source`` (a path or bytes), largest first.

    Raises :class:`images.InvalidImage` for what is not a picture we read. ``upsample`` 1 finds faces half as
    big at four times the cost (a selfie does not need it). The detector scans a picture of more than
    DETECT_SIDE px at 3/4 (a 1600-px view at 1200); its boxes are mapped back, and the landmarks and the chips
    the network reads are taken from the full picture, so a face's description does not depend on the scan."""
    models = _loaded()
    import dlib
    import numpy as np

    width, height, rgb = images.face_pixels(source, max_side=MAX_SIDE, max_pixels=max_pixels)
    pixels = np.frombuffer(rgb, dtype=np.uint8).reshape(height, width, 3)
    # The detector scans a 3/4 copy of a view image (dlib's own pyramid step, 7 ms; Pillow's bilinear took 16).
    shrink = dlib.pyramid_down(4) if max(width, height) > DETECT_SIDE else None
    scan = pixels if shrink is None else shrink(pixels)
    boxes: list[tuple[int, int, int, int]] = []
    shapes: list[Any] = []
    for found_rect in models.detector(scan, upsample):
        rect = found_rect if shrink is None else shrink.rect_up(found_rect)
        left, top = max(0, rect.left()), max(0, rect.top())
        right, bottom = min(width, rect.right()), min(height, rect.bottom())
        if min(right - left, bottom - top) < MIN_FACE:
            continue
        boxes.append((left, top, right, bottom))
        shapes.append(models.landmarks(pixels, rect))
    found: list[Face] = []
    for start in range(0, len(boxes), BATCH):
        batch = dlib.full_object_detections()
        batch.extend(shapes[start:start + BATCH])
        chips = np.stack(dlib.get_face_chips(pixels, batch, size=_Network.CHIP, padding=_Network.PADDING))
        vectors = models.network.describe(chips).astype("<f4")
        found += [Face(box, vector.tobytes())
                  for box, vector in zip(boxes[start:start + BATCH], vectors, strict=True)]
    found.sort(key=lambda face: (face.box[2] - face.box[0]) * (face.box[3] - face.box[1]), reverse=True)
    return found


def find_in_photo(path: str) -> list[tuple[tuple[int, int, int, int], bytes]]:
    """A photo's faces from its view image, as plain tuples (what crosses the pipe from the child)."""
    return [(face.box, face.embedding) for face in find(path, max_pixels=VIEW_MAX_PIXELS)]


def find_in_selfie(data: bytes) -> list[bytes]:
    """The embeddings of the faces in a selfie's bytes (held in memory only), largest face first."""
    return [face.embedding for face in find(data)]


def nearest(query: bytes, embeddings: list[bytes], *, limit: float = MATCH_DISTANCE) -> list[tuple[int, float]]:
    """(index, distance) of every embedding within ``limit`` of ``query``, nearest first. Over 5,000 faces this
    is one matrix product (a few ms), so it runs in a thread of the server."""
    import numpy as np

    if not embeddings:
        return []
    matrix = np.frombuffer(b"".join(embeddings), dtype="<f4").reshape(len(embeddings), DIMENSIONS)
    distances = np.linalg.norm(matrix - np.frombuffer(query, dtype="<f4"), axis=1)
    order = np.argsort(distances, kind="stable")
    return [(int(i), float(distances[i])) for i in order if distances[i] <= limit]


def unpack(embedding: bytes) -> Any:
    """An embedding as a numpy vector (tests and benches)."""
    import numpy as np

    return np.frombuffer(embedding, dtype="<f4")
