"""The models trained in the course. Only ``nn.Module`` s here: no devices, no data.

- ``cnn``: a small convolutional network that trains in seconds on a CPU. Global average
  pooling lets the same network take 8x8 digits and 28x28 Fashion-MNIST.
- ``wrn-16-4`` / ``wrn-16-10``: Wide ResNets (Zagoruyko & Komodakis, 2016). ``wrn-16-10``
  (~17M parameters) is the size the original workshop trained on GPUs.
"""
import torch.nn as nn
from torch.utils.checkpoint import checkpoint


def run_blocks(blocks, x, checkpointed):
    """Run ``blocks`` in order. With ``checkpointed``, the activations inside each block
    with parameters are not kept for backward but recomputed during it (gradient, or
    activation, checkpointing: less memory, one extra forward pass of each block).
    BatchNorm's running statistics are then updated twice per step (once more in the
    recomputation); training uses batch statistics, so the loss is unchanged."""
    for block in blocks:
        has_weights = any(p.requires_grad for p in block.parameters())
        x = checkpoint(block, x, use_reentrant=False) if checkpointed and has_weights \
            else block(x)
    return x


def conv_bn_relu(in_channels, out_channels, batch_norm=True):
    if not batch_norm:
        return nn.Sequential(nn.Conv2d(in_channels, out_channels, 3, padding=1), nn.ReLU())
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


class SmallCNN(nn.Module):
    """Three 3x3 convolutions (width, 2x, 4x channels), global average pooling, a linear head.

    ``batch_norm=False`` drops BatchNorm: then DDP on N ranks with batch b computes exactly
    what one process computes with batch N*b (BatchNorm's batch statistics are per rank).
    """

    def __init__(self, in_channels=1, num_classes=10, width=32, batch_norm=True):
        super().__init__()
        self.features = nn.Sequential(
            conv_bn_relu(in_channels, width, batch_norm),
            conv_bn_relu(width, 2 * width, batch_norm),
            nn.MaxPool2d(2),
            conv_bn_relu(2 * width, 4 * width, batch_norm),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.classifier = nn.Linear(4 * width, num_classes)
        self.grad_checkpointing = False

    def forward(self, x):
        checkpointed = self.grad_checkpointing and self.training
        return self.classifier(run_blocks(self.features, x, checkpointed))


class WideBasicBlock(nn.Module):
    """Pre-activation residual block: BN-ReLU-conv, twice, plus a (projected) shortcut."""

    def __init__(self, in_channels, out_channels, stride):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = (
            nn.Conv2d(in_channels, out_channels, 1, stride, bias=False)
            if stride != 1 or in_channels != out_channels
            else None
        )

    def forward(self, x):
        out = self.relu(self.bn1(x))
        shortcut = x if self.shortcut is None else self.shortcut(out)
        out = self.conv1(out)
        out = self.conv2(self.relu(self.bn2(out)))
        return out + shortcut


class WideResNet(nn.Module):
    def __init__(self, depth=16, widen_factor=4, in_channels=1, num_classes=10):
        super().__init__()
        if (depth - 4) % 6:
            raise ValueError(f"WideResNet depth must be 6n+4, got {depth}")
        blocks_per_stage = (depth - 4) // 6
        widths = [16, 16 * widen_factor, 32 * widen_factor, 64 * widen_factor]
        layers = [nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False)]
        for stage in range(3):
            for block in range(blocks_per_stage):
                layers.append(WideBasicBlock(
                    widths[stage] if block == 0 else widths[stage + 1],
                    widths[stage + 1],
                    stride=1 if stage == 0 or block > 0 else 2,
                ))
        layers += [nn.BatchNorm2d(widths[3]), nn.ReLU(inplace=True),
                   nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(widths[3], num_classes)
        self.grad_checkpointing = False

    def forward(self, x):
        checkpointed = self.grad_checkpointing and self.training
        return self.classifier(run_blocks(self.features, x, checkpointed))


MODELS = {
    "cnn": lambda info: SmallCNN(info.in_channels, info.num_classes),
    "wrn-16-4": lambda info: WideResNet(16, 4, info.in_channels, info.num_classes),
    "wrn-16-10": lambda info: WideResNet(16, 10, info.in_channels, info.num_classes),
}


def build(name, dataset_info, grad_checkpointing=False):
    """Build model ``name`` shaped for a dataset's channels and classes; with
    ``grad_checkpointing`` its blocks recompute their activations in backward."""
    model = MODELS[name](dataset_info)
    model.grad_checkpointing = grad_checkpointing
    return model


def count_parameters(model):
    return sum(p.numel() for p in model.parameters())
