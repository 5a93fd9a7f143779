"""Overlap communication with backward (notebook 07, section 1): your version.

Every trainable parameter has a hook that runs the moment backward has its gradient; the
hook marks it arrived and calls ``_start_ready_groups``. Here each group is one parameter
(``plan``); section 2 makes the groups bigger. Write the three methods marked "Your code".
"""
import functools

import torch
import torch.distributed as dist

from workshop_lib.naive_ddp import NaiveDataParallel


class OverlappedDataParallel(NaiveDataParallel):
    """Notebook 02's wrapper, with each gradient's all-reduce started during backward."""

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
        """Start, in group order, each group whose gradients all arrived."""
        # Your code: while group self.next_group exists and waits for no gradient
        # (self.waiting[...] == 0), start its all-reduce (self.all_reduce), keep the Work it
        # returns in self.works, and move self.next_group on. Never start a later group
        # first: ranks pair all-reduces by the order they start them.
        raise NotImplementedError("start every ready group's all-reduce, in group order")

    def all_reduce(self, g):
        """Start summing group ``g``'s gradients over the ranks; return the ``Work``."""
        (i,) = self.groups[g]
        # Your code: an asynchronous all-reduce (async_op=True) of self.params[i].grad,
        # returning what dist.all_reduce returns.
        raise NotImplementedError("start an asynchronous all-reduce of the gradient")

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
        # Your code: wait on every Work in self.works, then unpack every group.
        raise NotImplementedError("wait for every all-reduce, then average every group")

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
