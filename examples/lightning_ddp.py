"""PyTorch Lightning DDP on smdccl: one word in the strategy.

    python examples/lightning_ddp.py            # 2 CPU processes, smdccl then gloo

Trains the same small regression model with the same seed and data under
``DDPStrategy(process_group_backend=...)`` for "smdccl" and for "gloo", and
prints each run's final parameters' SHA-256: equal hashes mean smdccl's
gradient averages were bit for bit gloo's.
"""

from __future__ import annotations

import hashlib
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning as L
from lightning.pytorch.strategies import DDPStrategy


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))

    def training_step(self, batch, _):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def data() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 16, generator=g)
    y = x @ torch.randn(16, 1, generator=g) + 0.1 * torch.randn(512, 1, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=32)


def train(backend: str) -> str:
    L.seed_everything(0, verbose=False)
    model = Regression()
    trainer = L.Trainer(accelerator="cpu", devices=2, max_steps=30, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False,
                        strategy=DDPStrategy(process_group_backend=backend))
    trainer.fit(model, data())
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


if __name__ == "__main__":
    import smdccl  # noqa: F401 - registers "smdccl" (torch >= 2.11 also loads it at import)

    backend = sys.argv[1] if len(sys.argv) > 1 else "smdccl"
    digest = train(backend)
    import torch.distributed as dist

    if dist.get_rank() == 0:
        print(f"{dist.get_backend()}: {dist.get_world_size()} processes, final parameters "
              f"sha256 {digest}", flush=True)
