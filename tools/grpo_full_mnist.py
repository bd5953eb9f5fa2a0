"""Write the official MNIST (or Fashion-MNIST) train and test splits as the four IDX .gz files that
`4_GRPO_MNIST/grpo_mnist.py --data-dir DIR` reads: 60,000 training and 10,000 test images, in place of the bundled
10,000 test digits split 8,000 / 2,000.

    python tools/grpo_full_mnist.py --out ~/mnist_full
    python 4_GRPO_MNIST/grpo_mnist.py --data-dir ~/mnist_full

From tensorflow-datasets when it can provide the dataset (tfds.data_source: random access, no TensorFlow needed to
read), encoded here as IDX files; otherwise, with --download (the default), the IDX files that tfds's own builder
downloads, each checked against the SHA-256 that tensorflow-datasets lists (preparing a tfds dataset encodes every
image with TensorFlow, which this course does not install). Needs internet unless tfds has the data already.
Each file is written under a temporary name and moved into place; the four are then read back with the script's own
reader (`load_idx_split`), so a folder this tool finished is one the script accepts.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import struct
import sys
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course import load_script  # noqa: E402

IDX_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


class FetchError(Exception):
    """The data could not be had: one line, exit status 1."""


def idx_bytes(array: np.ndarray) -> bytes:
    """A uint8 array in the IDX format: 0x00 0x00 0x08 ndim | ndim big-endian uint32 sizes | the bytes."""
    return bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


def write_file(path: str, blob: bytes, compress: bool) -> None:
    """Write `blob` (gzip-compressed if `compress`) under a temporary name, then move it into place."""
    with open(path + ".part", "wb") as fh:
        fh.write(gzip.compress(blob, mtime=0) if compress else blob)
    os.replace(path + ".part", path)  # never a half-written file under the real name


def from_tfds(name: str, folder: str, download: bool) -> None:
    """Both splits through tfds.data_source, written as IDX files. The tests run it under tfds.testing.mock_data."""
    import absl.logging

    absl.logging.set_verbosity(absl.logging.ERROR)  # keep tfds' warnings off the error path
    import tensorflow_datasets as tfds

    for split, (image_file, label_file) in IDX_FILES.items():
        try:
            source = tfds.data_source(name, split=split, download=download)
            examples = [source[i] for i in range(len(source))]
        except Exception as e:  # offline, not prepared, tfds needs TensorFlow to prepare, ...
            reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:200]
            raise FetchError(f"tensorflow-datasets could not load '{name}' split '{split}' ({reason})") from None
        images = np.stack([np.asarray(ex["image"])[..., 0] for ex in examples]).astype(np.uint8)  # (N, 28, 28)
        labels = np.array([int(ex["label"]) for ex in examples], dtype=np.uint8)
        write_file(os.path.join(folder, image_file), idx_bytes(images), compress=True)
        write_file(os.path.join(folder, label_file), idx_bytes(labels), compress=True)


def tfds_idx_files(name: str) -> dict[str, tuple[str, str]]:
    """{file name: (url, sha256)} of the IDX files tfds's own builder downloads for `name`, read from the checksum
    list that tensorflow-datasets ships (url_checksums/<name>.txt)."""
    import tensorflow_datasets as tfds

    path = os.path.join(os.path.dirname(tfds.__file__), "url_checksums", f"{name}.txt")
    files = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                url, _size, sha256, filename = line.rstrip("\n").split("\t")
                files[filename] = (url, sha256)
    return files


def sha256_of(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def fetch_idx_files(name: str, folder: str, timeout: float = 60.0) -> None:
    """Download the four IDX .gz files of `name` into `folder`, each checked against tfds's SHA-256; a file already
    there with the right digest is kept."""
    for filename, (url, sha256) in tfds_idx_files(name).items():
        path = os.path.join(folder, filename)
        if os.path.exists(path) and sha256_of(path) == sha256:
            continue
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                blob = response.read()
        except (OSError, ValueError) as e:  # URLError, timeouts and refused connections are OSErrors
            raise FetchError(f"could not download {url} ({e})") from None
        if hashlib.sha256(blob).hexdigest() != sha256:
            raise FetchError(f"{url} does not match the SHA-256 that tensorflow-datasets lists; not using it")
        write_file(path, blob, compress=False)


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder for the four IDX .gz files (created if missing)")
    p.add_argument("--dataset", default="mnist", choices=("mnist", "fashion_mnist"), help="the tfds name")
    p.add_argument(
        "--download",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="let tfds prepare the data, or fetch its IDX files, when it has none",
    )
    args = p.parse_args(argv)
    g = load_script("4_GRPO_MNIST/grpo_mnist.py")
    try:
        os.makedirs(args.out, exist_ok=True)
        try:
            from_tfds(args.dataset, args.out, args.download)
        except FetchError as tfds_error:
            if not args.download:
                raise
            print(f"{tfds_error}; fetching its IDX files instead", flush=True)
            fetch_idx_files(args.dataset, args.out)
        for split in IDX_FILES:  # read back as the script reads them
            x, y = g.load_idx_split(args.out, split)
            print(f"{split}: {len(y)} images in {args.out}", flush=True)
    except (FetchError, g.RunError, OSError) as e:
        sys.exit(f"error: {e}")
    print(f"train with: python 4_GRPO_MNIST/grpo_mnist.py --data-dir {args.out}")
    return args.out


if __name__ == "__main__":
    main()
