"""Record shards: split across ranks each epoch, reshuffled, equal steps on every rank, and
TFRecord files (written here without TensorFlow) read into the same shards. (A real DDP
job reading shards, against one in memory: notebook 06, tests/test_notebook_06.py.)"""
from types import SimpleNamespace

import pytest
import torch

from conftest import run_course_command
from workshop_lib import data, shards

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
N, BATCH = 500, 16


@pytest.fixture(scope="module")
def index_shards(tmp_path_factory):
    """A dataset whose every x holds its own index, as 5 shards (uneven over 2 ranks)."""
    folder = tmp_path_factory.mktemp("shards")
    info = data.DatasetInfo("index", 1, 1, 10, N, "indices")
    samples = [(torch.full((1, 1, 1), float(i)), i % 10) for i in range(N)]
    shards.write_index(folder, info, samples[:400], samples[400:], num_shards=5)
    return shards.open_splits(folder)


def drawn(split, rank, world_size, epoch, equal_steps=True):
    schedule = shards.ShardSchedule(split, rank, world_size, seed=0, equal_steps=equal_steps)
    schedule.set_epoch(epoch)
    loader = shards.ShardLoader(schedule, BATCH, "cpu")
    return [int(i) for x, _ in loader for i in x.flatten()], len(loader)


def test_each_epoch_the_ranks_read_disjoint_shards_that_cover_them_all(index_shards):
    train, _ = index_shards
    plans = []
    for epoch in range(3):
        schedule = shards.ShardSchedule(train, 0, 2, seed=0)
        schedule.set_epoch(epoch)
        plan, _ = schedule.epoch_plan()
        assert not set(plan[0]) & set(plan[1]) and sorted(plan[0] + plan[1]) == list(range(5))
        plans.append(plan)
    assert plans[0] != plans[1] or plans[1] != plans[2], "the shards are dealt anew"


def test_the_ranks_draw_disjoint_samples_in_equal_steps_reshuffled_each_epoch(index_shards):
    train, _ = index_shards
    epochs = []
    for epoch in range(2):
        (rank0, steps0), (rank1, steps1) = (drawn(train, r, 2, epoch) for r in range(2))
        assert steps0 == steps1, "every rank takes as many steps (else a rank waits forever)"
        assert len(rank0) == len(rank1) == steps0 * BATCH
        assert not set(rank0) & set(rank1), "no sample on two ranks"
        assert all(i < 400 for i in rank0 + rank1), "training samples only"
        epochs.append(rank0)
    assert epochs[0] != epochs[1], "a new order every epoch"


def test_uneven_shards_without_equal_steps_give_ranks_different_step_counts(index_shards):
    train, _ = index_shards
    # 5 shards over 2 ranks: one rank holds 3 of them. Unequal steps are what would make
    # the rank with more batches wait in an all-reduce for the other: the hang.
    uneven = {r: drawn(train, r, 2, 0, equal_steps=False)[1] for r in range(2)}
    assert uneven[0] != uneven[1]
    assert sorted(uneven.values()) == [2 * 80 // BATCH, 3 * 80 // BATCH]
    equal = {r: drawn(train, r, 2, 0)[1] for r in range(2)}
    assert equal[0] == equal[1] == min(uneven.values())


def test_validation_reads_every_sample_once_over_the_ranks(index_shards):
    _, val = index_shards
    args = SimpleNamespace(seed=0, batch_size=BATCH)
    seen = []
    for rank in range(2):
        _, _, val_loader = shards.loaders(index_shards[0], val, args, "cpu", rank, 2, 512)
        seen += [int(i) for x, _ in val_loader for i in x.flatten()]
    assert sorted(seen) == list(range(400, 500))


def test_tfrecord_files_written_without_tensorflow_read_back_the_same_samples(tmp_path):
    from tfrecord.writer import TFRecordWriter

    train_set, _, _ = data.load("digits")
    x, y = train_set.tensors[0][:50], train_set.tensors[1][:50]
    path = tmp_path / "digits.tfrecord"
    writer = TFRecordWriter(str(path))
    for image, label in zip(x, y, strict=True):
        writer.write({"image": (image.flatten().tolist(), "float"),
                      "label": (int(label), "int")})
    writer.close()
    back = list(shards.tfrecord_samples(path, shape=(1, 8, 8)))
    assert len(back) == 50 and all(int(b[1]) == int(a) for b, a in zip(back, y, strict=True))
    torch.testing.assert_close(torch.stack([b[0] for b in back]), x)
    result = run_course_command(["-m", "workshop_lib.data", "shards", "--out",
                                 str(tmp_path / "shards"), "--num-shards", "2",
                                 "--from-tfrecord", str(path), str(path), "--shape", "1,8,8"])
    assert result.returncode == 0, result.stderr
    train, _, info = data.load(data_dir=tmp_path / "shards", data_format="shards")
    assert len(train) == 50 and (info.in_channels, info.image_size) == (1, 8)


def test_no_shards_is_one_clear_error(tmp_path, capsys):
    from workshop_lib import train

    with pytest.raises(SystemExit):
        train.main(["--data-format", "shards", "--data-dir", str(tmp_path), "--out",
                    str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "python -m workshop_lib.data shards" in err[0]
