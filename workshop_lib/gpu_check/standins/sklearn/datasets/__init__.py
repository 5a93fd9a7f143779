"""``load_digits`` where scikit-learn is missing: synthetic digits with the real data's
shapes and value range (1,797 images of 8x8 pixels, integers 0-16, labels 0-9).

Each image is a printed glyph of its digit, shifted by up to one pixel, dimmed and noised,
from a fixed seed: the same images on every rank and in every run, as the real ones are.
A small CNN tells them apart (nearest class mean already gets most of them), so runs on
them exercise training end to end; their accuracies say nothing about the course's.
"""
from types import SimpleNamespace

import torch

GLYPHS = {
    0: "..####.. .##..##. .##..##. .##..##. .##..##. .##..##. ..####.. ........",
    1: "...##... ..###... ...##... ...##... ...##... ...##... ..####.. ........",
    2: "..####.. .##..##. .....##. ....##.. ...##... ..##.... .######. ........",
    3: "..####.. .##..##. .....##. ...###.. .....##. .##..##. ..####.. ........",
    4: "....##.. ...###.. ..####.. .##.##.. .######. ....##.. ....##.. ........",
    5: ".######. .##..... .#####.. .....##. .....##. .##..##. ..####.. ........",
    6: "..####.. .##..... .#####.. .##..##. .##..##. .##..##. ..####.. ........",
    7: ".######. .....##. ....##.. ...##... ...##... ...##... ...##... ........",
    8: "..####.. .##..##. .##..##. ..####.. .##..##. .##..##. ..####.. ........",
    9: "..####.. .##..##. .##..##. ..#####. .....##. ....##.. ..###... ........",
}
SAMPLES, SEED = 1797, 0


def _glyph(digit):
    return torch.tensor([[16.0 if c == "#" else 0.0 for c in row] for row in GLYPHS[digit].split()])


def _shift(image, dy, dx):
    """``image`` moved by (dy, dx) pixels, zeros where it came from."""
    out = torch.zeros_like(image)
    src = image[max(0, -dy):8 - max(0, dy), max(0, -dx):8 - max(0, dx)]
    out[max(0, dy):max(0, dy) + src.shape[0], max(0, dx):max(0, dx) + src.shape[1]] = src
    return out


def _as_arrays(images, target):
    """numpy arrays, as scikit-learn returns, where numpy is installed; else nested lists
    (``torch.tensor`` takes both without a copy-construct warning)."""
    try:
        import numpy  # noqa: F401

        return images.double().numpy(), target.numpy()
    except ImportError:
        return images.double().tolist(), target.tolist()


def load_digits(*, n_class=10, return_X_y=False, as_frame=False):
    generator = torch.Generator().manual_seed(SEED)
    target = torch.arange(SAMPLES) % n_class
    target = target[torch.randperm(SAMPLES, generator=generator)]
    glyphs = torch.stack([_glyph(d) for d in range(n_class)])
    shifts = torch.randint(-1, 2, (SAMPLES, 2), generator=generator)
    dim = 0.6 + 0.4 * torch.rand(SAMPLES, 1, 1, generator=generator)
    noise = 2.5 * torch.randn(SAMPLES, 8, 8, generator=generator)
    images = torch.stack([_shift(glyphs[t], int(dy), int(dx))
                          for t, (dy, dx) in zip(target.tolist(), shifts.tolist(), strict=True)])
    images = (images * dim + noise).clamp(0, 16).round()
    images, labels = _as_arrays(images, target)
    flat = images.reshape(SAMPLES, 64) if hasattr(images, "reshape") else [
        [v for row in image for v in row] for image in images]
    if return_X_y:
        return flat, labels
    return SimpleNamespace(images=images, target=labels, data=flat,
                           target_names=list(range(n_class)),
                           DESCR="synthetic stand-in digits (workshop_lib.gpu_check)")
