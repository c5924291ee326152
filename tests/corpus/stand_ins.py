"""Small offline stand-ins for the data the corpus scripts read, in the on-disk format each reads.

Each helper writes a few hundred bytes to a few hundred kilobytes, in the exact layout the script (or
the torchvision dataset class it uses) checks, so no script downloads anything:

    char_memmaps(root / "data" / "tiny")           # nanoGPT: train.bin / val.bin (uint16) + meta.pkl
    mnist_raw(root / "data")                       # torchvision MNIST: MNIST/raw/*-idx?-ubyte
    mnist_raw(root / "data", dataset="FashionMNIST")  # torchvision FashionMNIST: FashionMNIST/raw/...
    image_folder(root / "imagenet", classes=2)     # torchvision ImageFolder: train/ and val/ of PNGs

The data is learnable (a repeated sentence; images whose class is their brightness), so "the loss went
down" is a property of the script and the migration, not of luck.
"""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np

_SENTENCE = "the quick brown fox jumps over the lazy dog. "


def char_memmaps(directory: Path, repeats: int = 200) -> int:
    """Write nanoGPT's character-level dataset layout (``data/shakespeare_char``'s format).

    Args:
        directory: The dataset folder the script reads as ``data/<dataset>``.
        repeats: How many times the sentence repeats (90% train, 10% val).

    Returns:
        The vocabulary size written to ``meta.pkl``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    text = _SENTENCE * repeats
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    split = int(len(ids) * 0.9)
    ids[:split].tofile(directory / "train.bin")
    ids[split:].tofile(directory / "val.bin")
    with (directory / "meta.pkl").open("wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f)
    return len(chars)


def _digits(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` 28x28 uint8 images whose label is which of 10 horizontal bands is lit."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=count, dtype=np.uint8)
    images = rng.integers(0, 40, size=(count, 28, 28), dtype=np.uint8)
    for image, label in zip(images, labels):
        image[2 + 2 * int(label): 4 + 2 * int(label), 4:24] = 255
    return images, labels


def mnist_raw(root: Path, train: int = 256, test: int = 128, dataset: str = "MNIST") -> None:
    """Write torchvision's MNIST layout: ``root/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte``.

    torchvision's ``MNIST(root, download=True)`` finds these four files, skips the download and
    reads them (the idx format: a big-endian magic number, the sizes, then the bytes).
    ``dataset="FashionMNIST"`` writes the same files under ``root/FashionMNIST/raw`` (its subclass
    reads the same names from the folder named after the class).
    """
    raw = root / dataset / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, count, seed in (("train", train, 0), ("t10k", test, 1)):
        images, labels = _digits(count, seed)
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 2051, count, 28, 28) + images.tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, count) + labels.tobytes())


def image_folder(root: Path, classes: int = 2, train_per_class: int = 8, val_per_class: int = 4, size: int = 32) -> None:
    """Write torchvision's ImageFolder layout: ``root/{train,val}/class{k}/img{i}.png``.

    Class ``k`` images are uniformly bright at level ``k``, plus noise.
    """
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, per_class in (("train", train_per_class), ("val", val_per_class)):
        for k in range(classes):
            folder = root / split / f"class{k}"
            folder.mkdir(parents=True, exist_ok=True)
            level = int(40 + 180 * k / max(classes - 1, 1))
            for i in range(per_class):
                pixels = np.clip(level + rng.integers(-20, 20, size=(size, size, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"img{i}.png")
