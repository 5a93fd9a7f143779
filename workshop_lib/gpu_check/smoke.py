"""``python -m workshop_lib.gpu_check --smoke``: what one GPU can check of the course, in
a few minutes, with torch alone installed.

Steps (issue 20's items in brackets), each a subprocess under its own time limit: the CUDA
device's facts; ``doctor``; ``equivalence`` under a 1-rank torchrun on CUDA, SyncBatchNorm
included [1]; notebook 02's reference conversion script under a 1-rank torchrun [2]; the
profiler trace on CUDA, keeping the trace file, with the GPU's idle share of a step [3];
the GPU profile's samples/s against the batch per device (notebook 05's knee) and, at its
batch, fp32 and bf16 each NCHW and channels_last; notebook 07's parts on one rank
(torch.compile and FSDP2 judged the same as eager DDP); the bench with one process; a
one-rank DDP job and an NCCL collective timeout through the course's launcher (the watchdog
must end the stuck rank within its timeout and 30 s, naming the collective); the largest
batch with and without gradient checkpointing, and whether it is the search's cap [9];
training runs in fp32, fp16 (no lr_scheduler warning on stderr [10]), bf16 and with
gradient checkpointing, each with its peak GPU memory; the one-GPU tests of
``tests/test_gpu.py`` (where pytest is installed).

Without a GPU PyTorch can use the smoke refuses to run, in one line: a smoke that skips
its GPU steps checks nothing. ``--cpu-rehearsal`` runs it on the CPU anyway, every step
that can run there (``doctor``, the equivalence without SyncBatchNorm, the conversion, the
trace, the speed probe at the CPU profile's sizes, 07's parts but torch.compile, the
bench, the training runs), to check an image before its GPUs are at hand; the others are
skipped, and say so.
"""
import json
import math
import re
from pathlib import Path

from workshop_lib.gpu_check import library, notebook_parts
from workshop_lib.gpu_check.environment import importable
from workshop_lib.gpu_check.report import FAIL
from workshop_lib.gpu_check.steps import Step, from_process

DEADLINE_S = 540  # the whole smoke; the 5-minute target is the expected time, this the most


def _mib(value):
    return "n/a" if value is None else f"{value:.1f} MiB"


def _saved(record):
    saved = record.get("saved_activation_bytes")
    return _mib(None if saved is None else saved / 2**20)


def cuda_info(context, limit):
    out = context.folder("cuda-info") / "cuda_info.json"

    def read(finished):
        info = library.read_json(out)
        figures = [f"cuda:{i} {d['name']}, {d['memory_gib']} GiB, compute capability "
                   f"{d['capability']}" for i, d in enumerate(info["devices"])]
        figures.append(f"torch {info['torch']}, CUDA {info['cuda']}, NCCL {info['nccl']}, "
                       f"bf16 {'yes' if info['bf16'] else 'no'}, TF32 for cuDNN "
                       f"{info['tf32_cudnn']}, for matmul {info['tf32_matmul']}")
        return figures, info, None

    finished = context.command("cuda-info", ["-m", "workshop_lib.gpu_check.probes",
                                             "cuda-info", "--out", out], limit)
    return from_process("CUDA device", finished, context, read)


def doctor(context, limit):
    def read(finished):
        lines = [line for line in finished.stdout.splitlines() if line.strip()]
        return lines[:4], {"lines": lines}, None if lines else "doctor printed nothing"

    return from_process("doctor", context.command("doctor", library.doctor(), limit),
                        context, read)


def equivalence(context, limit):
    out = context.folder("equivalence") / "equivalence.json"

    def read(finished):
        result = library.read_json(out)
        differences = result["max_abs_difference"]
        figures = [f"largest parameter difference, 1 rank against one process, {variant}: "
                   f"{value:.3g}" for variant, value in differences.items()]
        figures.append(f"TF32 during the comparisons: {'on' if result.get('tf32') else 'off'}")
        reduces = result.get("accumulation", {}).get("all_reduces")
        if reduces:
            figures.append("gradient all-reduces per accumulated step: "
                           + ", ".join(f"{k} {v}" for k, v in reduces.items()))
        problem = None if "sync_batchnorm" in differences or not context.cuda else (
            "the result has no sync_batchnorm comparison, which runs on CUDA only")
        return figures, result, problem

    finished = context.command("equivalence", library.torchrun(
        1, *library.equivalence(out, device=context.device)), limit)
    return from_process("equivalence, 1 rank on CUDA [item 1]", finished, context, read)


def conversion(context, limit):
    out = context.folder("conversion")

    def read(finished):
        record = library.last_conversion_record(out)
        if record is None:
            return [], {}, "the script wrote no epoch to log.jsonl"
        figures = [f"epoch {record['epoch']}: val_acc {record['val_acc']:.4f} (the lab's "
                   f"target: {library.CONVERSION_TARGET})"]
        problem = None if record["val_acc"] >= library.CONVERSION_TARGET else (
            f"val_acc {record['val_acc']:.4f} is below the lab's target "
            f"{library.CONVERSION_TARGET}")
        return figures, record, problem

    finished = context.command("conversion", library.torchrun(1, *library.conversion(out)),
                               limit)
    return from_process("conversion reference, 1 rank on CUDA [item 2]", finished, context,
                        read)


def trace_events(path, prefix):
    """Counts of the events in a Kineto trace that the trace reader depends on: the step
    spans on the CPU (``user_annotation``) and their GPU mirrors (``gpu_user_annotation``),
    kernels, and NCCL kernels."""
    events = json.loads(Path(path).read_text()).get("traceEvents", [])
    spans = [e for e in events if str(e.get("name", "")).startswith(prefix)]
    return {"step_spans_user_annotation": sum(e.get("cat") == "user_annotation" for e in spans),
            "step_spans_gpu_user_annotation":
                sum(e.get("cat") == "gpu_user_annotation" for e in spans),
            "kernels": sum(e.get("cat") == "kernel" for e in events),
            "nccl_kernels": sum(e.get("cat") == "kernel" and "nccl" in str(e.get("name")).lower()
                                for e in events),
            "events": len(events)}


def trace(context, limit):
    out = context.folder("trace")

    def read(finished):
        figures, values = [], {}
        path = out / "trace_rank0.json"
        if path.is_file():  # written before it is read: kept even when the reading fails
            counts = trace_events(path, library.trace_step_prefix())
            values["events"] = counts
            figures.append(f"trace kept: {path.relative_to(context.out)} "
                           f"({path.stat().st_size / 2**20:.1f} MiB, {counts['events']} events)")
            figures.append(f"step spans: {counts['step_spans_user_annotation']} on the CPU "
                           f"(user_annotation), {counts['step_spans_gpu_user_annotation']} "
                           f"mirrored on the GPU (gpu_user_annotation); kernels "
                           f"{counts['kernels']}, NCCL kernels {counts['nccl_kernels']}")
        summary_path = out / "summary.json"
        if summary_path.is_file():
            rank = library.read_json(summary_path)["ranks"][0]
            median = rank["median"]
            values["median"] = median
            figures.append(f"median step: measured {median['measured_ms']:.2f} ms, compute "
                           f"{median['compute_ms']:.2f} ms, communication "
                           f"{median['communication_ms']:.2f} ms; unprofiled "
                           f"{rank['unprofiled_step_ms']:.2f} ms")
            if median.get("gpu_idle_ms") is not None:  # the profile's aim: at most 20%
                figures.append(f"the GPU idle {median['gpu_idle_ms']:.2f} ms of the "
                               f"{median['step_ms']:.2f} ms step "
                               f"({median['gpu_idle_ms'] / median['step_ms']:.0%}; a GPU "
                               f"profile that keeps the GPU busy leaves it idle at most 20%)")
        problem = None if summary_path.is_file() else "no summary.json written"
        return figures, values, problem

    finished = context.command("trace", library.torchrun(
        1, *library.trace(out, device=context.device)), limit)
    return from_process("trace on CUDA, 1 rank [item 3]", finished, context, read)


def largest_batch(context, limit):
    out = context.folder("largest-batch") / "largest_batch.json"

    def read(finished):
        rows = library.read_json(out)
        figures = [f"{r['model']} on {r['dataset']}'s image size, grad checkpointing "
                   f"{'on' if r['grad_checkpointing'] else 'off'}: "
                   + (f"{r['largest_batch']}" if r["largest_batch"] else "nothing fits")
                   + (f" = the search's cap ({r['cap']}): capped, not the memory's limit"
                      if r["capped"] else " (below the cap: the memory's limit)")
                   + f"; {r['seconds']:.0f} s" for r in rows]
        return figures, {"rows": rows}, None

    finished = context.command("largest-batch", ["-m", "workshop_lib.gpu_check.probes",
                                                 "largest-batch", "--out", out], limit)
    return from_process("largest batch, with and without checkpointing [item 9]", finished,
                        context, read)


def training_run(name, tag, flags, check_stderr=False):
    """A step: one training run on the GPU with ``flags``, its accuracy and peak memory."""

    def run(context, limit):
        out = context.folder(tag)

        def read(finished):
            final = library.final_record(out)
            figures = [f"val_acc {final['val_acc']:.4f} after {final['epoch']} epochs; peak "
                       f"GPU memory {_mib(final.get('peak_memory_mib'))}; saved for backward "
                       f"per step {_saved(final)}"]
            values = dict(final)
            baseline = context.results.get(FP32_RUN)
            if tag != "run-fp32" and baseline is not None and baseline.values:
                figures.append(f"fp32 without checkpointing: peak "
                               f"{_mib(baseline.values.get('peak_memory_mib'))}, saved "
                               f"{_saved(baseline.values)}")
            problem = None
            if check_stderr:
                scale = library.grad_scaler_scale(out)
                values["grad_scaler_scale"] = scale
                if scale is not None:
                    skipped = max(0, round(math.log2(library.GRAD_SCALER_INIT_SCALE / scale)))
                    figures.append(f"GradScaler scale {scale:g} at the end (from "
                                   f"{library.GRAD_SCALER_INIT_SCALE:g}): at least {skipped} "
                                   f"step(s) skipped for overflow"
                                   + ("" if skipped else "; no skipped step, so the "
                                      "warning check below had nothing to catch"))
                warnings = [line for line in finished.stderr.splitlines()
                            if library.LR_SCHEDULER_WARNING in line]
                figures.append(f"lr_scheduler warning on stderr: "
                               f"{'YES' if warnings else 'none'}")
                if warnings:
                    problem = f"stderr holds PyTorch's warning: {warnings[0].strip()[:300]}"
            return figures, values, problem

        finished = context.command(tag, library.train(out, *flags, device=context.device),
                                   limit)
        return from_process(name, finished, context, read)

    return run


PYTEST_SUMMARY = re.compile(r"\d+ (passed|failed|skipped|deselected|errors?)\b.* in [\d.]+s")


def pytest_figures(finished):
    """pytest's closing summary ("3 passed, 5 skipped in 41.2s") and its FAILED lines."""
    lines = [line for line in finished.stdout.splitlines() if line.strip()]
    summary = next((line.strip("= ") for line in reversed(lines) if PYTEST_SUMMARY.search(line)),
                   lines[-1] if lines else "no output")
    failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    return [summary, *failed[:10]], {"summary": summary, "failed": failed}, None


def pytest_outcome(name, finished, context):
    """A pytest run's Outcome; a failed one names its summary and first failed test."""
    if finished.returncode == 5:  # pytest: every test deselected or skipped, none failed
        finished.returncode = 0
    outcome = from_process(name, finished, context, pytest_figures)
    if outcome.status == FAIL and not finished.timed_out and outcome.values:
        first = outcome.values["failed"][:1]
        outcome.reason = "; ".join([outcome.values["summary"], *first])
    return outcome


def gpu_tests(context, limit):
    finished = context.command("gpu-tests", library.gpu_tests(), limit)
    return pytest_outcome("one-GPU tests (pytest -m gpu)", finished, context)


def _needs_pytest(context):
    return None if importable("pytest") else "pytest is not installed here"


def _needs_bf16(context):
    info = context.results.get(CUDA_INFO)
    if info is not None and info.values and not info.values.get("bf16", True):
        return "this GPU has no bf16 (torch.cuda.is_bf16_supported() is False)"
    return None


CUDA_INFO, FP32_RUN = "CUDA device", "fp32 run"


def steps():
    return [
        Step(CUDA_INFO, "the GPU, CUDA, NCCL, bf16 and TF32 as torch sees them", 60, cuda_info),
        Step("doctor", "`python -m workshop_lib doctor`, what a learner runs first", 60, doctor,
             needs_cuda=False),
        Step("equivalence, 1 rank on CUDA [item 1]",
             "SyncBatchNorm against one process: revert_sync_batchnorm is not in torch", 120,
             equivalence, rehearses=True),
        Step("conversion reference, 1 rank on CUDA [item 2]",
             "notebook 02's reference script: torch.stack of CUDA sums with a CPU count", 120,
             conversion, rehearses=True),
        Step("trace on CUDA, 1 rank [item 3]",
             "the profiler trace on a GPU: mirrored gpu_user_annotation step spans", 150, trace,
             rehearses=True),
        Step("the profile's speed: the knee, precision and layout",
             "samples/s against the batch per device, fp32/bf16 x NCHW/channels_last and the "
             "input feed at the profile's batch: whether the GPU profile keeps this GPU busy",
             150, notebook_parts.speed, rehearses=True),
        Step("notebook 07's parts, 1 rank",
             "all-reduce, the ways of averaging, ZeRO-1, comm hooks, FSDP2 and torch.compile "
             "of DDP on one NCCL rank: compiled and FSDP the same as eager DDP", 180,
             notebook_parts.inside_ddp, rehearses=True),
        Step("the bench, 1 process", "notebook 02's bench on one GPU: loop overhead, data "
             "path, precision and checkpointing", 180, notebook_parts.bench, rehearses=True),
        Step("largest batch, with and without checkpointing [item 9]",
             "memory.largest_batch, and whether its answer is the search's cap", 180,
             largest_batch),
        Step(FP32_RUN, "a one-GPU training run in fp32: the memory baseline", 90,
             training_run(FP32_RUN, "run-fp32", []), rehearses=True),
        Step("fp16 run [item 10]", "fp16 with a GradScaler: no lr_scheduler warning on stderr",
             90, training_run("fp16 run [item 10]", "run-fp16", ["--amp", "fp16"],
                              check_stderr=True)),
        Step("bf16 run", "bf16 autocast on the GPU, with its peak memory", 90,
             training_run("bf16 run", "run-bf16", ["--amp", "bf16"]), skip=_needs_bf16,
             rehearses=True),
        Step("grad checkpointing run", "gradient checkpointing, with its peak memory", 90,
             training_run("grad checkpointing run", "run-checkpointing",
                          ["--grad-checkpointing"]), rehearses=True),
        Step("the launcher on NCCL: a DDP job, a collective timeout",
             "workshop_lib.launch on one NCCL rank: a one-epoch job, then an all-reduce that "
             "cannot finish in its 5 s timeout, ended by the watchdog within 30 s more", 240,
             notebook_parts.launcher),
        Step("one-GPU tests (pytest -m gpu)",
             "tests/test_gpu.py on one GPU (the 2-GPU tests skip, saying so)", 240, gpu_tests,
             skip=_needs_pytest),
    ]
