"""Notebook 08, "Looking back": a self-check of the day's arithmetic.

Seven questions a learner who did the day can answer with pen and paper: the samples one
optimizer step uses, the learning rate the linear and the square-root rules give, the
steps an epoch takes on several ranks, and from a measured speed-up the scaling efficiency,
each step's overhead among N and the speed-up on more GPUs if that overhead stays the same
(notebook 02's reading of weak scaling). Each answer is computed by the course's own
functions or formulas (``data.steps_per_epoch``, ``scaling.scaled_lr``, E = S/N), never
written down here, and the check says which answers are
off, and why. The notebook works one example through above the questions, with other
numbers (``WORKED``): copied as the answer, it fails.
"""
import math

from workshop_lib import data, scaling
from workshop_lib.labs import Exercise, Verdict, register

# The questions' set-up, and the worked example's (the notebook prints it above them).
ASKED = {"gpus": 4, "batch_size": 64, "accumulate": 2, "lr": 0.1, "lr_ref_batch": 256,
         "large_batch": 2048, "samples": 60_000, "speedup": 3.0, "step_ms": 40.0,
         "more_gpus": 16}
WORKED = {"gpus": 2, "batch_size": 32, "accumulate": 1, "lr": 0.1, "lr_ref_batch": 256,
          "large_batch": 1024, "samples": 60_000, "speedup": 1.6, "step_ms": 30.0,
          "more_gpus": 8}
RELATIVE_TOLERANCE = 0.01  # an answer within 1% is right: rounding to two digits is fine

QUESTIONS = {
    "global_batch": f"{ASKED['gpus']} GPUs, --batch-size {ASKED['batch_size']} per process, "
                    f"--accumulate {ASKED['accumulate']}: how many samples does one optimizer "
                    f"step use?",
    "linear_lr": f"a rate of {ASKED['lr']} tuned at global batch {ASKED['lr_ref_batch']}: the "
                 f"linear rule's rate at global batch {ASKED['large_batch']}",
    "sqrt_lr": "the same, with the square-root rule",
    "steps_per_epoch": f"{ASKED['samples']:,} training samples on {ASKED['gpus']} ranks, "
                       f"--batch-size {ASKED['batch_size']}, no accumulation: optimizer steps "
                       f"per epoch",
    "efficiency": f"a job ran {ASKED['speedup']:g}x as fast on {ASKED['gpus']} GPUs as on one, "
                  f"at the same batch per GPU (each GPU 1/{ASKED['gpus']} of the steps): its "
                  f"scaling efficiency",
    "step_overhead_ms": f"its step took {ASKED['step_ms']:g} ms on one GPU: how many ms more "
                        f"did a step take among the {ASKED['gpus']}?",
    "speedup_more_gpus": f"if that overhead per step stays the same, the speed-up on "
                         f"{ASKED['more_gpus']} GPUs",
}
WHY = {
    "global_batch": "batch per process x processes x micro-batches per step",
    "linear_lr": "k = large batch / reference batch, and the rate times k",
    "sqrt_lr": "the rate times the square root of k",
    "steps_per_epoch": "each rank draws ceil(samples / ranks), cut into batches, a short last "
                       "batch a step too",
    "efficiency": "E = S/N",
    "step_overhead_ms": "a step among N takes the step alone / E; the overhead is the "
                        "difference",
    "speedup_more_gpus": "E stays the same, so S = E x N: each of N GPUs runs 1/N of the "
                         "steps, each step the same time as before",
}


def truth(setup=None):
    """Every answer for ``setup`` (the questions' by default), computed as the course
    computes it."""
    q = setup or ASKED
    efficiency = q["speedup"] / q["gpus"]
    return {
        "global_batch": q["batch_size"] * q["gpus"] * q["accumulate"],
        "linear_lr": scaling.scaled_lr(q["lr"], "linear", q["large_batch"], q["lr_ref_batch"]),
        "sqrt_lr": scaling.scaled_lr(q["lr"], "sqrt", q["large_batch"], q["lr_ref_batch"]),
        "steps_per_epoch": data.steps_per_epoch(q["samples"], q["gpus"], q["batch_size"]),
        "efficiency": efficiency,
        "step_overhead_ms": q["step_ms"] / efficiency - q["step_ms"],
        "speedup_more_gpus": efficiency * q["more_gpus"],
    }


def _close(said, expected):
    try:
        said = float(said)
    except (TypeError, ValueError):
        return False
    return math.isclose(said, expected, rel_tol=RELATIVE_TOLERANCE)


def check(my_answers):
    if not isinstance(my_answers, dict):
        return Verdict(False, "my_answers should be the dict of the cell above, with a number "
                              "in place of each None")
    missing = [key for key in QUESTIONS if my_answers.get(key) is None]
    if missing:
        return Verdict(False, f"answer every question first: {', '.join(missing)} still None "
                              f"({QUESTIONS[missing[0]]})")
    expected = truth()
    wrong = [key for key in QUESTIONS if not _close(my_answers[key], expected[key])]
    if wrong:
        copied = all(_close(my_answers[key], truth(WORKED)[key]) for key in QUESTIONS)
        reasons = "; ".join(f"{key}: you said {my_answers[key]!r}, it is {expected[key]:.4g} "
                            f"({WHY[key]})" for key in wrong)
        return Verdict(False, ("these are the worked example's answers, for its own numbers: "
                               if copied else "")
                       + f"{len(wrong)} of {len(QUESTIONS)} answers are off: {reasons}",
                       {"wrong": wrong})
    return Verdict(True, f"all {len(QUESTIONS)} answers right: a step of "
                         f"{expected['global_batch']} samples, rates "
                         f"{expected['linear_lr']:g} (linear) and {expected['sqrt_lr']:.3g} "
                         f"(square root), {expected['steps_per_epoch']} steps an epoch, "
                         f"E = {expected['efficiency']:.2f}, "
                         f"{expected['step_overhead_ms']:.1f} ms more a step and "
                         f"{expected['speedup_more_gpus']:g}x on {ASKED['more_gpus']} GPUs: "
                         f"overhead per step lowers the efficiency, it sets no ceiling",
                   {"answers": {key: expected[key] for key in QUESTIONS}})


def worked_example():
    """The example the notebook works through above the questions: ``WORKED``'s numbers,
    each answer with how it comes."""
    w, a = WORKED, truth(WORKED)
    return "\n".join([
        f"{w['gpus']} GPUs, --batch-size {w['batch_size']}, --accumulate {w['accumulate']}: a "
        f"step uses {w['batch_size']} x {w['gpus']} x {w['accumulate']} = {a['global_batch']} "
        f"samples.",
        f"{w['lr']} tuned at global batch {w['lr_ref_batch']}, now {w['large_batch']}: k = "
        f"{w['large_batch'] // w['lr_ref_batch']}; linear rule {w['lr']} x k = "
        f"{a['linear_lr']:g}; square-root rule {w['lr']} x sqrt(k) = {a['sqrt_lr']:g}.",
        f"{w['samples']:,} samples on {w['gpus']} ranks, batch {w['batch_size']}: "
        f"ceil({w['samples']:,} / {w['gpus']}) = {-(-w['samples'] // w['gpus']):,} samples "
        f"each, ceil of that / {w['batch_size']} = {a['steps_per_epoch']} steps an epoch.",
        f"{w['speedup']:g}x on {w['gpus']} GPUs: E = {w['speedup']:g}/{w['gpus']} = "
        f"{a['efficiency']:g}; a {w['step_ms']:g} ms step alone took {w['step_ms']:g}/"
        f"{a['efficiency']:g} = {w['step_ms'] / a['efficiency']:g} ms among them, "
        f"{a['step_overhead_ms']:g} ms more; with that overhead per step on {w['more_gpus']} "
        f"GPUs, S = {a['efficiency']:g} x {w['more_gpus']} = {a['speedup_more_gpus']:g}x."])


def questions():
    """The questions, one a line, by the names the answer cell uses."""
    return "\n".join(f"{name}: {question}" for name, question in QUESTIONS.items())


def solution():
    return truth()


def shown():
    return "\n".join(f"{key!r}: {value!r},  # {WHY[key]}" for key, value in truth().items())


register(Exercise("self_check", "08_looking_back", "the day's arithmetic, checked",
                  writes="my_answers: seven numbers worked out from the day's rules",
                  check=check, stub=lambda: dict.fromkeys(QUESTIONS), solution=solution,
                  shown=shown, stub_reason="answer every question",
                  earlier_runs=lambda **_: [truth(WORKED)]))
