"""Datasets, samplers and loaders for the course.

Every dataset comes as two ``TensorDataset`` s (train, validation) of normalised
``float32`` images ``(N, C, H, W)`` and ``int64`` labels, small enough to sit whole in
host or device memory:

- ``fashion-mnist``: the workshop dataset (60,000 + 10,000 images, 28x28), the four IDX
  files torchvision's ``FashionMNIST`` class downloads into a local data folder. Fetch
  them once with ``python -m workshop_lib.data download fashion-mnist`` on a machine with
  internet.
- ``digits``: scikit-learn's 1,797 real handwritten digits (8x8), bundled inside the
  scikit-learn wheel, so it needs no network. Small enough that a CPU trains a CNN on it
  in seconds, and it still shows the large-batch effects of notebook 03.
- ``auto``: ``fashion-mnist`` when its files are present, otherwise ``digits``.

Every launched process loads its dataset, so loading reads the files itself: importing
``torchvision.datasets`` or ``sklearn.datasets`` to read them cost each process 1.1-2.2 s
more than loading the data (measured on the 2-core CI machine).

    python -m workshop_lib.data list
    python -m workshop_lib.data download fashion-mnist [--data-dir DIR]
    python -m workshop_lib.data shards digits --out DIR --num-shards 8   (notebook 06)
"""
import argparse
import gzip
import importlib.util
import math
import os
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Sampler, TensorDataset

from workshop_lib import shards
from workshop_lib.errors import ArgumentParser, CourseError, exit_cleanly_on_course_error

DEFAULT_DATA_DIR = Path(
    os.environ.get("WORKSHOP_DATA_DIR", Path(__file__).resolve().parent.parent / "data")
)

FASHION_MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    in_channels: int
    image_size: int
    num_classes: int
    train_size: int
    description: str
    val_size: int | None = None  # validation images; None where not known ahead (shards)


DATASETS = {
    "fashion-mnist": DatasetInfo(
        "fashion-mnist", 1, 28, 10, 60_000,
        "Fashion-MNIST, 60,000 train / 10,000 validation 28x28 images (torchvision)",
        val_size=10_000,
    ),
    "digits": DatasetInfo(
        "digits", 1, 8, 10, 1_438,
        "scikit-learn handwritten digits, 1,438 train / 359 validation 8x8 images (offline)",
        val_size=359,
    ),
}
DATASET_CHOICES = ("auto", *DATASETS)
# Evaluation's batch: no activations are kept for backward, so it can be larger than any
# training batch; it changes no metric, only how many forward calls evaluation takes.
VAL_BATCH_SIZE = 512


def fashion_mnist_raw_dir(data_dir=DEFAULT_DATA_DIR):
    """Where torchvision's FashionMNIST class looks for the four IDX files."""
    return Path(data_dir) / "FashionMNIST" / "raw"


def is_available(name, data_dir=DEFAULT_DATA_DIR):
    if name == "fashion-mnist":
        raw = fashion_mnist_raw_dir(data_dir)
        return all((raw / f).is_file() for f in FASHION_MNIST_FILES)
    return name in DATASETS


def resolve_name(name, data_dir=DEFAULT_DATA_DIR):
    """Turn ``auto`` into a concrete dataset name; reject unknown names with the choices."""
    if name == "auto":
        return "fashion-mnist" if is_available("fashion-mnist", data_dir) else "digits"
    if name not in DATASETS:
        raise CourseError(
            f"unknown dataset {name!r}; choose one of: {', '.join(DATASET_CHOICES)}"
        )
    return name


def auto_choice_message(data_dir=DEFAULT_DATA_DIR):
    """One sentence saying what ``auto`` picks here and how to get the other dataset."""
    if is_available("fashion-mnist", data_dir):
        return f"dataset auto -> fashion-mnist (found in {fashion_mnist_raw_dir(data_dir)})"
    return (
        f"dataset auto -> digits (offline); for the workshop dataset run "
        f"`python -m workshop_lib.data download fashion-mnist --data-dir {data_dir}`"
    )


def load(name="auto", data_dir=DEFAULT_DATA_DIR, data_format="memory"):
    """Return ``(train_set, val_set, info)`` for a dataset name (or ``auto``); with
    ``data_format="shards"``, the record shards in ``data_dir`` (``shards.Split`` s)."""
    if data_format == "shards":
        return _open_shards(data_dir)
    name = resolve_name(name, data_dir)
    if name == "fashion-mnist":
        train_set, val_set = _load_fashion_mnist(Path(data_dir))
    else:
        train_set, val_set = _load_digits()
    return train_set, val_set, DATASETS[name]


def _open_shards(folder):
    """The record shards in ``folder`` (``shards.Split`` s), described from their index."""
    index = shards.read_index(folder)
    info = DatasetInfo(index["dataset"], index["in_channels"], index["image_size"],
                       index["num_classes"], sum(index["train"]),
                       f"{index['dataset']} as {len(index['train'])} record shards")
    return (*shards.open_splits(folder), info)


def _standardise(train_x, val_x):
    """Scale both splits with the training split's mean and std (no peeking at validation)."""
    mean, std = train_x.mean(), train_x.std()
    return (train_x - mean) / std, (val_x - mean) / std


def _load_fashion_mnist(data_dir):
    raw = fashion_mnist_raw_dir(data_dir)
    missing = [f for f in FASHION_MNIST_FILES if not (raw / f).is_file()]
    if missing:
        raise CourseError(
            f"Fashion-MNIST is not in {raw} (missing {', '.join(missing)}); run "
            f"`python -m workshop_lib.data download fashion-mnist --data-dir {data_dir}` "
            f"on a machine with internet, or use --dataset digits"
        )
    try:
        (train_images, train_labels, val_images, val_labels) = (
            read_idx(raw / name) for name in FASHION_MNIST_FILES)
        if train_images.shape[0] != train_labels.shape[0] or \
                val_images.shape[0] != val_labels.shape[0]:
            raise ValueError("images and labels differ in number")
    except (OSError, ValueError) as error:
        raise CourseError(
            f"Fashion-MNIST files in {raw} are unreadable ({type(error).__name__}: {error}); "
            f"delete that folder and run `python -m workshop_lib.data download fashion-mnist`"
        ) from None
    train_x, val_x = _standardise(
        train_images.unsqueeze(1).float() / 255, val_images.unsqueeze(1).float() / 255
    )
    return TensorDataset(train_x, train_labels.long()), TensorDataset(val_x, val_labels.long())


def read_idx(path):
    """An uncompressed IDX file of unsigned bytes (MNIST's format, as torchvision reads it):
    a big-endian header, 0x08 then the number of dimensions, each dimension's size, then
    the bytes."""
    raw = bytearray(Path(path).read_bytes())  # writable: the tensor shares its memory
    if len(raw) < 4 or raw[:3] != b"\x00\x00\x08":
        raise ValueError(f"{Path(path).name} is not an IDX file of unsigned bytes")
    header = 4 * (1 + raw[3])
    shape = struct.unpack(f">{raw[3]}I", raw[4:header]) if len(raw) >= header else None
    if shape is None or len(raw) - header != math.prod(shape):
        raise ValueError(f"{Path(path).name} holds {len(raw)} bytes, not what its header says")
    return torch.frombuffer(raw, dtype=torch.uint8, offset=header).reshape(shape)


def digits_arrays():
    """scikit-learn's digits, ``(images (1797, 8, 8) float32 of 0..16, labels int64)``,
    read from the file scikit-learn ships, as its ``load_digits`` reads it; where that file
    is not found (a stand-in package on a torch-only machine), from ``load_digits``."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    csv = Path(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz") \
        if spec and spec.submodule_search_locations else None
    if csv is None or not csv.is_file():
        from sklearn.datasets import load_digits

        digits = load_digits()
        return (torch.tensor(digits.images, dtype=torch.float32),
                torch.tensor(digits.target, dtype=torch.int64))
    with gzip.open(csv, "rt") as lines:
        table = torch.tensor([[float(v) for v in line.split(",")] for line in lines
                              if line.strip()])
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].long()


def _load_digits(val_fraction=0.2, split_seed=0):
    images, y = digits_arrays()
    x = images.unsqueeze(1) / 16
    # A fixed split, the same on every rank and in every run.
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(split_seed))
    n_val = int(len(y) * val_fraction)
    val_idx, train_idx = order[:n_val], order[n_val:]
    train_x, val_x = _standardise(x[train_idx], x[val_idx])
    return TensorDataset(train_x, y[train_idx]), TensorDataset(val_x, y[val_idx])


class ShardSampler(Sampler):
    """Rank ``rank``'s share of a dataset for evaluation: every ``world_size``-th index.

    Unlike ``DistributedSampler`` it never pads: the shards are disjoint and together hold
    each sample exactly once, so sums of per-rank counts are exact global metrics even when
    the dataset size is not a multiple of the world size.
    """

    def __init__(self, dataset, rank, world_size):
        self.indices = range(rank, len(dataset), world_size)

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)


def shards_by_epoch(n, world_size, epochs, set_epoch=True, seed=0, shuffle=True):
    """What ``DistributedSampler`` hands each rank: ``[epoch][rank] -> list of indices``.

    Notebook 02 uses it to show the split, and what happens without ``set_epoch``.
    """
    from torch.utils.data.distributed import DistributedSampler

    dataset = range(n)
    samplers = [DistributedSampler(dataset, world_size, rank, shuffle=shuffle, seed=seed)
                for rank in range(world_size)]
    result = []
    for epoch in range(epochs):
        for sampler in samplers:
            if set_epoch:
                sampler.set_epoch(epoch)
        result.append([list(sampler) for sampler in samplers])
    return result


def steps_per_epoch(n_samples, world_size, batch_size):
    """Optimizer steps per epoch of a rank: ``DistributedSampler`` gives each rank
    ceil(n / world_size) samples (padding the last shards), cut into batches."""
    return math.ceil(math.ceil(n_samples / world_size) / batch_size)


class TensorLoader:
    """Mini-batches sliced from tensors that sit on the training device.

    Used like ``DataLoader(dataset, batch_size, sampler=...)`` and driven by the same
    samplers (``RandomSampler``, ``DistributedSampler``, ...), but with no worker
    processes and no per-sample collate: the whole dataset is copied to ``device`` once,
    and each batch is one indexing operation. This is the path airbench takes for small
    datasets; ``python -m workshop_lib.bench`` measures it against a ``DataLoader``.
    """

    def __init__(self, dataset, batch_size, sampler, device, drop_last=False,
                 memory_format=torch.contiguous_format):
        if batch_size < 1:
            raise CourseError(f"batch size must be at least 1, got {batch_size}")
        self.x, self.y = (t.to(device) for t in dataset.tensors)
        self.batch_size = batch_size
        self.sampler = sampler
        self.drop_last = drop_last
        self.memory_format = memory_format

    def __len__(self):
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self):
        order = torch.as_tensor(list(self.sampler), dtype=torch.int64, device=self.x.device)
        for i in range(len(self)):
            idx = order[i * self.batch_size:(i + 1) * self.batch_size]
            yield self.x[idx].contiguous(memory_format=self.memory_format), self.y[idx]


def download(name, data_dir=DEFAULT_DATA_DIR):
    """Fetch a dataset into ``data_dir`` (only fashion-mnist needs it; needs internet)."""
    if name != "fashion-mnist":
        if name in DATASETS:
            print(f"{name} ships with its Python package; nothing to download")
            return
        raise CourseError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")
    from torchvision.datasets import FashionMNIST

    try:
        for train in (True, False):
            FashionMNIST(str(data_dir), train=train, download=True)
    except Exception as error:
        raise CourseError(
            f"could not download Fashion-MNIST ({type(error).__name__}: {error}); check the "
            f"internet connection, or copy the four IDX files into "
            f"{fashion_mnist_raw_dir(data_dir)}"
        ) from None
    print(f"fashion-mnist ready in {fashion_mnist_raw_dir(data_dir)}")


def write_shards(args):
    if args.from_tfrecord:
        if not args.shape:
            raise CourseError("--from-tfrecord needs --shape, e.g. --shape 1,8,8")
        shape = tuple(int(n) for n in args.shape.split(","))
        info = DatasetInfo("tfrecord", shape[0], shape[-1], 10, 0, "from TFRecord files")
        index = shards.write_index(args.out, info, *(
            shards.tfrecord_samples(path, shape=shape) for path in args.from_tfrecord),
            num_shards=args.num_shards)
    else:
        train_set, val_set, info = load(args.name, args.data_dir)
        index = shards.write_index(args.out, info, zip(*train_set.tensors, strict=True),
                                   zip(*val_set.tensors, strict=True), args.num_shards)
    print(f"{args.out}: {len(index['train'])} training shards ({sum(index['train']):,} "
          f"samples), {len(index['val'])} validation shards ({sum(index['val']):,})")


@exit_cleanly_on_course_error
def main(argv=None):
    parser = ArgumentParser(prog="python -m workshop_lib.data", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the datasets and whether each is available here")
    get = sub.add_parser("download", help="download a dataset into the data folder")
    get.add_argument("name", choices=list(DATASETS))
    shard = sub.add_parser("shards", help="write a dataset as WebDataset record shards")
    shard.add_argument("name", choices=list(DATASETS), nargs="?", default="digits")
    shard.add_argument("--out", type=Path, required=True, help="folder for the shards")
    shard.add_argument("--num-shards", type=int, default=8)
    shard.add_argument("--from-tfrecord", type=Path, nargs=2, metavar=("TRAIN", "VAL"),
                       help="convert these TFRecord files (tf.train.Example with a float "
                            "'image' list and an int64 'label') instead of a course dataset")
    shard.add_argument("--shape", default=None, help="the images' shape, e.g. 1,8,8 "
                                                     "(with --from-tfrecord)")
    for p in sub.choices.values():
        p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    args = parser.parse_args(argv)
    if args.command == "download":
        download(args.name, args.data_dir)
    elif args.command == "shards":
        write_shards(args)
    else:
        for info in DATASETS.values():
            state = "available" if is_available(info.name, args.data_dir) else "not downloaded"
            print(f"{info.name:14} {state:15} {info.description}")
        print(auto_choice_message(args.data_dir))


if __name__ == "__main__":
    sys.exit(main())
