"""A user's Hugging Face ``Trainer`` job, run by the test under ``torchrun --nproc_per_node 2``:
``python -m torch.distributed.run --nproc_per_node 2 tests/integrations/transformers_job.py OUT``.
A tiny model built here (no download): a ``PreTrainedModel`` whose forward returns the loss."""
from __future__ import annotations

import sys

import torch
from torch.utils.data import Dataset
from transformers import PretrainedConfig, PreTrainedModel, Trainer, TrainingArguments

from dpcore.integrations import TransformersCallback


class TinyConfig(PretrainedConfig):
    model_type = "dpcore-tiny"

    def __init__(self, d_in: int = 32, hidden: int = 128, classes: int = 4, **kwargs) -> None:
        super().__init__(**kwargs)
        self.d_in, self.hidden, self.classes = d_in, hidden, classes


class TinyModel(PreTrainedModel):
    config_class = TinyConfig

    def __init__(self, config: TinyConfig) -> None:
        super().__init__(config)
        self.net = torch.nn.Sequential(torch.nn.Linear(config.d_in, config.hidden), torch.nn.ReLU(),
                                       torch.nn.Linear(config.hidden, config.classes))
        self.post_init()

    def forward(self, x, labels=None):
        logits = self.net(x)
        loss = torch.nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


class Data(Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(512, 32, generator=g), torch.randint(0, 4, (512,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


def main() -> None:
    out = sys.argv[1]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    args = TrainingArguments(output_dir=f"{out}/.hf", max_steps=7, per_device_train_batch_size=16,
                             use_cpu=True, ddp_backend="gloo", ddp_bucket_cap_mb=1, report_to=[],
                             save_strategy="no", logging_strategy="no", dataloader_num_workers=0,
                             disable_tqdm=True)
    cb = TransformersCallback(out, name="transformers", warmup=2, profile_steps=2)
    Trainer(model=TinyModel(TinyConfig()), args=args, train_dataset=Data(), callbacks=[cb]).train()
    assert cb.run_dir is not None
    # What PyTorch asks of every script: destroy the group before the interpreter exits. Neither
    # Lightning (at exit for NCCL only) nor the HF Trainer does it for gloo; a gloo group left to
    # interpreter teardown can abort a rank ("terminate called without an active exception",
    # pytorch/pytorch#190489): it once took rank 1 of lightning_job.py in CI.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
