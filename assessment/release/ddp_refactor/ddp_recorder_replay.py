"""Rank 0's replay: every optimizer step of the job, replayed in one process.

When the script returns, every rank has written its steps (``ddp_recorder_steps.py``):
the parameters and optimizer state at the start of each segment of SEGMENT_STEPS steps,
the parameters at the end, each step's batches and learning rates. Rank 0 waits for all
of them and replays each segment on the CPU in float32 from the state it held at the
segment's start, each step on all ranks' batches of that step with their gradients
averaged, and compares every rank's parameters at the segment's end with the replay's.
At the first segment that does not match it also replays the two usual mistakes (the
ranks' gradients summed, each rank alone on its own batches), so that the check of
requirement 4 (``ddp_checks_gradients.py``) can name the one that matches.

``StepReplay`` is the part of the ``Recorder`` that does it (its attributes are set in
``Recorder.__init__``); the functions below it measure distances between model states.

Your copy of this file is replaced by the instructor's when your work is graded.
"""
import copy
import time

from ddp_recorder_steps import SEGMENT_STEPS, _cpu_state, _to_cpu, steps_file

# torch is imported inside the functions that use it (ddp_recorder.py says why).

SHARED_CHECK_STEPS = SEGMENT_STEPS  # at most the first epoch's steps: samples of each rank's own
PEER_WAIT_S = 30  # how long rank 0 waits for another rank's record of its steps
# A segment matches a replay on averaged gradients within this fraction of a step's update
# (ddp_checks_gradients.REPLAY_RTOL, the same bar): a correct job is ~1e-5 off, the
# mistakes ~0.3 or more.
REPLAY_MATCH = 0.02


class StepReplay:
    """The ``Recorder``'s replay, in rank 0 (its attributes are set in
    ``Recorder.__init__``)."""

    def wait_for_steps(self):
        """Every rank's steps (None for a rank that wrote none in time)."""
        import torch

        deadline = time.monotonic() + PEER_WAIT_S
        paths = [steps_file(self.evidence_dir, r) for r in range(self.world_size)]
        while not all(p.exists() for p in paths) and time.monotonic() < deadline:
            time.sleep(0.1)
        return [torch.load(p, map_location="cpu", weights_only=False) if p.exists() else None
                for p in paths]

    def replay_steps(self):
        """Replay every optimizer step of the job in this process, on the CPU in float32,
        segment by segment: each segment of SEGMENT_STEPS steps from the parameters and
        optimizer state rank 0 held at its start, each step on the ranks' batches of that
        step together (all the batches each rank was handed since its previous step, the
        mean loss over them: averaged gradients). Each rank's parameters at the segment's
        end (the next segment's start, or the end of training) are compared with the
        replay's, relative to the replay's mean update per step. At the first segment that
        does not match, two replays name the mistake: the sum of the ranks' mean losses
        (summed gradients) and, from each rank's own start, its own batches alone (local).
        Also returns how many of the samples of the first SHARED_CHECK_STEPS steps more
        than one rank trained on (then the replay cannot tell averaged gradients from ranks
        that each train alone)."""
        import torch

        ranks = self.wait_for_steps()
        for rank, steps in enumerate(ranks):
            if steps is None:
                return {"problem": f"rank {rank} recorded no optimizer step within "
                                   f"{PEER_WAIT_S} s of rank 0's end."}
            if "problem" in steps:
                return {"problem": f"rank {rank}: {steps['problem']}"}
            if steps["steps"] != ranks[0]["steps"]:
                return {"problem": f"rank {rank} made {steps['steps']} optimizer steps and "
                                   f"rank 0 {ranks[0]['steps']}: every rank must take the "
                                   f"same steps."}
            for step, batches in enumerate(steps["batches"]):
                if not batches:
                    return {"problem": f"rank {rank}'s optimizer step {step + 1} came after "
                                       f"no new batch of train_set: the grader replays each "
                                       f"step on the batches the DataLoader handed out since "
                                       f"the previous step."}
        x, y = self.train_set.tensors

        def batches(rank, step):
            """``[(inputs, targets)]``: the batches rank took for this step."""
            return [(x[b].float(), y[b]) for b in ranks[rank]["batches"][step]]

        def union(step):
            """The step on the global batch: the mean loss over all its samples."""
            inputs, targets = zip(*(b for r in range(len(ranks)) for b in batches(r, step)),
                                  strict=True)
            return [(torch.cat(inputs), torch.cat(targets), 1.0)]

        def averaged(step):
            """What DDP computes: the mean over ranks of each rank's loss, itself the mean
            of its batches' mean losses (one batch, or several accumulated, each divided
            by their number). With batches all of one size this is the union's mean."""
            sizes = {len(b) for r in range(len(ranks)) for b in ranks[r]["batches"][step]}
            if len(sizes) == 1:
                return union(step)
            return [(inputs, targets, 1.0 / (len(ranks) * len(ranks[r]["batches"][step])))
                    for r in range(len(ranks)) for inputs, targets in batches(r, step)]

        def summed(step):
            return [(inputs, targets, 1.0 / len(ranks[r]["batches"][step]))
                    for r in range(len(ranks)) for inputs, targets in batches(r, step)]

        def local(rank, step):
            return [(inputs, targets, 1.0 / len(ranks[rank]["batches"][step]))
                    for inputs, targets in batches(rank, step)]

        total = ranks[0]["steps"]
        # The samples of each rank's first steps, up to SHARED_CHECK_STEPS and within the
        # first epoch (until a rank meets a sample it trained on before).
        first_epoch = min(SHARED_CHECK_STEPS, *(_steps_before_a_repeat(steps["batches"])
                                                 for steps in ranks))
        trained_on = [{i for b in steps["batches"][:first_epoch] for batch in b
                       for i in batch} for steps in ranks]
        shared = {i for r, mine in enumerate(trained_on) for i in mine
                  if any(i in theirs for theirs in trained_on[r + 1:])}
        # Ranks that average their gradients end with the same optimizer state too (the
        # momentum follows the gradients), even where parameters averaged after a step of
        # their own would agree.
        momentum = _flat_tensors(ranks[0]["optimizer_end"])
        result = {"steps": total, "shared": len(shared), "shared_steps": first_epoch,
                  "samples": [len(mine) for mine in trained_on],
                  # Each rank's batches per step: the accumulation the script did.
                  "micro_batches": [[len(b) for b in steps["batches"]] for steps in ranks],
            "optimizer_end_gap": [_gap(_flat_tensors(steps["optimizer_end"]), momentum)
                                  for steps in ranks]}
        start = ranks[0]["snapshots"][0][1]
        starts = [_distance(steps["snapshots"][0][1], start, scale=_norm(start))
                  for steps in ranks]
        worst = [0.0] * len(ranks)
        segments = ranks[0]["snapshots"]
        replayer = self.replayer()
        try:
            for index, (first, theta, optimizer_state) in enumerate(segments):
                last = segments[index + 1][0] if index + 1 < len(segments) else total
                ends = [steps["snapshots"][index + 1][1] if index + 1 < len(segments)
                        else steps["theta_end"] for steps in ranks]
                lrs = ranks[0]["lrs"][first:last]
                theta_avg, scale = replayer(theta, optimizer_state, lrs,
                                            lambda t, f=first: averaged(f + t))
                errors = [_distance(end, theta_avg, scale=scale) for end in ends]
                if max(errors) > REPLAY_MATCH and any(
                        len(averaged(step)) > 1 for step in range(first, last)):
                    # Batches of unequal sizes: a job may weigh every sample alike instead.
                    theta_avg, scale = replayer(theta, optimizer_state, lrs,
                                                lambda t, f=first: union(f + t))
                    errors = [min(e, _distance(end, theta_avg, scale=scale))
                              for e, end in zip(errors, ends, strict=True)]
                worst = [max(w, e) for w, e in zip(worst, errors, strict=True)]
                if max(errors) <= REPLAY_MATCH:
                    continue
                theta_sum, sum_scale = replayer(theta, optimizer_state, lrs,
                                                lambda t, f=first: summed(f + t))
                mine = []
                for r, steps in enumerate(ranks):
                    _, own, own_state = steps["snapshots"][index]
                    theta_own, own_scale = replayer(own, own_state, steps["lrs"][first:last],
                                                    lambda t, f=first, r=r: local(r, f + t))
                    mine.append(_distance(ends[r], theta_own, scale=own_scale))
                result.update(segment=[first + 1, last], ranks=[{
                    "start": starts[r], "averaged": errors[r],
                    "summed": _distance(ends[r], theta_sum, scale=sum_scale),
                    "local": mine[r]} for r in range(len(ranks))])
                return result
        except Exception as error:
            return {"problem": f"the grader could not replay your training steps "
                               f"({type(error).__name__}: {error})."}
        result["ranks"] = [{"start": starts[r], "averaged": worst[r], "summed": None,
                            "local": None} for r in range(len(ranks))]
        return result

    def replayer(self):
        """``replay(theta, optimizer_state, lrs, batches_of_step) -> (state, step size)``:
        the model's state after ``len(lrs)`` steps of an optimizer of the script's class
        loaded with ``optimizer_state``, from ``theta``, and the size of one step (the
        distance moved over the number of steps); the loss of a step is the sum of
        weight x F.cross_entropy (mean) over the ``(inputs, targets, weight)`` of
        ``batches_of_step(step)``.
        One model and one optimizer serve every call: a replay of a segment loads both."""
        import torch
        import torch.nn.functional as F

        model = copy.deepcopy(self.model).to("cpu", torch.float32).train()
        parameters = dict(model.named_parameters())
        groups = [{"params": [parameters[name] for name in names]}
                  for names in self.first_steps["param_groups"]]
        lr = self.lrs[0][0] if self.lrs else 0.001
        try:
            optimizer = type(self.optimizer)(groups)
        except TypeError:  # an optimizer whose learning rate has no default
            optimizer = type(self.optimizer)(groups, lr=lr)

        def replay(theta, optimizer_state, lrs, batches_of_step):
            model.load_state_dict(theta)
            start = _flat(theta)
            # load_state_dict may keep the given tensors: give it copies, the snapshot stays.
            optimizer.load_state_dict(_to_cpu(optimizer_state))
            for step in range(len(lrs)):
                for group, lr in zip(optimizer.param_groups, lrs[step], strict=True):
                    group["lr"] = lr
                optimizer.zero_grad()
                loss = sum(weight * F.cross_entropy(model(inputs), targets)
                           for inputs, targets, weight in batches_of_step(step))
                loss.backward()
                optimizer.step()
            state = _cpu_state(model)
            return state, (_flat(state) - start).norm().item() / max(len(lrs), 1)

        return replay


def _flat(state):
    import torch

    return torch.cat([state[k].detach().double().flatten() for k in sorted(state)
                      if state[k].is_floating_point()])


def _norm(state):
    return _flat(state).norm().item()


def _distance(state, reference, scale):
    """``|state - reference| / scale``: 0 where both are equal, even at a scale of 0."""
    a, b = _flat(state), _flat(reference)
    if a.shape != b.shape:
        return float("inf")
    gap = (a - b).norm().item()
    return gap / scale if scale > 0 else (0.0 if gap == 0 else float("inf"))


def _steps_before_a_repeat(step_batches):
    """How many of a rank's first steps hold no sample twice: its first epoch's steps."""
    seen = set()
    for step, batches in enumerate(step_batches):
        samples = [i for batch in batches for i in batch]
        if seen.intersection(samples):
            return step
        seen.update(samples)
    return len(step_batches)


def _flat_tensors(value):
    """Every floating-point tensor in a nested state (an optimizer's state_dict), in one
    float64 vector, in a fixed order."""
    import torch

    found = []

    def walk(item):
        if isinstance(item, torch.Tensor):
            if item.is_floating_point():
                found.append(item.detach().double().flatten())
        elif isinstance(item, dict):
            for key in sorted(item, key=str):
                walk(item[key])
        elif isinstance(item, (list, tuple)):
            for element in item:
                walk(element)

    walk(value)
    return torch.cat(found) if found else torch.zeros(0, dtype=torch.float64)


def _gap(a, b):
    """The largest elementwise difference of two vectors, relative to 1 + |b|."""
    if a.shape != b.shape:
        return float("inf")
    return ((a - b).abs() / (1 + b.abs())).max().item() if len(a) else 0.0
