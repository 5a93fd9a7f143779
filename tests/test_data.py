"""Datasets, samplers and loaders: what every rank sees, and the real Fashion-MNIST reader."""
import struct
import subprocess
import sys

import pytest
import torch
from torch.utils.data import RandomSampler, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from conftest import REPO
from workshop_lib import data
from workshop_lib.errors import CourseError


def indices_seen(loader):
    """The dataset rows a loader yields, recovered from a dataset whose x is its index."""
    return [int(i) for x, _ in loader for i in x.flatten()]


def index_dataset(n):
    return TensorDataset(torch.arange(n).float().view(n, 1), torch.zeros(n, dtype=torch.int64))


@pytest.mark.parametrize("n,world_size", [(1438, 2), (1000, 2), (101, 3)])
def test_distributed_shards_are_disjoint_cover_the_data_and_change_each_epoch(n, world_size):
    dataset = index_dataset(n)
    samplers = [DistributedSampler(dataset, world_size, rank, shuffle=True, seed=0)
                for rank in range(world_size)]
    loaders = [data.TensorLoader(dataset, 16, s, "cpu") for s in samplers]
    shards_by_epoch = []
    for epoch in range(3):
        for s in samplers:
            s.set_epoch(epoch)
        shards = [indices_seen(loader) for loader in loaders]
        assert len({len(s) for s in shards}) == 1, "every rank must take the same number of steps"
        distinct = [set(s) for s in shards]
        padding = sum(map(len, shards)) - n  # DistributedSampler repeats a few to even out
        assert 0 <= padding < world_size
        if padding == 0:
            for a in range(world_size):
                for b in range(a + 1, world_size):
                    assert not distinct[a] & distinct[b], "ranks must not share samples"
        assert set().union(*distinct) == set(range(n)), "together the ranks cover the data"
        shards_by_epoch.append(shards)
    for rank in range(world_size):
        assert shards_by_epoch[0][rank] != shards_by_epoch[1][rank], "set_epoch must reshuffle"
        assert set(shards_by_epoch[0][rank]) != set(shards_by_epoch[1][rank]), \
            "each epoch a rank must get a different subset, not the same one reordered"


def test_the_course_shows_a_missing_set_epoch_as_a_repeat():
    with_epoch = data.shards_by_epoch(100, 2, epochs=3, set_epoch=True)
    without = data.shards_by_epoch(100, 2, epochs=3, set_epoch=False)
    assert without[0] == without[1] == without[2], "the same shards in the same order"
    assert with_epoch[1] != with_epoch[0] and with_epoch[2] != with_epoch[1]


@pytest.mark.parametrize("n,world_size", [(359, 2), (359, 3), (10, 4), (3, 4)])
def test_validation_shards_hold_each_sample_exactly_once(n, world_size):
    dataset = index_dataset(n)
    shards = [list(data.ShardSampler(dataset, rank, world_size)) for rank in range(world_size)]
    merged = sorted(i for shard in shards for i in shard)
    assert merged == list(range(n))


def test_tensor_loader_batches_like_a_dataloader():
    dataset = index_dataset(10)
    loader = data.TensorLoader(dataset, 4, RandomSampler(dataset), "cpu")
    batches = list(loader)
    assert len(loader) == len(batches) == 3
    assert [len(x) for x, _ in batches] == [4, 4, 2]
    assert sorted(indices_seen(loader)) == list(range(10))
    assert len(data.TensorLoader(dataset, 4, RandomSampler(dataset), "cpu", drop_last=True)) == 2
    with pytest.raises(CourseError, match="batch size"):
        data.TensorLoader(dataset, 0, RandomSampler(dataset), "cpu")


def test_digits_is_real_offline_and_split_the_same_way_every_time():
    train_a, val_a, info = data.load("digits")
    train_b, val_b, _ = data.load("digits")
    assert (len(train_a), len(val_a)) == (1438, 359)
    assert info.num_classes == 10 and train_a.tensors[0].shape[1:] == (1, 8, 8)
    assert torch.equal(train_a.tensors[1], train_b.tensors[1])
    assert torch.equal(val_a.tensors[0], val_b.tensors[0])
    assert set(train_a.tensors[1].tolist()) == set(range(10))
    assert abs(train_a.tensors[0].mean()) < 1e-4 and abs(train_a.tensors[0].std() - 1) < 1e-3


def write_idx(path, array, magic):
    """Write an uncompressed IDX file as torchvision's MNIST readers expect it."""
    header = struct.pack(">i", magic) + b"".join(struct.pack(">i", d) for d in array.shape)
    path.write_bytes(header + array.numpy().tobytes())


def write_tiny_fashion_mnist(root, n_train=20, n_val=10):
    raw = data.fashion_mnist_raw_dir(root)
    raw.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    sets = {}
    for prefix, n in (("train", n_train), ("t10k", n_val)):
        images = torch.randint(0, 256, (n, 28, 28), dtype=torch.uint8, generator=g)
        labels = torch.randint(0, 10, (n,), dtype=torch.uint8, generator=g)
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images, 0x00000803)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels, 0x00000801)
        sets[prefix] = (images, labels)
    return sets


def test_the_datasets_are_read_as_scikit_learn_and_torchvision_read_them_without_them(
        tmp_path):
    """digits as sklearn's load_digits gives it, an IDX file as torchvision's MNIST reader
    reads it; in a fresh process, loading either imports neither package (each import cost
    a launched process 1.2-2.2 s)."""
    from sklearn.datasets import load_digits
    from torchvision.datasets.mnist import read_image_file, read_label_file

    images, labels = data.digits_arrays()
    digits = load_digits()
    assert torch.equal(images, torch.tensor(digits.images, dtype=torch.float32))
    assert torch.equal(labels, torch.tensor(digits.target, dtype=torch.int64))
    write_tiny_fashion_mnist(tmp_path)
    raw = data.fashion_mnist_raw_dir(tmp_path)
    assert torch.equal(data.read_idx(raw / "train-images-idx3-ubyte"),
                       read_image_file(str(raw / "train-images-idx3-ubyte")))
    assert torch.equal(data.read_idx(raw / "t10k-labels-idx1-ubyte").long(),
                       read_label_file(str(raw / "t10k-labels-idx1-ubyte")))
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys; from workshop_lib import data; "
         f"data.load('digits'); data.load('fashion-mnist', {str(tmp_path)!r}); "
         "print(sorted({m.split('.')[0] for m in sys.modules} & {'sklearn', 'torchvision'}))"],
        capture_output=True, text=True, timeout=120, cwd=REPO)
    assert loaded.stdout.strip() == "[]", loaded.stderr[-2000:]


def test_fashion_mnist_is_read_from_the_raw_files(tmp_path):
    written = write_tiny_fashion_mnist(tmp_path)
    assert data.resolve_name("auto", tmp_path) == "fashion-mnist"
    train_set, val_set, info = data.load("auto", tmp_path)
    assert info.name == "fashion-mnist"
    x, y = train_set.tensors
    assert x.shape == (20, 1, 28, 28) and x.dtype == torch.float32
    assert torch.equal(y, written["train"][1].long())
    assert torch.equal(val_set.tensors[1], written["t10k"][1].long())
    # Standardisation is monotonic per pixel: the brightest raw pixel stays the brightest.
    assert x.view(20, -1).argmax(1).tolist() == written["train"][0].view(20, -1).argmax(1).tolist()


def test_auto_falls_back_to_digits_and_says_how_to_get_fashion_mnist(tmp_path):
    assert data.resolve_name("auto", tmp_path) == "digits"
    message = data.auto_choice_message(tmp_path)
    assert "digits" in message and "download fashion-mnist" in message


def test_missing_fashion_mnist_says_how_to_download_it(tmp_path):
    with pytest.raises(CourseError, match="python -m workshop_lib.data download fashion-mnist"):
        data.load("fashion-mnist", tmp_path)


def test_truncated_fashion_mnist_is_reported_not_a_traceback(tmp_path):
    write_tiny_fashion_mnist(tmp_path)
    images = data.fashion_mnist_raw_dir(tmp_path) / "train-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:1000])
    with pytest.raises(CourseError, match="unreadable"):
        data.load("fashion-mnist", tmp_path)
    images.write_bytes(b"\x00\x00\x0d\x03" + bytes(12))  # floats, not bytes
    with pytest.raises(CourseError, match="unreadable .*not an IDX file of unsigned bytes"):
        data.load("fashion-mnist", tmp_path)


def test_unknown_dataset_lists_the_choices():
    with pytest.raises(CourseError, match="choose one of: auto, fashion-mnist, digits"):
        data.load("cifar-100")


def test_steps_per_epoch_follows_distributed_samplers_padding():
    from workshop_lib import data

    assert data.steps_per_epoch(1438, 2, 32) == 23   # 719 samples per rank
    assert data.steps_per_epoch(1438, 1, 64) == 23
    assert data.steps_per_epoch(10, 3, 4) == 1       # 4 per rank after padding
    assert data.steps_per_epoch(60000, 4, 128) == 118


def test_each_dataset_knows_its_training_and_validation_sizes():
    train_set, val_set, info = data.load("digits")
    assert info.train_size == len(train_set)
    assert info.val_size == len(val_set) == data.DATASETS["digits"].val_size
