"""Mixed precision for the training scripts' ``--amp off|bf16|fp16`` (notebook 05).

- ``bf16``: ``torch.autocast`` runs matrix multiplications and convolutions in bfloat16,
  which has float32's range: no loss scaling needed. Tensor Cores on GPUs since Ampere;
  on a CPU it depends on the processor.
- ``fp16``: autocast to float16 plus a gradient scaler. float16's small range underflows
  small gradients to zero, so the loss is multiplied by a large factor before backward and
  the gradients divided by it before the step; a step whose gradients overflowed is
  skipped and the factor lowered. ``torch.amp.GradScaler`` is the modern replacement for
  NVIDIA Apex's ``amp``.
- ``off``: plain float32.

Parameters, optimizer state and the master copy of the weights stay in float32 in every
mode: autocast changes the precision of the operations, not of the model.
"""
import contextlib

import torch

AMP_CHOICES = ("off", "bf16", "fp16")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    """How a training step runs its forward pass and applies its gradients."""

    def __init__(self, amp="off", device="cpu"):
        if amp not in AMP_CHOICES:
            raise ValueError(f"amp is one of {AMP_CHOICES}, got {amp!r}")
        self.amp, self.device_type = amp, torch.device(device).type
        self.scaler = torch.amp.GradScaler(self.device_type, enabled=amp == "fp16")

    def autocast(self):
        """The forward pass's context: autocast to bf16/fp16, or nothing for fp32."""
        if self.amp == "off":
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=DTYPES[self.amp])

    def backward(self, loss):
        """backward() of the (scaled, with fp16) loss."""
        self.scaler.scale(loss).backward()

    def step(self, optimizer):
        """optimizer.step(), unscaling first (and skipping an overflowed step) with fp16.
        Returns whether the optimizer stepped: the learning-rate schedule counts only the
        steps taken (a schedule stepped after a skipped step would run ahead of the
        optimizer, and PyTorch warns when that happens before the first real step)."""
        if not self.scaler.is_enabled():
            self.scaler.step(optimizer)  # disabled: optimizer.step() itself
            return True
        scale = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        # update() lowers the scale exactly when the gradients overflowed and the step was
        # skipped (it raises it only after many good steps). Reading the scale waits for
        # the GPU, as scaler.step() already did to learn whether they overflowed.
        return self.scaler.get_scale() >= scale

    def state_dict(self):
        return self.scaler.state_dict()

    def load_state_dict(self, state):
        if state:
            self.scaler.load_state_dict(state)


PLAIN = Precision("off")  # float32, no scaler: what a step does without --amp
