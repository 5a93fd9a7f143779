"""``nn.DataParallel`` against DDP on the same GPUs, measured in one run (notebook 05).

    python -m workshop_lib.dataparallel --out dp_vs_ddp.json     (2 GPUs or more)

``torch.nn.DataParallel`` is one process with one Python thread per GPU: every step it
copies the model from GPU 0 to the others, scatters the batch from GPU 0, gathers the
outputs back to GPU 0 (where the loss is computed) and sums the gradients on GPU 0. So
GPU 0 does more work and holds more memory than the others, and the Python interpreter
(its lock) is shared by all GPUs. DDP runs one process per GPU and all-reduces gradients
between equals. Here both train the same model at the same global batch for the same
number of steps, after warm-up: samples per second, and each GPU's peak memory.
"""
import json

import torch
import torch.nn.functional as F

from workshop_lib import cli, data, distributed, hardware, models, train_ddp
from workshop_lib.errors import CourseError, exit_cleanly_on_course_error
from workshop_lib.stopwatch import Stopwatch

WARMUP, STEPS = 3, 20


def batches(info, global_batch, device):
    """One random batch on ``device``, reused: the data path is not what is compared."""
    size = info.image_size
    return (torch.randn(global_batch, info.in_channels, size, size, device=device),
            torch.randint(0, info.num_classes, (global_batch,), device=device))


def timed_steps(model, optimizer, x, y, devices):
    def step():
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    for _ in range(WARMUP):
        step()
    with Stopwatch(*devices) as watch:
        for _ in range(STEPS):
            step()
    return watch.seconds


def peak_memory(devices):
    return [torch.cuda.max_memory_allocated(d) / 2**20 for d in devices]


def data_parallel(model_name, info, global_batch, gpus):
    devices = [torch.device("cuda", i) for i in range(gpus)]
    for d in devices:
        torch.cuda.reset_peak_memory_stats(d)
    torch.manual_seed(0)
    model = torch.nn.DataParallel(models.build(model_name, info).to(devices[0]))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    seconds = timed_steps(model, optimizer, *batches(info, global_batch, devices[0]), devices)
    return {"samples_per_s": STEPS * global_batch / seconds,
            "peak_memory_mib": peak_memory(devices)}


def ddp_rank(rank, gpus, model_name, info, global_batch, port, results):
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    torch.cuda.reset_peak_memory_stats(device)
    with distributed.process_group("nccl", device=device, init_method=f"tcp://127.0.0.1:{port}",
                                   rank=rank, world_size=gpus):
        torch.manual_seed(0)
        model = train_ddp.wrap(models.build(model_name, info).to(device), device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        seconds = timed_steps(model, optimizer, *batches(info, global_batch // gpus, device),
                              [device])
        slowest = torch.tensor([seconds], device=device)
        torch.distributed.all_reduce(slowest, op=torch.distributed.ReduceOp.MAX)
        memory = [torch.zeros(1, device=device) for _ in range(gpus)]
        torch.distributed.all_gather(memory, torch.tensor([peak_memory([device])[0]],
                                                          device=device))
        if rank == 0:
            results.put({"samples_per_s": STEPS * global_batch / slowest.item(),
                         "peak_memory_mib": [m.item() for m in memory]})


def compare(model_name, global_batch, gpus):
    """Both, one after the other, on the same ``gpus`` GPUs."""
    import torch.multiprocessing as mp

    info = data.DATASETS["fashion-mnist"]  # 28x28 images: the workshop dataset's shape
    dp = data_parallel(model_name, info, global_batch, gpus)
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    # A rank that fails ends at once and its error is raised here (distributed.spawn).
    distributed.spawn(ddp_rank, gpus, gpus, model_name, info, global_batch,
                      distributed.free_port(), results)
    ddp = results.get()
    return {"model": model_name, "global_batch": global_batch, "gpus": gpus, "steps": STEPS,
            "data_parallel": dp, "ddp": ddp,
            "speedup_ddp_over_dp": ddp["samples_per_s"] / dp["samples_per_s"],
            "gpu0_memory_over_mean_of_others": {
                name: r["peak_memory_mib"][0] / (sum(r["peak_memory_mib"][1:]) / (gpus - 1))
                for name, r in (("data_parallel", dp), ("ddp", ddp))}}


@exit_cleanly_on_course_error
def main(argv=None):
    parser = cli.ArgumentParser(prog="python -m workshop_lib.dataparallel", description=__doc__)
    parser.add_argument("--model", default="wrn-16-4", choices=list(models.MODELS))
    parser.add_argument("--batch-size", type=int, default=128, help="per GPU")
    parser.add_argument("--out", default=None, help="write the result as JSON here")
    args = parser.parse_args(argv)
    gpus = hardware.detect().gpus
    if gpus < 2:
        raise CourseError(f"DataParallel against DDP needs two GPUs or more; PyTorch sees "
                          f"{gpus} here")
    result = compare(args.model, args.batch_size * gpus, gpus)
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
