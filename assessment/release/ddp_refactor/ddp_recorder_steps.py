"""The model and its optimizer steps, as each rank records them: the modules called in
forward passes (the model among them), the optimizers created, and at every step of the
optimizer that trains the model its learning rate and the training batches it consumed;
before every SEGMENT_STEPS-th step the model's parameters and the optimizer's state.

Three patchers, each installed by ``ddp_recorder.Recorder`` and returning the function that
undoes it: a global forward pre-hook (``hook_module_calls``),
``torch.optim.Optimizer.__init__`` (``patch_optimizer_init``) and global optimizer step
hooks (``hook_optimizer_steps``). ``StepRecording`` is the part of the ``Recorder`` they
report to: it finds the model at the first step, takes the snapshots and, when the script
returns, writes this rank's steps (``steps_file``) for rank 0's replay
(``ddp_recorder_replay.py``).

Your copy of this file is replaced by the instructor's when your work is graded.
"""
import copy
import os
from pathlib import Path

# torch is imported inside the functions that use it (ddp_recorder.py says why).

# Every optimizer step is replayed, in segments of this many steps, each from the
# parameters and optimizer state the ranks held at its start: a segment is short enough
# that float32 rounding stays ~1e-5 of a step's update, and a job that stops averaging at
# any step fails the segment holding it.
SEGMENT_STEPS = 8


def steps_file(evidence_dir, rank):
    return Path(evidence_dir) / f"steps.rank{rank}.pt"


def hook_module_calls(recorder):
    """Every module called in a forward pass: the model is one of them."""
    from torch.nn.modules.module import register_module_forward_pre_hook

    def seen(module, inputs):
        recorder.modules.setdefault(id(module), module)

    return register_module_forward_pre_hook(seen).remove


def patch_optimizer_init(recorder):
    """Every optimizer created."""
    import torch

    original = torch.optim.Optimizer.__init__

    def __init__(optimizer, *args, **kwargs):
        original(optimizer, *args, **kwargs)
        recorder.optimizers.append(optimizer)

    torch.optim.Optimizer.__init__ = __init__
    return lambda: setattr(torch.optim.Optimizer, "__init__", original)


def hook_optimizer_steps(recorder):
    """The optimizer that steps first is the one that trains the model: its learning rate
    at every step, the training batches each step consumed (the batches handed out since
    the previous step: one, or several when the script accumulates gradients), and, before
    every SEGMENT_STEPS-th step, the model's parameters and the optimizer's state (taken
    before the step, so that whatever the script does to the parameters between steps is
    part of the segment that ends there)."""
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    def before(optimizer, args, kwargs):
        if recorder.optimizer is None:
            recorder.start_first_steps(optimizer)
        if optimizer is recorder.optimizer:
            if recorder.steps % SEGMENT_STEPS == 0:
                recorder.snapshot()
            recorder.lrs.append([float(group["lr"]) for group in optimizer.param_groups])
            recorder.step_batches.append(recorder.handed_out)
            recorder.handed_out = []

    def after(optimizer, args, kwargs):
        if optimizer is recorder.optimizer:
            recorder.steps += 1

    handles = [register_optimizer_step_pre_hook(before),
               register_optimizer_step_post_hook(after)]
    return lambda: [handle.remove() for handle in handles]


class StepRecording:
    """The ``Recorder``'s steps (its attributes are set in ``Recorder.__init__``): the model
    and the process group at the first step, snapshots before every SEGMENT_STEPS-th step,
    and this rank's steps written for the replay when the script returns."""

    def find_model(self):
        """``(model, problem)``: the module the script trains, called in forward passes,
        its parameters in an optimizer, and not part of a larger such module. DDP wrappers
        are skipped (their .module is the model)."""
        from torch.nn.parallel import DistributedDataParallel

        candidates = [m for m in self.modules.values()
                      if not isinstance(m, DistributedDataParallel)]
        inner = {id(sub) for m in candidates for sub in m.modules() if sub is not m}
        trained = {id(p) for o in self.optimizers for g in o.param_groups for p in g["params"]}
        roots = [m for m in candidates if id(m) not in inner
                 and any(id(p) in trained for p in m.parameters())]
        if not roots:
            return None, ("found no model that is both called in training and updated by "
                          "an optimizer.")
        return max(roots, key=lambda m: sum(p.numel() for p in m.parameters())), None

    def start_first_steps(self, optimizer):
        """At the first step: the model, the process group and the optimizer's parameter
        groups (by the model's parameter names)."""
        import torch.distributed as dist

        self.optimizer = optimizer
        self.process_group_size = (dist.get_world_size() if dist.is_available()
                                   and dist.is_initialized() else 1)
        self.model, problem = self.find_model()
        if self.model is None:
            self.first_steps = {"problem": problem}
            return
        names = {id(p): name for name, p in self.model.named_parameters()}
        groups = [[names.get(id(p)) for p in group["params"]]
                  for group in optimizer.param_groups]
        if any(name is None for group in groups for name in group):
            self.first_steps = {"problem": "the optimizer updates tensors that are not "
                                           "parameters of the model."}
            return
        self.first_steps = {"param_groups": groups}

    def snapshot(self):
        """The model's parameters and the optimizer's state now, before step self.steps."""
        if self.first_steps is None or "problem" in self.first_steps:
            return
        self.snapshots.append((self.steps, _cpu_state(self.model),
                               _to_cpu(copy.deepcopy(self.optimizer.state_dict()))))

    def save_steps(self):
        """Write this rank's steps for rank 0's replay: the parameters and optimizer state
        at each segment's start, the parameters at the end, each step's batches and
        learning rates. Atomically: rank 0 reads it as soon as it exists."""
        steps = dict(self.first_steps or {"problem": "the script made no optimizer step."})
        if "problem" not in steps:
            steps.update(steps=self.steps, snapshots=self.snapshots,
                         theta_end=_cpu_state(self.model),
                         optimizer_end=_to_cpu(self.optimizer.state_dict()),
                         batches=self.step_batches[:self.steps], lrs=self.lrs[:self.steps])
        path = steps_file(self.evidence_dir, self.rank)
        partial = path.with_name(path.name + ".part")
        self._save(steps, partial)
        os.replace(partial, path)


def _cpu_state(module):
    return {name: value.detach().to("cpu", copy=True) for name, value
            in module.state_dict().items()}


def _to_cpu(value):
    """An optimizer's state_dict with every tensor copied to the CPU."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value
