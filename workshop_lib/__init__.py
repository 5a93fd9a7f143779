"""workshop_lib: the code behind the data-parallel training workshop.

Modules, one idea each (a test keeps this list complete):

The training scripts and what they are made of
- ``train``          the single-device training script
- ``train_ddp``      the same script with DistributedDataParallel (notebook 02)
- ``ddp_compat``     DDP's options under the names the installed torch takes
- ``cli``            the flags both scripts share, and their checks
- ``data``           datasets: registry, readers, samplers, the device-resident loader
- ``shards``         datasets as WebDataset record shards, read rank by rank (notebook 06)
- ``models``         the ``nn.Module`` s trained in the course
- ``scaling``        learning-rate rules and warmup (notebook 03)
- ``optim``          SGD with momentum, and LARS
- ``precision``      ``--amp``: bf16 autocast, fp16 with a gradient scaler (notebook 05)
- ``memory``         what a step saves for backward; the GPU's peak; the largest batch
- ``metrics``        per-epoch records from summed metrics; the early stop
- ``runlog``         the JSON-lines run record every run writes, and its reader
- ``checkpoint``     training state, saved atomically, tagged with the job that wrote it
- ``files``          files written whole or not at all
- ``faults``         ``--inject-fault``: a rank that raises, dies or hangs (notebook 04)
- ``errors``         one-line errors, and error files torchrun can read

The machine, and processes
- ``hardware``       the machine description every hardware choice reads
- ``profile``        the workshop profile: where runs go, and their sizes
- ``plans``          what each notebook launches on a machine, decided without running it
- ``distributed``    joining and leaving process groups; job ids; free ports
- ``gloo_exit``      waits for gloo's threads before Python exits (registered on import)
- ``launch``         a torchrun launcher with rank-tagged output and a failure summary
- ``stacks``         each rank dumps its own Python stack on a signal: no tracer needed
- ``kernels``        notebook kernels over private Unix sockets: no port to lose or to overhear
- ``nodes``          several torchrun agents as the nodes of one job (notebook 06)
- ``sweep``          many runs in one command: one device, one per GPU, or one launch
- ``doctor``         ``python -m workshop_lib doctor``: what this machine will do

Measuring tools (below every measurement that uses them)
- ``stopwatch``      timing work honestly (synchronise, clock, work, synchronise); medians
- ``allreduce_model`` what an all-reduce costs: the timed sweep, its latency + bandwidth fit

Measurements
- ``bench``          ``python -m workshop_lib.bench``: scaling, overhead, communication
- ``trace``          ``python -m workshop_lib.trace``: where a DDP step's time goes
- ``equivalence``    ranks against one process (BatchNorm), micro-batches against one batch
- ``dataparallel``   ``nn.DataParallel`` against DDP on the same GPUs
- ``input_pipeline`` a step fed by a DataLoader against data on the device (notebook 05)
- ``throughput``     samples/s against the batch per device: the knee (notebook 05)
- ``noise_scale``    the gradient noise scale: past it a larger batch buys little (notebook 03)
- ``naive_ddp``      data parallelism from two collectives, checked against DDP
- ``uneven_inputs``  ranks with unequal batches: the hang, equal steps and ``Join`` (notebook 06)
- ``inside_ddp``     overlap, buckets and ZeRO-1, built and checked (notebook 07)

What the notebooks call
- ``notebook``       the set-up every notebook runs first
- ``findings``       the closing summaries, computed from run records
- ``labs``           the exercises and their checks (``python -m workshop_lib.labs check``)
- ``progress``       the learner's verdicts, recorded where they work and sent to the class server
- ``listeners``      who owns the socket on a port: a token goes to the class server's alone
- ``survey``         the closing survey's questions, and where the answers go (notebook 08)
- ``ddp_diff``       single-device -> DDP diffs named step by step (02's exercise; the twin scripts)
- ``sgd_toy``        gradient descent on a problem small enough to see (notebook 01)
- ``widgets``        the batch-size explorer
- ``plots``          plots of run records
- ``ddp_step``       what DDP does in one step, with torch's own buckets (02's picture)
- ``gpu_check``      ``make gpu-check``: the instructor's check of a GPU image
- ``day``            the sessions of the day: the one source of the day table
"""
import os

# With the CUDA build of torch on a small CPU machine, OpenMP threads that spin while
# waiting make two intra-op threads ~10x slower than one. Passive waiting removes that
# cliff. It must be set before torch (and its OpenMP runtime) is first imported, which is
# why it lives here, in the package's first import, and why it never overrides a choice
# the user already made in the environment.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# A process that used DDP over gloo can abort while Python shuts down (PyTorch issue
# 190489; see gloo_exit). Registered here, in the package's first import, so that every
# script that imports anything of the course is covered, a learner's included.
# A rank of a job started by workshop_lib.launch writes its own stack to a file on a signal
# (stacks.py), so a learner without ptrace rights can still see where a stuck job waits.
from workshop_lib import gloo_exit, stacks  # noqa: E402, F401

stacks.enable_from_env()
