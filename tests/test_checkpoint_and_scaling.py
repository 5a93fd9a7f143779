"""Atomic checkpoints, learning-rate scaling rules and warmup."""
import math

import pytest
import torch

from workshop_lib import checkpoint, scaling


def test_a_crash_while_writing_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    checkpoint.save_atomic({"epoch": 1, "w": torch.ones(3)}, path)

    def torch_save_that_dies_halfway(obj, f):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt("machine went down")

    monkeypatch.setattr(torch, "save", torch_save_that_dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_atomic({"epoch": 2, "w": torch.zeros(3)}, path)
    monkeypatch.undo()

    assert checkpoint.load(path)["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"], "no temp files left"


@pytest.mark.parametrize("rule,expected", [("none", 0.1), ("linear", 0.8),
                                           ("sqrt", 0.1 * math.sqrt(8))])
def test_scaling_rules(rule, expected):
    assert scaling.scaled_lr(0.1, rule, 512, 64) == pytest.approx(expected)


def test_warmup_rises_linearly_then_holds_or_decays():
    constant = [scaling.lr_factor(step, 4, 10, "constant", 0.2) for step in range(10)]
    assert constant == pytest.approx([0.2, 0.4, 0.6, 0.8] + [1.0] * 6)
    cosine = [scaling.lr_factor(step, 4, 10, "cosine", 0.2) for step in range(11)]
    assert cosine[:5] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert cosine[5:] == sorted(cosine[5:], reverse=True) and cosine[-1] == 0.0
    assert cosine[7] == pytest.approx(0.5)  # half-way through the decay
    assert scaling.lr_factor(0, 0, 10, "cosine") == 1.0


def tiny_state(job):
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return checkpoint.training_state(model, optimizer, scheduler, epoch=3, job=job)


def test_a_checkpoint_names_its_job_and_only_that_job_resumes_from_it(tmp_path, capsys):
    path = tmp_path / "checkpoint.pt"
    assert not checkpoint.from_job(path, "job-b"), "no checkpoint: nothing to resume"
    checkpoint.save_atomic(tiny_state("job-a"), path)
    assert checkpoint.from_job(path, "job-a")
    assert capsys.readouterr().out == ""
    assert not checkpoint.from_job(path, "job-b")
    said = capsys.readouterr().out.strip().splitlines()
    assert len(said) == 1 and "written by another run (job job-a), not this one (job-b)" in \
        said[0]
    assert not checkpoint.from_job(path, "job-b", say=False)
    assert capsys.readouterr().out == ""


def test_the_job_id_is_torchruns_run_id_or_the_agent(monkeypatch):
    from workshop_lib import distributed

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "a1b2")
    assert distributed.job_id() == "a1b2"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun without --rdzv-id
    agent = distributed.job_id()
    assert agent == distributed.job_id() and agent.count(":") == 2


def test_a_cpu_checkpoint_holds_no_cuda_random_state():
    assert tiny_state("j")["cuda_rng"] is None


def test_warmup_from_the_base_rate_as_goyal_et_al():
    # Scaled 8x: the ramp starts at the unscaled rate (1/8 of the target) and reaches it.
    start = scaling.warmup_start("base", 0.1, 0.8)
    ramp = [scaling.lr_factor(step, 4, 10, "constant", start) for step in range(5)]
    # The first step at the base rate, the scaled one reached after the 4 warmup steps
    assert ramp == pytest.approx([0.125, 0.125 + 0.875 / 4, 0.125 + 0.875 / 2,
                                  0.125 + 3 * 0.875 / 4, 1.0])
    assert 0 < scaling.warmup_start("zero", 0.1, 0.8) < 0.01  # LinearLR needs it above 0
    assert scaling.warmup_start("base", 0.1, 0.1) == 1.0, "nothing scaled: no ramp"


@pytest.mark.parametrize("warmup,total,start", [(4, 10, scaling.ZERO_START), (5, 40, 1 / 16),
                                                (1, 6, 0.25)])
def test_pytorchs_sequential_lr_gives_the_courses_rate_at_every_step(warmup, total, start):
    """What the notebook shows learners (LinearLR then CosineAnnealingLR in SequentialLR)
    is the schedule the course trains with (scaling.lr_factor), step for step."""
    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([weight], lr=0.8)
    scheduler = scaling.warmup_cosine_scheduler(optimizer, warmup, total, start)
    for step in range(total):
        expected = 0.8 * scaling.lr_factor(step, warmup, total, "cosine", start)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(expected, abs=1e-12), step
        optimizer.step()
        scheduler.step()


def test_largest_difference_reads_every_tensor_of_two_checkpoints(tmp_path):
    """Notebook 04 compares a resumed job with the uninterrupted one through this: a change
    in any model or optimizer tensor shows, and equal states give exactly 0.0."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    checkpoint.save_atomic(checkpoint.training_state(model, optimizer, scheduler, 3),
                           tmp_path / "a.pt")
    checkpoint.save_atomic(checkpoint.training_state(model, optimizer, scheduler, 3),
                           tmp_path / "b.pt")
    assert checkpoint.largest_difference(tmp_path / "a.pt", tmp_path / "b.pt") == {
        "model": 0.0, "optimizer": 0.0, "epochs": [3, 3]}
    momentum = next(iter(optimizer.state.values()))["momentum_buffer"]
    momentum[0, 0] += 0.25
    checkpoint.save_atomic(checkpoint.training_state(model, optimizer, scheduler, 3),
                           tmp_path / "b.pt")
    gap = checkpoint.largest_difference(tmp_path / "a.pt", tmp_path / "b.pt")
    assert gap["model"] == 0.0 and gap["optimizer"] == 0.25


def test_lamb_moves_each_tensor_by_its_trust_ratio_share_of_its_norm():
    """LAMB's step, by hand: Adam's bias-corrected direction (after one step m/sqrt(v) is
    the gradient's sign), weight decay on matrices only, scaled so that every tensor moves
    by lr x trust_coefficient x its own norm; a tensor at zero takes the plain ratio 1."""
    from workshop_lib import optim

    weight = torch.nn.Parameter(torch.tensor([[3.0, -4.0]]))  # norm 5
    bias = torch.nn.Parameter(torch.zeros(2))
    lamb = optim.build("lamb", [weight, bias], lr=0.5, momentum=0.9, weight_decay=0.1)
    weight.grad, bias.grad = torch.tensor([[2.0, 1.0]]), torch.tensor([0.5, -0.25])
    lamb.step()
    weight, bias = weight.detach(), bias.detach()
    direction = torch.tensor([[1.0, 1.0]]) / (1 + 1e-6) + 0.1 * torch.tensor([[3.0, -4.0]])
    step = direction * (0.02 * 5 / torch.linalg.vector_norm(direction))
    assert torch.allclose(weight, torch.tensor([[3.0, -4.0]]) - 0.5 * step, atol=1e-6)
    assert torch.linalg.vector_norm(weight - torch.tensor([[3.0, -4.0]])) == \
        pytest.approx(0.5 * 0.02 * 5, rel=1e-5)
    assert torch.allclose(bias, -0.5 * torch.tensor([1.0, -1.0]) / (1 + 1e-6), atol=1e-6)


def test_novograd_normalises_each_tensors_gradient_by_its_running_norm():
    """NovoGrad's two steps, by hand: the first divides each tensor's gradient by its own
    norm (v = ||g||^2), adds weight decay on matrices only, and moves by lr times that; the
    second keeps beta2 of v and beta1 (--momentum) of the step before."""
    from workshop_lib import optim

    weight = torch.nn.Parameter(torch.tensor([[3.0, -4.0]]))
    bias = torch.nn.Parameter(torch.zeros(2))
    novograd = optim.build("novograd", [weight, bias], lr=0.5, momentum=0.9, weight_decay=0.1)
    w0 = weight.detach().clone()
    grads = [(torch.tensor([[6.0, 8.0]]), torch.tensor([0.3, -0.4])),  # norms 10 and 0.5
             (torch.tensor([[0.0, 2.0]]), torch.tensor([0.0, 0.0]))]
    weight.grad, bias.grad = grads[0]
    novograd.step()
    m_weight = grads[0][0] / (10 + 1e-8) + 0.1 * w0
    m_bias = grads[0][1] / (0.5 + 1e-8)
    assert torch.allclose(weight.detach(), w0 - 0.5 * m_weight, atol=1e-6)
    assert torch.allclose(bias.detach(), -0.5 * m_bias, atol=1e-6)
    w1, b1 = weight.detach().clone(), bias.detach().clone()
    weight.grad, bias.grad = grads[1]
    novograd.step()
    v_weight = 0.98 * 100 + 0.02 * 4
    m_weight = 0.9 * m_weight + grads[1][0] / (v_weight ** 0.5 + 1e-8) + 0.1 * w1
    assert torch.allclose(weight.detach(), w1 - 0.5 * m_weight, atol=1e-6)
    assert torch.allclose(bias.detach(), b1 - 0.5 * 0.9 * m_bias, atol=1e-6)  # no gradient
