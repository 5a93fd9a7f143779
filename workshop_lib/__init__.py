"""workshop_lib: the code behind the data-parallel training workshop.

Modules, one idea each:

- ``data``       datasets (registry, loaders, samplers)
- ``models``     the ``nn.Module`` s trained in the course
- ``cli``        the flags both training scripts share, and their checks
- ``scaling``    learning-rate scaling rules and warmup (notebook 03)
- ``train``      the single-device training script
- ``train_ddp``  the same script with DistributedDataParallel (notebook 02)
- ``runlog``     the JSON-lines run record every training run writes
- ``checkpoint`` atomic checkpoint files
- ``hardware``   devices, backends, process counts, thread settings
- ``doctor``     ``python -m workshop_lib doctor``: what this machine will do
"""
import os

# With the CUDA build of torch on a small CPU machine, OpenMP threads that spin while
# waiting make two intra-op threads ~10x slower than one. Passive waiting removes that
# cliff. It must be set before torch (and its OpenMP runtime) is first imported, which is
# why it lives here, in the package's first import, and why it never overrides a choice
# the user already made in the environment.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
