"""A user's Lightning job, run by the test under ``torchrun --nproc_per_node 2``:
``python -m torch.distributed.run --nproc_per_node 2 tests/integrations/lightning_job.py OUT [HOOK]``.
HOOK ``fp16``: the module registers DDP's fp16 compression hook in ``on_fit_start`` (Lightning's
own ``DDPStrategy(ddp_comm_hook=...)`` registers hooks on CUDA only); the recording keeps it."""
from __future__ import annotations

import sys

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.utils.data import DataLoader, TensorDataset

from dpcore.integrations import LightningCallback


class Tiny(L.LightningModule):
    def __init__(self, hook: str = "none") -> None:
        super().__init__()
        self.hook = hook
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def on_fit_start(self) -> None:
        if self.hook == "fp16":  # the DDP model exists now: the strategy wrapped it
            self.trainer.strategy.model.register_comm_hook(None, default_hooks.fp16_compress_hook)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> None:
    out, hook = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "none")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = TensorDataset(torch.randn(512, 32), torch.randint(0, 4, (512,)))
    strategy = DDPStrategy(process_group_backend="gloo", bucket_cap_mb=1)
    cb = LightningCallback(out, name=f"lightning-{hook}", warmup=2, profile_steps=2)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_steps=7, callbacks=[cb],
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Tiny(hook), DataLoader(data, batch_size=16))
    assert cb.run_dir is not None
    # What PyTorch asks of every script: destroy the group before the interpreter exits. Neither
    # Lightning (at exit for NCCL only) nor the HF Trainer does it for gloo; a gloo group left to
    # interpreter teardown can abort a rank ("terminate called without an active exception",
    # pytorch/pytorch#190489): it once took rank 1 of lightning_job.py in CI.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
