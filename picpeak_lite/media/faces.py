"""Faces for "Find me" (issue 36): where they are in a picture and a 128-number description of each; the one
home of dlib, its models (``face_recognition_models``) and numpy.

Why dlib: ``dlib-bin`` is a prebuilt wheel (4 MB, no compiler), and ``face_recognition_models`` ships dlib's
trained models inside its package (nothing is fetched at run time, nothing leaves the box). Its HOG detector
finds frontal and near-frontal faces on a CPU without a GPU, and its ResNet embedding (99.38 % on LFW, the
model ``face_recognition`` uses) puts two pictures of one person within 0.6 of each other.

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
# Faces smaller than this (pixels of the box's side) are not described: the embedding of a 40-px face is noise.
MIN_FACE = 48


@dataclass(frozen=True)
class Face:
    box: tuple[int, int, int, int]  # left, top, right, bottom
    embedding: bytes  # DIMENSIONS float32, little-endian


def available() -> bool:
    """Whether the ``faces`` extra is installed (dlib, its models and numpy), without importing any of them."""
    return all(importlib.util.find_spec(name) is not None
               for name in ("dlib", "numpy", "face_recognition_models"))


class _Models:
    """The detector, the landmark predictor and the embedding network, loaded once per child process."""

    def __init__(self) -> None:
        import dlib

        spec = importlib.util.find_spec("face_recognition_models")
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError("face_recognition_models is not installed")
        # Its __init__ imports pkg_resources only to find these files; the path is enough.
        models = Path(next(iter(spec.submodule_search_locations))) / "models"
        self.detector = dlib.get_frontal_face_detector()
        self.landmarks = dlib.shape_predictor(str(models / "shape_predictor_5_face_landmarks.dat"))
        self.network = dlib.face_recognition_model_v1(str(models / "dlib_face_recognition_resnet_model_v1.dat"))


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
    big at four times the cost (a selfie does not need it; a group photo's view image may)."""
    models = _loaded()
    import numpy as np

    width, height, rgb = images.face_pixels(source, max_side=MAX_SIDE, max_pixels=max_pixels)
    pixels = np.frombuffer(rgb, dtype=np.uint8).reshape(height, width, 3)
    found: list[Face] = []
    for rect in models.detector(pixels, upsample):
        left, top = max(0, rect.left()), max(0, rect.top())
        right, bottom = min(width, rect.right()), min(height, rect.bottom())
        if min(right - left, bottom - top) < MIN_FACE:
            continue
        shape = models.landmarks(pixels, rect)
        vector = np.asarray(models.network.compute_face_descriptor(pixels, shape), dtype="<f4")
        found.append(Face((left, top, right, bottom), vector.tobytes()))
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
