"""Notebook 02, "What does each rank see?": predict what DistributedSampler hands out.

The learner writes down, before running anything, properties a person can predict from
how the sampler works (shard size, disjoint shards, together all samples, a new split
with set_epoch, padding); the check computes each from the real sampler
(``data.shards_by_epoch``) and says which predictions were off, and why.
"""
from workshop_lib import data
from workshop_lib.labs import Exercise, Verdict, register

N, WORLD = 10, 2          # the question's dataset size and ranks
N_PADDED, WORLD_PADDED = 10, 3

QUESTIONS = {
    "shard_size": f"how many of the {N} samples rank 1 trains on per epoch, with {WORLD} ranks",
    "disjoint": "do rank 0's and rank 1's shards of one epoch share no sample? (True/False)",
    "covers_everything": f"together, do the two shards hold all {N} samples? (True/False)",
    "new_split_with_set_epoch": "with set_epoch(1), does rank 1 get other samples than in "
                                "epoch 0? (True/False)",
    "repeats_without_set_epoch": "without set_epoch, is epoch 1 exactly epoch 0 again? "
                                 "(True/False)",
    "padding_samples": f"with {N_PADDED} samples on {WORLD_PADDED} ranks, how many samples "
                       f"does the sampler hand out twice in one epoch?",
}
WHY = {
    "shard_size": "each rank gets ceil(N / world_size) indices",
    "disjoint": "rank r takes every world_size-th index of one shared permutation, from r",
    "covers_everything": "the interleaved slices of one permutation hold every index",
    "new_split_with_set_epoch": "set_epoch(e) seeds the permutation with seed + e",
    "repeats_without_set_epoch": "without set_epoch the permutation is seeded the same way "
                                 "every epoch",
    "padding_samples": "the sampler pads to a multiple of world_size by repeating the first "
                       "indices: ceil(10 / 3) * 3 - 10 of them",
}


def truth():
    """Every answer, computed from the real DistributedSampler."""
    with_epoch = data.shards_by_epoch(N, WORLD, epochs=2, set_epoch=True)
    without = data.shards_by_epoch(N, WORLD, epochs=2, set_epoch=False)
    padded = data.shards_by_epoch(N_PADDED, WORLD_PADDED, epochs=1)[0]
    rank0, rank1 = with_epoch[0]
    handed_out = [i for shard in padded for i in shard]
    return {
        "shard_size": len(rank1),
        "disjoint": not set(rank0) & set(rank1),
        "covers_everything": set(rank0) | set(rank1) == set(range(N)),
        "new_split_with_set_epoch": set(with_epoch[1][1]) != set(rank1),
        "repeats_without_set_epoch": without[1] == without[0],
        "padding_samples": len(handed_out) - len(set(handed_out)),
    }


def stub():
    return dict.fromkeys(QUESTIONS)


def solution():
    return truth()


def check(answers):
    if not isinstance(answers, dict):
        return Verdict(False, "my_answers should be the dict of the cell above, with your "
                              "answers in place of None")
    expected = truth()
    missing = [key for key in QUESTIONS if answers.get(key) is None]
    if missing:
        return Verdict(False, f"answer every question first: {', '.join(missing)} still None "
                              f"({QUESTIONS[missing[0]]})")
    wrong = [key for key in QUESTIONS if answers[key] != expected[key]]
    if wrong:
        reasons = "; ".join(f"{key}: you said {answers[key]!r}, the sampler gives "
                            f"{expected[key]!r} ({WHY[key]})" for key in wrong)
        return Verdict(False, f"{len(wrong)} of {len(QUESTIONS)} predictions were off: "
                              f"{reasons}", {"wrong": wrong})
    return Verdict(True, f"all {len(QUESTIONS)} predictions match what the sampler did")


register(Exercise("sampler", "02_from_one_gpu_to_many", "predict DistributedSampler's shards",
                  check=check, stub=stub, solution=solution, stub_reason="answer every question"))
