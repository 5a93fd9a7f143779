"""Notebook 06, "Ask SLURM for two nodes": the learner writes a batch script's header.

The course's ``deploy/train_ddp.sbatch`` runs one torchrun agent per node (``srun``), and
each agent starts one process per GPU. The learner writes the ``#SBATCH`` lines that ask
for 3 nodes with 8 GPUs each and 4 CPU cores per GPU for it: a shape the script's own
usage lines, printed just above the exercise, do not hold (those are refused), and whose
CPUs are a number to work out: one task per node runs all the node's ranks, so its
``--cpus-per-task`` is the node's CPUs. The check reads the lines as ``sbatch`` does (the
same option names, short forms and ``=`` or space; only the lines before the script's
first command; the last of a repeated option) and says what the allocation would be.
Options it does not judge (``--mem``, ``--account``, ``--exclusive``, ...) are accepted as
they are; one that looks like a misspelt option it judges is not.
"""
import difflib
import re
import shlex
from pathlib import Path

from workshop_lib.labs import Exercise, Verdict, register

NODES, GPUS_PER_NODE, CPUS_PER_GPU = 3, 8, 4
COURSE_SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "train_ddp.sbatch"
# The options the check judges: sbatch's long name -> its short form, if any.
JUDGED = {"--nodes": "-N", "--ntasks": "-n", "--ntasks-per-node": None, "--gpus": "-G",
          "--gpus-per-node": None, "--gpus-per-task": None, "--gres": None, "--time": "-t",
          "--cpus-per-task": "-c"}
SHORT = {short: long for long, short in JUDGED.items() if short}
# sbatch's other options (from its manual), accepted as they are.
OTHERS = set("""--account --acctg-freq --array --batch --bb --bbf --begin --chdir
--cluster-constraint --clusters --comment --constraint --container --container-id
--contiguous --core-spec --cores-per-socket --cpu-freq --cpus-per-gpu
--deadline --delay-boot --dependency --distribution --error --exclude --exclusive --export
--export-file --extra --extra-node-info --get-user-env --gid --gpu-bind --gpu-freq
--gpus-per-socket --gres-flags --hint --hold --ignore-pbs --input --job-name
--kill-on-invalid-dep --licenses --mail-type --mail-user --mcs-label --mem --mem-bind
--mem-per-cpu --mem-per-gpu --mincpus --network --nice --no-kill --no-requeue --nodefile
--nodelist --ntasks-per-core --ntasks-per-gpu --ntasks-per-socket --open-mode --output
--overcommit --oversubscribe --parsable --partition --power --prefer --priority --profile
--propagate --qos --quiet --reboot --requeue --reservation --resv-ports --segment --signal
--sockets-per-node --spread-job --switches --test-only --thread-spec --threads-per-core
--time-min --tmp --tres-bind --tres-per-task --uid --use-min-nodes --verbose --wait
--wait-all-nodes --wckey --wrap""".split())


def header_words(text):
    """The words of the ``#SBATCH`` lines before the script's first command."""
    words = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            break  # sbatch stops reading #SBATCH lines at the first command
        if line.startswith("#SBATCH"):
            try:
                words += shlex.split(line[len("#SBATCH"):], comments=True)
            except ValueError as error:  # an unclosed quote
                raise ValueError(f"cannot read {line.strip()!r}: {error}") from None
    return words


def sbatch_options(text):
    """({judged option: value} with the last of each repeated option, [other options])."""
    words, options, others = header_words(text), {}, []
    i = 0
    while i < len(words):
        word = words[i]
        name, equals, value = word.partition("=")
        if word in SHORT or (word[:2] in SHORT and len(word) > 2):  # -N 2, -N2
            name, value = SHORT[word[:2]], word[2:]
            equals = bool(value)
        if name in JUDGED:
            if not equals:
                if i + 1 == len(words) or words[i + 1].startswith("-"):
                    raise ValueError(f"{name} needs a value, e.g. {name}=2")
                value, i = words[i + 1], i + 1
            options[name] = value
        elif word.startswith("-"):
            others.append(name)
        i += 1
    return options, others


def count(options, name):
    value = options.get(name)
    if value is None:
        return None
    if not re.fullmatch(r"\d+(-\d+)?", value):
        raise ValueError(f"{name}={value}: write a number, e.g. {name}=2")
    low, _, high = value.partition("-")
    return int(low), int(high or low)


def gpu_count(value):
    """The number in ``4``, ``a100:4`` or ``gpu:a100:4`` (sbatch's GPU specifications)."""
    match = re.fullmatch(r"(?:gpu:)?(?:[\w.-]+:)?(\d+)", value)
    if not match:
        raise ValueError(f"cannot read a GPU count from {value!r}; write e.g. 4 or a100:4")
    return int(match[1])


def gpus_per_node(options, tasks):
    """GPUs each node gets; None when only a total (--gpus) is asked for, which SLURM may
    spread unevenly over the nodes."""
    if "--gpus-per-node" in options:
        return gpu_count(options["--gpus-per-node"])
    if "--gpus-per-task" in options:
        return gpu_count(options["--gpus-per-task"]) * tasks
    if "--gres" in options:
        match = re.search(r"(?:^|,)gpu(?::[\w.-]+)?:(\d+)(?:,|$)", options["--gres"])
        return int(match[1]) if match else 0
    return None if "--gpus" in options else 0


def misspelt(others):
    """Options that look like a judged one written wrongly (``--node``, ``--gpu-per-node``)."""
    names = list(JUDGED)
    return [(name, close[0]) for name in others if name.startswith("--") and name not in OTHERS
            for close in [difflib.get_close_matches(name, names, n=1, cutoff=0.85)] if close]


def allocation(text):
    """(nodes, tasks per node, GPUs per node, problems) that this header asks for."""
    options, others = sbatch_options(text)
    problems = [f"sbatch does not know {name}: did you mean {meant}?"
                for name, meant in misspelt(others)]
    nodes = count(options, "--nodes")
    if nodes is None:
        return None, None, None, ["no #SBATCH --nodes line: ask for the nodes first"]
    low, high = nodes
    if high != low:
        problems.append(f"--nodes={options['--nodes']} lets SLURM give you {low} to {high} "
                        f"nodes: ask for exactly {NODES}")
    elif low != NODES:
        problems.append(f"{low} node(s): the job needs {NODES}")
    per_node, total = count(options, "--ntasks-per-node"), count(options, "--ntasks")
    tasks = per_node[0] if per_node else (-(-total[0] // low) if total else 1)
    if tasks != 1:
        problems.append(f"{tasks} task(s) per node: srun starts one task per node, the "
                        f"torchrun agent, and the agent starts one process per GPU")
    gpus = gpus_per_node(options, tasks)
    if gpus is None:
        problems.append(f"--gpus={options['--gpus']} is a total that SLURM may split unevenly "
                        f"(e.g. 6 + 2), but every node starts the same number of processes: "
                        f"ask per node (--gpus-per-node={GPUS_PER_NODE})")
    elif gpus != GPUS_PER_NODE:
        problems.append(f"{gpus} GPU(s) per node: ask for {GPUS_PER_NODE} "
                        f"(--gpus-per-node={GPUS_PER_NODE} or --gres=gpu:{GPUS_PER_NODE})")
    if gpus is not None:
        problems += cpu_problems(options, others, gpus)
    if "--time" not in options:
        problems.append("no --time: many clusters refuse a job without a time limit, and "
                        "others give it the partition's shortest")
    return low, tasks, gpus, problems


def cpu_problems(options, others, gpus):
    """Whether the one task of each node gets CPUS_PER_GPU cores for each of its ``gpus``
    ranks: the course script's srun passes ``--cpus-per-task`` on to the agent."""
    wanted = gpus * CPUS_PER_GPU
    if "--cpus-per-task" not in options:
        extra = (" (--cpus-per-gpu sets no SLURM_CPUS_PER_TASK, which the script's srun "
                 "passes on to the agent)" if "--cpus-per-gpu" in others else "")
        return [f"no --cpus-per-task: the job needs {CPUS_PER_GPU} CPU cores per GPU, and "
                f"the one task on each node runs all its ranks{extra}"]
    cpus = count(options, "--cpus-per-task")[0]
    if cpus < wanted:
        return [f"--cpus-per-task={cpus} gives each node's {gpus} rank(s) "
                f"{cpus / max(gpus, 1):g} core(s) each: the job needs {CPUS_PER_GPU} per "
                f"GPU, and the one task on each node runs all its ranks"]
    return []


def check(answer):
    """``answer``: the header's text, or the path of a batch script."""
    is_file = isinstance(answer, Path) or ("\n" not in str(answer) and Path(answer).is_file())
    text = Path(answer).read_text() if is_file else str(answer)
    try:
        nodes, _, gpus, problems = allocation(text)
    except ValueError as error:
        return Verdict(False, str(error))
    if problems:
        return Verdict(False, "the allocation would not fit the job: " + "; ".join(problems))
    cpus = count(sbatch_options(text)[0], "--cpus-per-task")[0]
    return Verdict(True, f"{nodes} nodes x 1 torchrun agent x {gpus} GPUs: "
                         f"{nodes * gpus} processes, world size {nodes * gpus}, "
                         f"{cpus} CPU cores per node ({cpus // gpus} per process)",
                   details={"nodes": nodes, "gpus_per_node": gpus, "cpus_per_task": cpus})


STUB = """#!/bin/bash
#SBATCH --job-name=train_ddp
#SBATCH --nodes=1
#SBATCH --time=00:30:00
"""
REFERENCE = """#!/bin/bash
#SBATCH --job-name=train_ddp
#SBATCH --nodes=3
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --time=00:30:00
"""


def printed_examples(course_script=COURSE_SCRIPT):
    """The course script's usage lines (``#   sbatch --nodes=2 ... deploy/train_ddp.sbatch``),
    which notebook 06 prints above the exercise, each moved into a header: the script's
    own ``#SBATCH`` lines, then the usage line's options (sbatch's command line wins over
    the header, as the last of a repeated option does here)."""
    text = Path(course_script).read_text()
    own = "".join(line + "\n" for line in text.splitlines() if line.startswith("#SBATCH"))
    usage = re.findall(r"^#\s+(?:\w+=\S+\s+)?sbatch\s+((?:-\S+\s+)*?(?:\\\n#\s+)?"
                       r"(?:-\S+\s+)*)", text, re.M)
    headers = []
    for flags in usage:
        options = [word for word in flags.replace("\\\n#", " ").split()
                   if word.startswith("-")]
        if options:
            headers.append("#!/bin/bash\n" + own + f"#SBATCH {' '.join(options)}\n")
    return headers


def batch_script(header, course_script):
    """A batch script to submit: ``header`` (the learner's #SBATCH lines) in place of the
    course script's own header, then the course script's commands."""
    lines = course_script.splitlines(keepends=True)
    last = max(i for i, line in enumerate(lines) if line.startswith("#SBATCH"))
    mine = [line for line in header.splitlines(keepends=True) if not line.startswith("#!")]
    return "#!/bin/bash\n" + "".join(mine).rstrip("\n") + "\n" + "".join(lines[last + 1:])


def solution(path=None):
    """The reference header; written to ``path`` when given."""
    if path:
        Path(path).write_text(REFERENCE)
    return REFERENCE


register(Exercise("sbatch_header", "06_beyond_one_machine",
                  f"ask SLURM for {NODES} nodes x {GPUS_PER_NODE} GPUs, {CPUS_PER_GPU} cores "
                  f"per GPU",
                  writes=f"my_job.sbatch: the #SBATCH lines of a {NODES}-node x "
                         f"{GPUS_PER_NODE}-GPU torchrun job",
                  check=check, stub=lambda: STUB,
                  solution=solution, stub_reason="would not fit the job",
                  # the usage lines printed above the exercise, moved into the header
                  earlier_runs=lambda **_: printed_examples()))
