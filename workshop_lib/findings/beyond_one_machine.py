"""Notebook 06, Beyond one machine: its closing findings, computed from its runs."""
from torch.distributed.constants import default_pg_timeout

from workshop_lib import runlog
from workshop_lib.findings.base import Finding, Findings, mean, needs_ranks, skipped

SHARDS_ACCURACY_PP = 2.0  # shards and memory see the same samples in another order
SAME_RUN = 1e-6           # two launches of one job: per-epoch losses this close are equal


def shards_vs_memory(memory, shards, bar_pp=SHARDS_ACCURACY_PP):
    """The same DDP job with its data in memory and read from record shards."""
    gap_pp = 100 * (shards.final["val_acc"] - memory.final["val_acc"])
    within = abs(gap_pp) <= bar_pp
    speed = (mean(shards.column("samples_per_s")[1:] or shards.column("samples_per_s"))
             / mean(memory.column("samples_per_s")[1:] or memory.column("samples_per_s")))
    return Findings([
        Finding("shards_accuracy",
                f"From shards, validation accuracy {shards.final['val_acc']:.4f}; from memory "
                f"{memory.final['val_acc']:.4f} ({gap_pp:+.2f} pp): "
                + (f"the same learning within {bar_pp:g} pp (the shards give each epoch the "
                   f"same samples in another order)." if within else
                   f"NOT within {bar_pp:g} pp: more than the order of the samples differs."),
                holds=within),
        Finding("shards_speed",
                f"Reading shards ran at {speed:.2f}x the in-memory loader's samples/s "
                + ("(decoding each record costs more than indexing a tensor that is already "
                   "in memory; on a large dataset the choice is shards or not fitting at all)."
                   if speed < 1 else "(the records' decoding is hidden behind the step)."),
                holds=None),
    ])


def steps_by_rank(output, mode):
    """{rank: steps} from the shard demo's lines ``MODE: N steps on rank R, done``."""
    import re

    return {int(m[2]): int(m[1]) for line in output
            for m in re.finditer(rf"{mode}: (\d+) steps on rank (\d+), done", line)}


def uneven_shards(equal, uneven, join, timeout_s):
    """The shard demo: ``equal`` and ``join``: {rank: steps}; ``uneven``: the LaunchResult
    of the job whose ranks take their own step counts (its collectives time out after
    ``timeout_s``)."""
    if len(equal) < 2:
        return Findings([needs_ranks("uneven_shards", "A job whose ranks hold unequal shards")])
    same = len(set(equal.values())) == 1
    found = Findings([Finding(
        "equal_steps", f"Equal steps: every rank took {min(equal.values())} steps, and the "
                       f"job finished." if same else
        f"Equal steps: the ranks took {sorted(equal.values())} steps: NOT equal.",
        holds=same)])
    hung = not uneven.ok and "Timed out" in (uneven.error or "") + "".join(uneven.output)
    found.append(Finding(
        "uneven_hangs",
        f"Uneven steps: the job hung, the rank with more batches in a step's all-reduce and "
        f"the one that had run out in its next collective, until the {timeout_s:g} s timeout "
        f"failed it after {uneven.seconds:.0f} s in all (gloo's default timeout: "
        f"{GLOO_DEFAULT_TIMEOUT_MIN:g} minutes of hanging)."
        if hung else "Uneven steps: the job did NOT hang"
        + (" (it finished)" if uneven.ok else f" but failed otherwise: {uneven.error}") + ".",
        holds=hung))
    joined = len(join) == len(equal) and len(set(join.values())) > 1
    found.append(Finding(
        "join_finishes",
        f"Join: the ranks took {sorted(join.values(), reverse=True)} steps and the job "
        f"finished: the ranks that ran out shadowed the others' all-reduces."
        if joined else f"Join: steps by rank {join}: not the uneven finish it should show.",
        holds=joined))
    return found


# The demo runs on gloo, whose default collective timeout is 30 minutes (NCCL's: 10):
# torch.distributed.constants.default_pg_timeout, read from the installed torch.
GLOO_DEFAULT_TIMEOUT_MIN = default_pg_timeout.total_seconds() / 60


def layout_table(result):
    """Which node rank and global ranks each node's agent got, in every rendezvous."""
    return runlog.format_table(
        [{"node": r["node"], "attempt": r["restart_count"], "node_rank": r["group_rank"],
          "nodes": r["group_world_size"], "local": str(r["local_ranks"]),
          "global": str(r["global_ranks"])} for r in result.rounds],
        {"node": ("agent", ""), "attempt": ("attempt", ""), "node_rank": ("node rank", ""),
         "nodes": ("nodes", ""), "local": ("local ranks", ""),
         "global": ("global ranks", "")})


def two_nodes(result, nodes_run, one_node_run, tolerance=SAME_RUN):
    """The same job as 2 nodes (``result``: the NodesResult; ``nodes_run``: its Run) and as
    one torchrun on one node (``one_node_run``), with the same seed and world size."""
    if not result.ok:
        return Findings([Finding("two_nodes", f"The two-node job failed: {result.error}.",
                                 holds=False)])
    ranks = sorted(rank for r in result.rounds if r["restart_count"] == 0
                   for rank in r["global_ranks"])
    world = nodes_run.start["world_size"]
    node_ranks = sorted(r["group_rank"] for r in result.rounds if r["restart_count"] == 0)
    recorded = nodes_run.start.get("nodes")
    laid_out = (ranks == list(range(world)) and node_ranks == list(range(len(node_ranks)))
                and recorded == len(node_ranks))
    found = Findings([Finding(
        "layout", f"Rendezvous: {len(node_ranks)} agents got node ranks {node_ranks} and, "
                  f"between them, global ranks {ranks} of world size {world} (the run record: "
                  f"{recorded} nodes)"
                  + (": every rank once." if laid_out else ": NOT every rank exactly once."),
        holds=laid_out)])
    mine, theirs = nodes_run.column("val_loss"), one_node_run.column("val_loss")
    same_world = world == one_node_run.start["world_size"]
    if not same_world or len(mine) != len(theirs):
        found.append(Finding("same_as_one_node", "The one-node run is another job (world "
                             "size or epochs differ): nothing to compare.", holds=None))
        return found
    diff = max(abs(a - b) for a, b in zip(mine, theirs, strict=True))
    same = diff <= tolerance
    found.append(Finding(
        "same_as_one_node",
        f"Two nodes against one node, same seed and world size {world}: validation losses "
        f"differ by at most {diff:.1e} over {len(mine)} epochs, "
        + (f"within {tolerance:.0e}: the same job; where its processes run does not change "
           f"what they compute." if same else f"NOT within {tolerance:.0e}."),
        holds=same))
    return found


def elastic(result, run, epochs):
    """``--nnodes=1:2``: a node removed mid-run (``result``: the NodesResult; ``run``: the
    job's Run, ``epochs`` asked for)."""
    if not result.killed:
        return Findings([Finding("elastic", "No node was removed: nothing to show.",
                                 holds=None)])
    (node, killed_s), = result.killed.items()
    later = [r for r in result.rounds if r["restart_count"] > 0]
    found = Findings()
    if not result.ok or not later:
        found.append(Finding("elastic_reforms", f"After node {node} was removed the job did "
                             f"NOT re-form and finish: {result.error}.", holds=False))
        return found
    reform_s = later[0]["seen_s"] - killed_s
    resumed = run.resumes[-1] if run.resumes else None
    no_loss = run.column("epoch") == list(range(1, epochs + 1))
    found.append(Finding(
        "elastic_reforms",
        f"Node {node} was removed at {killed_s:.0f} s; {reform_s:.0f} s later the "
        f"{len(later)} node(s) left formed a group of world size {resumed['world_size']} and "
        f"resumed from the checkpoint at epoch {resumed['start_epoch']}; the job finished "
        f"all {epochs} epochs" + (" with none lost or repeated." if no_loss else
                                  ", but its epochs were not 1 to the end once each.")
        if resumed else "The group re-formed but did not resume from a checkpoint.",
        holds=bool(resumed) and no_loss))
    if resumed:
        before, after = run.start["global_batch_size"], resumed["global_batch_size"]
        found.append(Finding(
            "elastic_batch",
            f"The global batch went from {before} to {after} (the batch per process stayed "
            f"{resumed['batch_size']}): the rest of the run trained with another global batch "
            f"and learning-rate ratio than its start, which notebook 01's rules say to "
            f"rescale for (train_ddp's --lr-scaling does, from the new world size).",
            holds=None))
    return found


def skipped_part(key, why):
    """The findings of a part of the notebook that did not run here, saying why."""
    return Findings([skipped(key, why)])
