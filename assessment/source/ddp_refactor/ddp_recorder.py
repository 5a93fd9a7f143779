"""The grader inside every rank: run the learner's script unchanged and record what it does.

``ddp_checks.launch`` makes this file every process's entry point:

    torchrun ... ddp_recorder.py SETTINGS_JSON  (EVIDENCE_DIR, OUT_DIR, SCRIPT, its flags)

Each patcher records one thing and returns the function that undoes it; they live in rooms
beside this file, by what they record (read this file first, then the room you need):

- ``ddp_recorder_data.py``: ``digits_data.load_data`` (or the data module
  DDP_RECORDER_DATA_MODULE names): which datasets are the training and the validation
  set; four methods of torch's DataLoader iterators (three private): the sample indices of
  every batch that a DataLoader over those sets hands out, and how long each pass over the
  training set took (pinned by the assessment's fast tests at the torch version in use);
- ``ddp_recorder_steps.py``: a global forward pre-hook: the modules called, the model
  among them; ``torch.optim.Optimizer.__init__``: the optimizers created; global optimizer
  step hooks: the learning rate of every step and the training batches it consumed (those
  handed out since the previous step); at the first step the model and the process group;
  and before every ``SEGMENT_STEPS``-th step (the first included) the model's parameters
  and the optimizer's state;
- ``ddp_recorder_outputs.py``: ``torch.save``, ``open`` and ``os.replace`` /
  ``os.rename``: the files written, and what was saved in ``OUT_DIR``, by path or through a
  file object, directly or through a temporary file renamed into place; ``sys.stdout`` and
  ``sys.stderr``: the lines printed (``logging`` writes to stderr).

When the script returns, each rank writes its steps (``steps_file``); rank 0 replays every
optimizer step of the job in one process, segment by segment (``replay_steps``, in
``ddp_recorder_replay.py``), and each rank writes its record, ``rank<RANK>.json``, into
EVIDENCE_DIR (``Recorder.record``, below). The ``check_*`` functions of ``ddp_checks``
judge the requirements from the records of all ranks.

Your copy of this file, and of each room, is replaced by the instructor's when your work is
graded.
"""
import base64
import copy
import importlib.util
import io
import json
import os
import re
import runpy
import sys
import traceback
from pathlib import Path

# torch is imported inside the functions that use it: importing it takes seconds, and
# main() first writes the pid file by which the launcher stops a job that runs too long.


def _room(name):
    """The room ``name``.py beside this file, loaded by its path and registered in
    sys.modules under its name, where the rooms loaded after it find it with a plain
    import: as ``ddp_checks`` loads its rooms, and for the same reason (the tests load
    this file by its path, from source/ and from copies)."""
    spec = importlib.util.spec_from_file_location(
        name, Path(__file__).resolve().with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# In the order they import each other: each room finds the rooms it imports loaded. Each
# launch copies them all beside this file (ddp_checks_launch.RECORDER_FILES).
_room("ddp_recorder_data")  # the datasets, and the batches each DataLoader hands out
_room("ddp_recorder_steps")  # the model, and each optimizer step
_room("ddp_recorder_outputs")  # the files written and saved, the lines printed
_room("ddp_recorder_replay")  # rank 0's replay of every step

from ddp_recorder_data import (  # noqa: E402, F401 - the rooms' names, importable from here
    DATA_MODULE_ENV,
    flag_values,
    patch_dataloader_iterators,
    patch_load_data,
    short_step_size,
    with_short_last_step,
)
from ddp_recorder_outputs import (  # noqa: E402, F401
    KEPT_SAVES,
    patch_open,
    patch_rename,
    patch_torch_save,
    tee_output,
)
from ddp_recorder_replay import (  # noqa: E402, F401
    PEER_WAIT_S,
    REPLAY_MATCH,
    SHARED_CHECK_STEPS,
    StepReplay,
)
from ddp_recorder_steps import (  # noqa: E402, F401
    SEGMENT_STEPS,
    StepRecording,
    _cpu_state,
    hook_module_calls,
    hook_optimizer_steps,
    patch_optimizer_init,
    steps_file,
)

# A line of the per-epoch table: val_loss or val_acc given a value ("val_acc 0.93",
# "val_acc=0.93", '"val_acc": 0.93', "val_acc: tensor(0.93)"), on stdout or stderr.
METRIC_LINE = re.compile(r"val_(acc|loss)\b[\"']?\s*[:=]?\s*(tensor\()?[-+]?(\d|nan|inf)",
                         re.I)


def record_file(evidence_dir, rank):
    return Path(evidence_dir) / f"rank{rank}.json"


PATCHERS = (patch_load_data, patch_dataloader_iterators, hook_module_calls,
            patch_optimizer_init, hook_optimizer_steps, patch_torch_save, patch_rename,
            patch_open, tee_output)


# --------------------------------------------------------------------------------------
# The recorder: what one rank did.
# --------------------------------------------------------------------------------------

class Recorder(StepRecording, StepReplay):
    """What one rank did: its patchers installed while the script runs, then its record.
    Recording the steps (``StepRecording``) and rank 0's replay (``StepReplay``) are in
    rooms of their own."""

    def __init__(self, rank, world_size, evidence_dir, out_dir, script):
        import torch

        self.rank, self.world_size = rank, world_size
        self.evidence_dir, self.out_dir = Path(evidence_dir), Path(out_dir).resolve()
        self.script = Path(script)
        self._save = torch.save  # the original: records are not the script's writes
        self.recording = True
        self.splits = {}  # id(dataset) -> "train" / "val"
        self.train_set = self.val_set = None
        self.script_args = []
        self.passes = []  # {"split", "batches", "seconds"} per DataLoader pass, in order
        self.handed_out = []  # training batches handed to the script since the last step
        self.step_batches = []  # the training batches of each step
        self.modules = {}  # every module called, by id: the model is among them
        self.optimizers = []
        self.optimizer = None  # the one that steps first
        self.process_group_size = None  # at the first step
        self.lrs = []  # each step's learning rate, per parameter group
        self.steps = 0
        self.first_steps = None  # the model's parameter groups at the first step, or a problem
        self.snapshots = []  # (step, parameters, optimizer state) every SEGMENT_STEPS steps
        self.model = None  # the model found at the first step
        self.saves = []  # [path, bytes] of the last KEPT_SAVES torch.save calls to a file
        self.writes = []
        self.stdout = []
        self.stderr = []
        self.error = None
        self._undo = []

    def install(self):
        folder = str(self.script.resolve().parent)
        sys.path.insert(0, folder)  # digits_data, found where the script finds it
        self._undo.append(lambda: folder in sys.path and sys.path.remove(folder))
        for patch in PATCHERS:
            self._undo.append(patch(self))

    def uninstall(self):
        self.recording = False
        while self._undo:
            self._undo.pop()()

    def run(self, script_args):
        """Run the script as ``python SCRIPT ARGS`` would, recording; never raises."""
        self.script_args = list(script_args)
        argv = sys.argv
        try:
            self.install()
            sys.argv = [str(self.script), *script_args]
            runpy.run_path(str(self.script), run_name="__main__")
        except SystemExit as stop:
            if stop.code not in (None, 0):
                # Why it exited is its last line on stderr (argparse's error, for one).
                said = next((line.strip() for line in reversed(self.stderr) if line.strip()),
                            "")
                self.error = {"type": "SystemExit", "where": "sys.exit",
                              "message": f"exit status {stop.code}"
                              + (f", its last line on stderr: {said[:300]}" if said else "")}
        except BaseException as error:  # noqa: B036 - a KeyboardInterrupt is a failure too
            traceback.print_exc()
            self.error = self.describe(error)
        finally:
            sys.argv = argv
            self.uninstall()
            self.save_steps()

    def describe(self, error):
        frames = traceback.extract_tb(error.__traceback__)
        mine = [f for f in frames if Path(f.filename).name == self.script.name]
        frame = (mine or frames or [None])[-1]
        where = (f"{Path(frame.filename).name} line {frame.lineno}, in {frame.name}: "
                 f"{(frame.line or '').strip()}") if frame else "unknown place"
        message = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
        return {"type": type(error).__name__, "message": message, "where": where}

    # -- the record ----------------------------------------------------------------------

    def evaluate(self, model):
        """Loss and correctness of every validation sample under this rank's model."""
        import torch
        import torch.nn.functional as F

        if self.val_set is None:
            return {"error": "load_data() was not called."}
        x, y = self.val_set.tensors
        device = next(model.parameters()).device
        model.eval()
        losses, correct = [], []
        try:
            with torch.no_grad():
                for start in range(0, len(y), 512):
                    logits = model(x[start:start + 512].to(device)).float()
                    target = y[start:start + 512].to(device)
                    losses += F.cross_entropy(logits, target, reduction="none").tolist()
                    correct += (logits.argmax(dim=1) == target).int().tolist()
        except Exception as error:
            return {"error": f"the model does not accept a batch of validation samples "
                             f"({type(error).__name__}: {error})."}
        return {"loss": losses, "correct": correct}

    def check_checkpoint(self, model):
        """Whether the last thing saved into OUT_DIR (by path, through a file object, or
        under a temporary name renamed into OUT_DIR) loads into the plain model and holds
        its final parameters. What was saved may be a dict holding the state dict, the
        state dict itself, or the module."""
        import torch

        saves = [data for path, data in self.saves if Path(path).is_relative_to(self.out_dir)]
        if not saves:
            return {"saved": False}
        result = {"saved": True, "loads": False, "matches_final": False, "problem": ""}
        try:
            saved = torch.load(io.BytesIO(saves[-1]), map_location="cpu",
                               weights_only=False)
        except Exception as error:
            result["problem"] = f"torch.load fails ({type(error).__name__}: {error})."
            return result
        state = None
        if isinstance(saved, torch.nn.Module):
            saved = saved.state_dict()
        if isinstance(saved, dict):
            state = next((saved[k] for k in ("model", "model_state_dict", "state_dict")
                          if isinstance(saved.get(k), dict)), None)
            if state is None and saved and all(isinstance(v, torch.Tensor)
                                               for v in saved.values()):
                state = saved
        if state is None:
            result["problem"] = ("it holds no state dict (expected a dict with the model's "
                                 "state_dict under 'model').")
            return result
        plain = copy.deepcopy(model).cpu()
        try:
            plain.load_state_dict(state)
        except Exception as error:
            first = str(error).strip().splitlines()
            result["problem"] = " ".join(line.strip() for line in first[:3])[:400]
            return result
        result["loads"] = True
        final = _cpu_state(model)
        result["matches_final"] = all(torch.equal(final[k], v.detach().cpu())
                                      for k, v in plain.state_dict().items())
        return result

    def record(self):
        """This rank's record, as JSON-ready data."""
        record = {
            "rank": self.rank,
            "error": self.error,
            "data_loaded": self.train_set is not None,
            "n_train": len(self.train_set) if self.train_set is not None else 0,
            "passes": self.passes,
            "process_group_size": self.process_group_size,
            "lrs": [max(step) for step in self.lrs],
            "writes": sorted(set(self.writes)),
            "metric_lines": [line for line in self.stdout if METRIC_LINE.search(line)][:20],
            "stderr_metric_lines": [line for line in self.stderr
                                    if METRIC_LINE.search(line)][:20],
            "stdout": self.stdout[-50:],
            "model": {"found": False},
            "val_eval": {"error": "no model was found."},
            "checkpoint": {"saved": False},
        }
        model, problem = self.find_model()
        if model is None:
            record["model"]["problem"] = problem
            return record
        record["model"] = {"found": True, "params_b64": _params_b64(model)}
        record["val_eval"] = self.evaluate(model)
        record["checkpoint"] = self.check_checkpoint(model)
        if self.rank == 0 and self.error is None:
            record["replay"] = (self.replay_steps() if self.model is not None
                                else {"problem": (self.first_steps or {}).get(
                                    "problem", "the script made no optimizer step.")})
        return record


def _params_b64(model):
    import torch

    state = model.state_dict()
    flat = torch.cat([state[k].detach().float().cpu().flatten() for k in sorted(state)])
    return base64.b64encode(flat.numpy().astype("float32").tobytes()).decode()


def main(evidence_dir, out_dir, script, *script_args):
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    evidence_dir = Path(evidence_dir)
    # First of all: the launcher kills this pid's group if the job outlives its time.
    (evidence_dir / f"pid.{rank}").write_text(str(os.getpid()))
    recorder = Recorder(rank, world_size, evidence_dir, out_dir, script)
    recorder.run(script_args)
    try:
        record = recorder.record()
    except Exception as error:  # the record must be written whatever the script did
        record = {"rank": rank, "data_loaded": recorder.train_set is not None,
                  "error": recorder.error or {
                      "type": type(error).__name__, "where": "ddp_recorder",
                      "message": f"the grader could not inspect the model: {error}"}}
    path = record_file(evidence_dir, rank)
    partial = path.with_name(path.name + ".part")
    partial.write_text(json.dumps(record))
    os.replace(partial, path)
    return 1 if recorder.error else 0


if __name__ == "__main__":
    # The launcher's settings come in a file of the job's private folder, not on the command
    # line, which every account on the machine can read: the graded run's flags are hidden.
    if len(sys.argv) != 2:
        sys.exit(f"usage: {Path(__file__).name} SETTINGS_JSON (evidence_dir, out_dir, "
                 f"script, args: the script's sys.argv[1:])")
    settings = json.loads(Path(sys.argv[1]).read_text())
    status = main(settings["evidence_dir"], settings["out_dir"], settings["script"],
                  *settings["args"])
    # The record is written: leave without Python's shutdown. A gloo group's worker
    # threads outlive destroy_process_group once DDP has used it (torch 2.14), and one that
    # drops a tensor while Python shuts down aborts the process (PyTorch issue 190489): the
    # job would fail, and the learner be marked down, after the script did all its work.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
