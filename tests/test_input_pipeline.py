"""The input-bound measurement: the course's step fed by a num_workers=0 DataLoader and
by the device-resident TensorLoader, the same steps each round (no timing asserted)."""
import torch

from workshop_lib import input_pipeline, stopwatch


def small_job(samples=40):
    torch.manual_seed(0)
    dataset = torch.utils.data.TensorDataset(torch.randn(samples, 4),
                                             torch.randint(0, 3, (samples,)))
    model = torch.nn.Linear(4, 3)
    return model, torch.optim.SGD(model.parameters(), lr=0.1), dataset


def test_both_feeds_train_the_same_steps_in_alternating_rounds():
    model, optimizer, dataset = small_job()
    before = model.weight.detach().clone()
    measured = input_pipeline.feeds(model, optimizer, dataset, 4, torch.device("cpu"),
                                    steps=3, rounds=2)
    assert not torch.equal(model.weight, before), "the steps trained the model"
    assert measured["steps"] == 3 and measured["device"] == "cpu"
    assert measured["num_workers"] == 0 and measured["pin_memory"] is False
    assert measured["remedy_workers"] == input_pipeline.REMEDY_WORKERS
    for name in ("resident", "data_loader", "workers"):
        timing = measured["timings"][name]
        assert timing["samples"] == 3 * 4 and len(timing["seconds"]) == 2
        assert measured["samples_per_s"][name] == \
            timing["samples"] / stopwatch.summary(timing["seconds"])["median"]


def test_the_steps_run_on_into_the_next_epoch():
    model, optimizer, dataset = small_job(samples=10)  # two full batches of 4 an epoch
    batches = []
    model.register_forward_hook(lambda module, inputs, output: batches.append(len(inputs[0])))
    measured = input_pipeline.feeds(model, optimizer, dataset, 4, torch.device("cpu"),
                                    steps=5, rounds=1)
    assert measured["steps"] == 5 and measured["timings"]["data_loader"]["samples"] == 20
    # Each of the three feeds: a warm-up call, the sizing call, one round; 5 full batches a call.
    assert batches == [4] * (3 * 3 * 5)


def test_the_course_step_on_the_course_data():
    measured = input_pipeline.measure("cnn", "digits", 32, "cpu", steps=1, rounds=1)
    assert (measured["model"], measured["dataset"], measured["steps"]) == ("cnn", "digits", 1)


def test_the_data_loader_pins_its_batches_only_for_a_gpu():
    dataset = torch.utils.data.TensorDataset(torch.zeros(8, 2), torch.zeros(8))
    assert input_pipeline.host_data_loader(dataset, 4, "cuda").pin_memory
    assert not input_pipeline.host_data_loader(dataset, 4, "cpu").pin_memory
    assert input_pipeline.host_data_loader(dataset, 4, "cpu").num_workers == 0
