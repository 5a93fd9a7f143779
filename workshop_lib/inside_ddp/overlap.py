"""Overlap: all-reduce each gradient while backward is still computing the others.

Notebook 07, "Inside DDP", section 1 ("Overlap communication with backward") reads this
file. Notebook 02's ``NaiveDataParallel`` waits for the whole backward pass, then
all-reduces every gradient one after the other; the network idles while the processor
computes, and the processor idles while the network sends. Backward produces the last
layer's gradients first, so their all-reduce can start while the first layers' gradients
are still being computed:

1. A hook on every trainable parameter (``register_post_accumulate_grad_hook``) runs the
   moment backward has written that parameter's ``.grad``, once per backward even when
   the parameter is used twice (tied weights: autograd sums both uses first).
2. The hook starts an asynchronous all-reduce (``async_op=True`` returns at once with a
   ``Work`` handle; the sum happens in the background).
3. ``sync_gradients()``, between ``backward()`` and ``optimizer.step()`` as in notebook 02,
   waits on every handle and divides by the world size. (DDP hides this wait in a
   callback at the end of backward; that hook is private to PyTorch, so here it is a call.)

Two rules make it correct on every rank, not just fast:

- *The same order everywhere.* Ranks pair their collectives by the order they start them,
  not by name. Hooks fire in whatever order this rank's backward runs, so they only mark
  a gradient as arrived; all-reduces start in one fixed order (reverse parameter order,
  the order backward usually produces them), each as soon as it and all before it have
  arrived.
- *A gradient that never comes.* A parameter that did not take part in this rank's
  forward (an unused branch) gets no gradient and its hook never fires. Waiting for it
  would hang; skipping it would leave the ranks with different numbers of all-reduces.
  ``sync_gradients`` therefore sends zeros for it (this rank's contribution is zero) and,
  as DDP with ``find_unused_parameters=True`` does, leaves ``.grad`` as it was (``None``
  after ``zero_grad()``) where *no* rank used the parameter, so the optimizer skips it.
  Learning which parameters were used anywhere costs one small extra all-reduce per step.

Frozen parameters (``requires_grad=False``) get no hook and are never sent. The
all-reduces here go one parameter at a time; ``buckets.py`` (section 2) groups them.
"""
import functools

import torch
import torch.distributed as dist

from workshop_lib.naive_ddp import NaiveDataParallel


class OverlappedDataParallel(NaiveDataParallel):
    """Notebook 02's wrapper (broadcast at wrap time, ``sync_gradients()`` after
    backward), with each gradient's all-reduce started from a hook during backward."""

    def __init__(self, module):
        super().__init__(module)  # every rank starts from rank 0's parameters and buffers
        self.world_size = dist.get_world_size()
        # Reverse order: backward produces the last layers' gradients first.
        self.params = [p for p in reversed(list(module.parameters())) if p.requires_grad]
        self.groups = self.plan(self.params)  # lists of indices into self.params
        self.group_of = {i: g for g, group in enumerate(self.groups) for i in group}
        for i, param in enumerate(self.params):
            param.register_post_accumulate_grad_hook(functools.partial(self._arrived, i))
        self._new_step()

    def plan(self, params):
        """What is all-reduced together, in launch order: here each parameter alone."""
        return [[i] for i in range(len(params))]

    def _new_step(self):
        self.has_grad = [False] * len(self.params)  # which hooks fired this step
        self.waiting = [len(group) for group in self.groups]  # gradients each group lacks
        self.next_group = 0  # groups before this one are on the wire
        self.works = []

    def _arrived(self, i, param):
        """The hook: parameter ``i``'s gradient is complete; start what is ready, in order."""
        if self.has_grad[i]:
            raise RuntimeError("a gradient arrived twice before sync_gradients(): call "
                               "model.sync_gradients() after every backward()")
        self.has_grad[i] = True
        self.waiting[self.group_of[i]] -= 1
        self._start_ready_groups()

    def _start_ready_groups(self):
        """Start, in group order, each group whose gradients all arrived: every rank starts
        the same all-reduces in the same order, whatever order its hooks fired in."""
        while self.next_group < len(self.groups) and self.waiting[self.next_group] == 0:
            self.works.append(self.all_reduce(self.next_group))
            self.next_group += 1

    def all_reduce(self, g):
        """Start summing group ``g``'s gradients over the ranks; return the ``Work``."""
        (i,) = self.groups[g]
        return dist.all_reduce(self.params[i].grad, async_op=True)

    def unpack(self, g):
        """After the wait: turn group ``g``'s sums into means, in ``.grad``."""
        (i,) = self.groups[g]
        self.params[i].grad /= self.world_size

    def sync_gradients(self):
        """Call between ``loss.backward()`` and ``optimizer.step()``: every gradient is the
        mean over the ranks (``None`` where no rank used the parameter) when it returns."""
        created = self._send_zeros_for_missing()
        used = torch.tensor(self.has_grad, dtype=torch.int32, device=self.params[0].device)
        self.works.append(dist.all_reduce(used, async_op=True))  # after the gradients
        self._wait_and_average()
        for i in created:
            if used[i] == 0:  # no rank used it: as DDP does, leave .grad as it was
                self.params[i].grad = None
        self._new_step()

    def _wait_and_average(self):
        """Wait for every all-reduce started this step; then make each group a mean."""
        for work in self.works:
            work.wait()
        for g in range(len(self.groups)):
            self.unpack(g)

    def _send_zeros_for_missing(self):
        """Zero gradients for parameters this rank's backward did not reach, then start
        every group still waiting. Returns the indices whose ``.grad`` was created here."""
        created = []
        for i, param in enumerate(self.params):
            if not self.has_grad[i]:
                if param.grad is None:
                    created.append(i)
                    param.grad = torch.zeros_like(param)
                else:
                    param.grad.zero_()
                self.waiting[self.group_of[i]] -= 1
        self._start_ready_groups()
        return created
