"""What the script trains on, as each rank records it: which datasets ``load_data()``
returned (the training and the validation set), and the sample indices of every batch
that a DataLoader over them hands out, pass by pass, with the time each pass over the
training set took.

Two patchers, each installed by ``ddp_recorder.Recorder`` and returning the function that
undoes it:

- ``patch_load_data``: ``digits_data.load_data`` (or the data module
  DDP_RECORDER_DATA_MODULE names) remembers the datasets it returns; the graded run's
  training set is cut to ``short_step_size`` samples, so that every epoch ends in a short
  accumulation step on every rank;
- ``patch_dataloader_iterators``: four methods of torch's DataLoader iterators (three
  private, pinned by the assessment's fast tests at the torch version in use) record each
  batch's indices, resolved through any Subsets to indices of the dataset itself.

The checks of the shards (``ddp_checks_training.py``) and of the replay read these records.

Your copy of this file is replaced by the instructor's when your work is graded.
"""
import os
import time

# torch is imported inside the functions that use it (ddp_recorder.py says why).

DATA_MODULE_ENV = "DDP_RECORDER_DATA_MODULE"


def patch_load_data(recorder):
    """Remember the datasets load_data() returns: the training and the validation set.

    The module holding ``load_data`` is ``digits_data`` (the assessment's), or the one the
    environment variable ``DDP_RECORDER_DATA_MODULE`` names (the workshop's notebook 02
    exercise reuses this recorder with its own data).
    """
    import importlib

    module = importlib.import_module(os.environ.get(DATA_MODULE_ENV, "digits_data"))
    original = module.load_data

    def load_data(*args, **kwargs):
        train_set, val_set = original(*args, **kwargs)
        train_set = with_short_last_step(train_set, recorder.world_size,
                                         *flag_values(recorder.script_args, "--batch-size",
                                                      "--accumulate"))
        recorder.train_set, recorder.val_set = train_set, val_set
        recorder.splits = {id(train_set): "train", id(val_set): "val"}
        return train_set, val_set

    module.load_data = load_data
    return lambda: setattr(module, "load_data", original)


def flag_values(args, *flags):
    """The whole-number values of ``flags`` in ``args`` (``--flag N`` or ``--flag=N``), None
    for a flag that is absent."""
    found = dict.fromkeys(flags)
    for i, arg in enumerate(args):
        name, _, value = arg.partition("=")
        if name in found:
            value = value or (args[i + 1] if i + 1 < len(args) else "")
            found[name] = int(value) if value.isdigit() else None
    return list(found.values())


def short_step_size(n, world_size, batch_size, accumulate):
    """The largest training-set size up to ``n`` whose every epoch ends, on every rank, in a
    short accumulation step (fewer than ``accumulate`` batches left): the step a script can
    get wrong (dividing by ``accumulate`` anyway, or never stepping on it). At most
    ``world_size * batch_size * accumulate`` samples fewer; ``n`` where none is needed."""
    if not batch_size or not accumulate or accumulate < 2:
        return n
    for size in range(n, max(0, n - world_size * batch_size * accumulate) - 1, -1):
        per_rank = -(-size // world_size)  # DistributedSampler pads every rank to this
        if -(-per_rank // batch_size) % accumulate:  # the rank's batches
            return size
    return n


def with_short_last_step(train_set, world_size, batch_size, accumulate):
    """The graded run's training set: its first ``short_step_size`` samples."""
    import torch.utils.data

    size = short_step_size(len(train_set), world_size, batch_size, accumulate)
    if size == len(train_set):
        return train_set
    if isinstance(train_set, torch.utils.data.TensorDataset):
        return torch.utils.data.TensorDataset(*(t[:size] for t in train_set.tensors))
    return torch.utils.data.Subset(train_set, range(size))


def _dataset_indices(dataset):
    """``(base dataset, function from an index into dataset to an index into base)``,
    through any Subsets on top."""
    from torch.utils.data import Subset

    chain = []  # the Subsets' index lists, outermost first
    while isinstance(dataset, Subset):
        chain.append(dataset.indices)
        dataset = dataset.dataset

    def resolve(i):
        i = int(i)
        for indices in chain:
            i = int(indices[i])
        return i

    return dataset, resolve


def patch_dataloader_iterators(recorder):
    """Record the sample indices of each batch of every pass over the training or the
    validation set, and the time each pass took. A pass starts when an iterator is made
    (``__init__``) or restarted by a persistent-worker loader (``_reset``);
    ``_next_index`` draws one batch's indices (a multi-worker loader draws ahead);
    ``__next__`` hands the next batch to the script, or ends the pass (StopIteration)."""
    from torch.utils.data import dataloader

    base = dataloader._BaseDataLoaderIter
    originals = base.__init__, base._reset, base._next_index, base.__next__
    original_init, original_reset, original_next_index, original_next = originals
    import torch

    def settled():
        """Now, once the GPU has run what was queued: CUDA runs asynchronously, so a pass
        would otherwise end when its last step was launched, not when it was computed."""
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
        return time.perf_counter()

    def start_pass(iterator, dataset):
        iterator._ddp_recorder_pass = None
        dataset, resolve = _dataset_indices(dataset)
        split = recorder.splits.get(id(dataset))
        if split and recorder.recording:
            batches = []
            record = {"split": split, "batches": batches, "seconds": None}
            recorder.passes.append(record)
            iterator._ddp_recorder_pass = (batches, resolve)
            iterator._ddp_recorder_record = record
            iterator._ddp_recorder_handed = 0
            iterator._ddp_recorder_start = settled()

    def __init__(iterator, loader, *args, **kwargs):
        # Before the original: a multi-worker iterator draws indices in __init__.
        start_pass(iterator, loader.dataset)
        original_init(iterator, loader, *args, **kwargs)

    def _reset(iterator, loader, first_iter=False):
        if not first_iter:
            start_pass(iterator, loader.dataset)
        return original_reset(iterator, loader, first_iter=first_iter)

    def _next_index(iterator):
        index = original_next_index(iterator)
        current = getattr(iterator, "_ddp_recorder_pass", None)
        if current:
            batches, resolve = current
            batch = index.tolist() if hasattr(index, "tolist") else index
            batches.append([resolve(i) for i in (batch if isinstance(batch, (list, tuple))
                                                 else [batch])])
        return index

    def __next__(iterator):
        current = getattr(iterator, "_ddp_recorder_pass", None)
        try:
            data = original_next(iterator)
        except StopIteration:
            if current:  # the pass is over: its time, from the iterator's start
                iterator._ddp_recorder_record["seconds"] = (
                    settled() - iterator._ddp_recorder_start)
            raise
        if current:
            # Batches come out in the order their indices were drawn (DataLoader's
            # in_order=True, its default): this one is the pass's next.
            batches, _ = current
            if iterator._ddp_recorder_record["split"] == "train":
                recorder.handed_out.append(batches[iterator._ddp_recorder_handed])
            iterator._ddp_recorder_handed += 1
        return data

    base.__init__, base._reset, base._next_index, base.__next__ = (
        __init__, _reset, _next_index, __next__)

    def undo():
        base.__init__, base._reset, base._next_index, base.__next__ = originals

    return undo
